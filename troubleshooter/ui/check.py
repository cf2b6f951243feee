"""Check tab: run the diagnostics on a model in a worker; inspect a checkpoint; probe the device."""
from __future__ import annotations

import copy
import functools
import json
import math

from ..errors import UserError
from ..findings import Finding, findings_to_markdown
from . import common, host, jobs, specinput
from .server import SETTINGS

CHECK_NAMES = ("capability", "alignment", "skiprate", "nan", "headroom")
CHECK_LABELS = {"capability": "GPU capability", "alignment": "tensor-core alignment",
                "skiprate": "fp16 skip rate", "nan": "NaN/Inf localisation", "headroom": "overflow/underflow headroom"}
MAX_UI_STEPS = 2000
DEFAULT_UI_BUDGET_S = 60.0  # as the CLI's --budget
MIN_UI_BUDGET_S = 5.0
ALIGN_HEADERS = ["module", "layer", "dimension", "size", "pad to", "aligned", "share of FLOPs", "note"]
HEADROOM_HEADERS = ["module", "layer", "max |activation|", "headroom (bits)", "fp16 overflow"]
CHECKPOINT_KINDS = (".pt", ".pth", ".bin", ".ckpt", ".tar", ".safetensors")


def _steps(steps) -> int:
    try:
        value = float(steps)
    except (TypeError, ValueError):
        raise UserError(f"steps must be a whole number, not {steps!r}") from None
    if value != int(value) or not 1 <= value <= MAX_UI_STEPS:
        raise UserError(f"steps must be a whole number from 1 to {MAX_UI_STEPS}, not {steps}")
    return int(value)


def _only(checks) -> list[str]:
    """The checks box/parameter -> check names, validated by the engine's own parser."""
    from ..engine.check import parse_only

    if not isinstance(checks, str):
        checks = ",".join(str(c) for c in (checks or []))
    return parse_only(checks.replace(" ", ","))


def _budget(budget_s) -> float:
    """The checks' shared time budget, kept inside the operator's job time limit (the worker is
    killed there and a killed job reports nothing, while a spent budget reports what it measured)."""
    try:
        value = float(budget_s)
    except (TypeError, ValueError):
        raise UserError(f"the time budget must be a number of seconds, not {budget_s!r}") from None
    if not math.isfinite(value) or value < MIN_UI_BUDGET_S:
        raise UserError(f"the time budget must be at least {MIN_UI_BUDGET_S:g} seconds, not {budget_s}")
    return min(value, max(MIN_UI_BUDGET_S, SETTINGS.job_timeout_s * 0.8))


def run(source, device: str = "auto", checks=CHECK_NAMES, steps=20, progress=None,
        budget_s: float = DEFAULT_UI_BUDGET_S) -> dict:
    """The `check --format json` object for `source`, measured in a worker process."""
    from ..engine.check import check_source

    only, n, budget = _only(checks), _steps(steps), _budget(budget_s)
    device = host.validate_device(device)
    specinput.validate(source)
    timeout = SETTINGS.job_timeout_s
    kwargs = dict(device=device or "auto", only=only, steps=n, budget_s=budget)
    if specinput.is_python(source):
        if progress:
            progress(0.0, "running the uploaded model file in its own process")
        return jobs.run_job(check_source, source, allow_exec=SETTINGS.allow_exec, in_worker=False,
                            timeout_s=timeout, device_key=host.device_key(device), **kwargs)
    return jobs.run_job(check_source, source, timeout_s=timeout, progress=progress,
                        device_key=host.device_key(device), **kwargs)


# ---------------------------------------------------------------- rendering


def _na(result: dict, name: str) -> str | None:
    """Why a section is empty: not selected, or its error message."""
    if name in (result.get("skipped") or {}):
        return f"*not run: {result['skipped'][name]}*"
    err = (result.get("errors") or {}).get(name)
    if err:
        return f"*{err.get('message', err) if isinstance(err, dict) else err}*"
    return None


def capability_card(result: dict) -> str:
    cap = result.get("capability")
    if not cap:
        return "#### Capability\n" + (_na(result, "capability") or "*not measured*")
    lines = ["#### Capability"]
    summary = cap.get("summary_line") or cap.get("summary")
    if summary:
        lines += [f"**{summary}**", ""]
    if cap.get("recommended_precision"):
        lines.append(f"Recommended precision: **{cap['recommended_precision']}**"
                     + (f" — {cap['reason']}" if cap.get("reason") else ""))
    facts = {}
    for k, v in cap.items():
        if k in ("summary_line", "summary", "recommended_precision", "reason", "findings"):
            continue
        items = v.items() if isinstance(v, dict) else [("", v)]
        for sub, val in items:
            if isinstance(val, (str, int, float, bool)) and val is not None:
                facts[f"{k} {sub}".strip()] = val
    if facts:  # folded: the summary line says what matters, the rest is for the curious
        lines += ["", "<details><summary>All capability facts</summary>", "", "| | |", "| --- | --- |"]
        lines += [f"| {common.md_cell(k)} | {common.md_cell(common.fmt_num(v))} |" for k, v in facts.items()]
        lines += ["", "</details>"]
    return "\n".join(lines) + "\n"


def alignment_rows(result: dict) -> list[list]:
    rows = []
    for r in result.get("alignment") or []:
        share = r.get("flops_share")
        rows.append([r.get("module"), r.get("class"), r.get("dimension"), r.get("value"), r.get("padded"),
                     "yes" if r.get("aligned") else f"NO (multiple of {r.get('multiple')})",
                     f"{share:.1%}" if isinstance(share, (int, float)) else "—", r.get("note") or ""])
    return rows


def skiprate_figure(result: dict):
    section = result.get("skiprate")
    if not section:
        return None
    try:
        from ..engine.skiprate_plot import plot_skiprate
    except ImportError:
        return None
    return plot_skiprate(section)


def skiprate_markdown(result: dict) -> str:
    section = result.get("skiprate")
    if not section:
        return "#### fp16 skip rate\n" + (_na(result, "skiprate") or "*not measured*")
    s, rec = section.get("summary", {}), section.get("recommendation", {})
    rate = s.get("skip_rate")
    return ("#### fp16 skip rate\n"
            f"{s.get('skipped', '?')} of {s.get('steps', '?')} steps skipped"
            + (f" ({rate:.0%})" if isinstance(rate, (int, float)) else "")
            + f"; final loss scale {common.fmt_num(s.get('final_scale'))}. "
            + (f"**{rec.get('action')}**: {rec.get('reason', '')}" if rec else "") + "\n")


def nan_markdown(result: dict) -> str:
    section = result.get("nan")
    if not section:
        return "#### NaN/Inf localisation\n" + (_na(result, "nan") or "*not measured*")
    lines = ["#### NaN/Inf localisation", "",
             "| precision | loss | first non-finite (forward) | first non-finite (backward) |",
             "| --- | --- | --- | --- |"]
    for p, r in (section.get("precisions") or {}).items():
        loss = common.fmt_num(r.get("loss"), 4) + ("" if r.get("loss_finite", True) else " (NON-FINITE)")
        fwd, bwd = r.get("first_forward"), r.get("first_backward")
        lines.append(f"| {p} | {loss} | {common.md_cell(_where(fwd))} | {common.md_cell(_where(bwd))} |")
    return "\n".join(lines) + "\n"


def _where(entry) -> str:
    if not entry:
        return "none (all finite)"
    if isinstance(entry, dict):
        mod = entry.get("module")
        cls = entry.get("class")
        what = entry.get("kind") or entry.get("what") or ""
        if not what and entry.get("grad_of") == "loss":
            what = "gradient of the loss"
        step = f"at step {entry['step']}" if entry.get("step") is not None else None
        return " ".join(str(x) for x in (f"'{mod}'" if mod is not None else None, f"({cls})" if cls else None,
                                         what, step) if x)
    return str(entry)


def headroom_rows(result: dict) -> list[list]:
    section = result.get("headroom") or {}
    rows = []
    for a in section.get("activations") or []:
        bits = a.get("headroom_bits")
        rows.append([a.get("module") or "<model>", a.get("class"), common.fmt_num(a.get("max_abs")),
                     f"{bits:.1f}" if isinstance(bits, (int, float)) else common.fmt_num(bits),
                     "OVERFLOWS" if a.get("overflows_fp16") else ("non-finite" if a.get("finite") is False else "ok")])
    return rows


def headroom_markdown(result: dict) -> str:
    section = result.get("headroom")
    if not section:
        return "#### Overflow / underflow headroom\n" + (_na(result, "headroom") or "*not measured*")
    from ..engine.headroom import window_text  # the engine's wording, so page and CLI agree

    g = section.get("gradient_summary") or {}
    lines = ["#### Overflow / underflow headroom"]
    first = section.get("first_overflow")
    lines.append(f"First fp16 overflow: **{_where(first) if first else 'none'}**.")
    if g:
        ftz = g.get("flush_to_zero_share")
        lines.append(f"Gradients: {ftz:.1%} of nonzero elements would flush to zero in fp16 without loss scaling; "
                     f"{window_text(g)}." if isinstance(ftz, (int, float)) else "")
    rel = section.get("relative_error") or {}
    if rel:
        lines.append("Relative error vs fp32: " + ", ".join(
            f"{p} output {common.fmt_num(v.get('output'))}, loss {common.fmt_num(v.get('loss'))}"
            for p, v in rel.items()))
    return "\n\n".join(x for x in lines if x) + "\n"


def findings_markdown(result: dict) -> str:
    findings = [Finding.from_dict(f) for f in result.get("findings", [])]
    return findings_to_markdown(findings, title="Findings")


def status_markdown(result: dict) -> str:
    spec, dev = result.get("spec", {}), result.get("device", {})
    n = len(result.get("findings", []))
    text = (f"**{spec.get('name', 'model')}** on "
            f"{dev.get('name', dev.get('type', '?'))}: {n} finding{'s' if n != 1 else ''}.")
    errors = result.get("errors") or {}
    failed = {k: v for k, v in errors.items() if not (isinstance(v, dict) and v.get("kind") == "not_available")}
    if failed:
        text += "\n\n" + common.error_markdown("\n".join(
            f"{k}: {v.get('message', v) if isinstance(v, dict) else v}" for k, v in failed.items()))
    return text


def ui_check(mode, preset, params, yaml_text, upload, weights, device, checks, steps,
             budget_s=DEFAULT_UI_BUDGET_S, progress=None) -> tuple:
    """The Run button: (status, capability, findings, alignment rows, skip-rate text, skip-rate plot,
    NaN text, headroom text, headroom rows, JSON download)."""
    source = specinput.source_from_inputs(mode, preset, params, yaml_text, upload, weights)
    result = run(source, device, checks, steps, progress=progress, budget_s=budget_s)
    name = str(result.get("spec", {}).get("name") or "model")
    path = common.write_download(f"check_{name}.json", json.dumps(result, indent=2, default=str))
    say = common.for_page
    return (say(status_markdown(result)), say(capability_card(result)), say(findings_markdown(result)),
            alignment_rows(result), say(skiprate_markdown(result)), skiprate_figure(result),
            say(nan_markdown(result)), say(headroom_markdown(result)), headroom_rows(result), path)


# ---------------------------------------------------------------- checkpoint and device


def inspect_report(checkpoint):
    """The checkpoint's `InspectReport`, named by the file name the user gave it (never the
    server's upload folder); loaded with torch.load(weights_only=True), so no code runs."""
    path = common.upload_path(checkpoint)
    if not path:
        raise UserError("upload a checkpoint (.pt/.pth/.bin/.ckpt/.safetensors) to inspect")
    common.check_size(path, SETTINGS.max_file_bytes)
    from ..engine.inspect_checkpoint import inspect_checkpoint

    # In-process: torch.load(weights_only=True) runs no code, and the upload limit bounds memory.
    report = inspect_checkpoint(path)
    report.path = common.display_name(path)
    return report


def inspect_upload(checkpoint) -> dict:
    """The `inspect` endpoint: the checkpoint report as `inspect --format json` prints it."""
    return inspect_report(checkpoint).to_dict()


def ui_inspect(upload) -> tuple[str, dict]:
    """The Inspect button: the summary the CLI prints (what is present, dtypes, findings) shown
    verbatim, and the JSON report."""
    report = inspect_report(upload)
    n = len(report.findings)
    head = f"**{common.md_escape(report.path)}**: " + (f"{n} finding{'s' if n != 1 else ''}" if n else "no findings")
    return f"{head}\n\n```text\n{report.to_text()}```\n", report.to_dict()


def capability_in_child(device: str = "auto") -> dict:
    from ..engine.capability import detect

    return detect(device or "auto").to_dict()


@functools.lru_cache(maxsize=8)
def _capability_cached(device: str) -> dict:
    if device == "auto":
        cached = host.host_info().get("capability")
        if cached:
            return cached
    report = jobs.run_job(_no_progress(capability_in_child), device, timeout_s=120,
                          device_key=host.device_key(device))
    report.pop("job", None)
    return report


def capability(device: str = "auto") -> dict:
    """The capability report of `device`, probed once per device in a worker process (the
    server never creates a CUDA context), then remembered: hardware does not change."""
    return copy.deepcopy(_capability_cached(host.validate_device(device)))


class _no_progress:
    """Adapts a job that takes no `progress` to `jobs.run_job` (picklable: wraps a module function)."""

    def __init__(self, func):
        self.func = func
        self.__name__ = getattr(func, "__name__", "job")

    def __call__(self, *args, progress=None, **kwargs):
        return self.func(*args, **kwargs)
