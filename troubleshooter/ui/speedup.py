"""Speedup tab: time fp32 / TF32 / fp16 / bf16 on this host, in a worker, with plot and verdict."""
from __future__ import annotations

import json
import math

from ..errors import UserError
from ..units import format_bytes
from . import common, host, jobs, specinput
from .server import SETTINGS

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
MAX_BUDGET_S = 600.0
DEFAULT_UI_BUDGET_S = 20.0  # as the CLI's --budget (engine.speedup.DEFAULT_BUDGET_S): a verdict or "inconclusive"
# the speedup is the median of the paired per-round ratios (docs/speedup.md), not the ratio of the
# median columns beside it: the header says which
TABLE_HEADERS = ["precision", "median ms", "IQR ms", "throughput", "peak memory",
                 "speedup vs fp32 (paired median, 95% interval)",
                 "final loss (Δ vs fp32)", "note"]


def _parse_precisions(precisions) -> list[str]:
    if isinstance(precisions, str):
        precisions = [p for p in precisions.replace(" ", ",").split(",") if p]
    chosen = [str(p).strip().lower() for p in (precisions or [])]
    bad = [p for p in chosen if p not in PRECISIONS]
    if bad:
        raise UserError(f"unknown precision(s) {', '.join(bad)}: choose from {', '.join(PRECISIONS)}")
    if not chosen:
        raise UserError("choose at least one precision to time")
    return [p for p in PRECISIONS if p in chosen]


def _budget(budget_s) -> float:
    try:
        budget = float(budget_s)
    except (TypeError, ValueError):
        raise UserError(f"the time budget must be a number of seconds, not {budget_s!r}") from None
    if not math.isfinite(budget) or not 1 <= budget <= MAX_BUDGET_S:
        raise UserError(f"the time budget must be between 1 and {MAX_BUDGET_S:g} seconds, not {budget_s}")
    return budget


def measure(source, device: str = "auto", precisions=PRECISIONS, budget_s: float = DEFAULT_UI_BUDGET_S,
            compile: bool = False, progress=None) -> dict:
    """Run `speedup_source` for `source`: in a worker process (YAML/preset), or through the spec
    loader's own child process (an allowed Python file)."""
    from ..jobs_entry import speedup_source  # the server stays torch-free

    precs, budget = _parse_precisions(precisions), _budget(budget_s)
    device = host.validate_device(device)
    specinput.validate(source)
    # compiling and building models come on top of the budget; the operator's limit is a hard cap
    timeout = min(SETTINGS.job_timeout_s, 3 * budget + (600 if compile else 120))
    # the budget counts from when the job gets its device, so the hand-off to the worker is inside it
    kwargs = dict(device=device or "auto", precisions=precs, budget_s=budget, compile=bool(compile),
                  clock_kwarg="started_at")
    common.warm_plotting()  # the plot is drawn here once the job returns: not on the user's budget
    if specinput.is_python(source):
        if progress:
            progress(0.0, "running the uploaded model file in its own process")
        return jobs.run_job(speedup_python_file, source, allow_exec=SETTINGS.allow_exec, in_worker=False,
                            timeout_s=timeout, device_key=host.device_key(device), **kwargs)
    return jobs.run_job(speedup_source, source, timeout_s=timeout, progress=progress,
                        device_key=host.device_key(device), **kwargs)


def speedup_python_file(source, allow_exec: bool = False, timeout_s: float = 600.0, progress=None, **kwargs) -> dict:
    """`speedup_source` for an uploaded Python model file, under the server's `--job-timeout`
    (the library's own limit is derived from the budget alone, and a hanging `build_model()`
    must not hold the device longer than the operator allowed). No progress crosses that child."""
    from ..engine.speedup import run_speedup
    from ..spec import run_with_workload

    return run_with_workload(source, run_speedup, allow_exec=allow_exec, timeout_s=timeout_s, **kwargs)


def _rate(x, unit) -> str:
    if x is None:
        return "—"
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= div:
            return f"{x / div:.2f}{suffix} {unit}"
    return f"{x:.1f} {unit}"


def table_rows(result: dict) -> list[list]:
    rows = []
    for p, r in result.get("results", {}).items():
        vs = r.get("speedup_vs_fp32")
        loss, diff = r.get("final_loss"), r.get("loss_rel_diff_vs_fp32")
        loss_text = "non-finite" if loss is None else f"{loss:.4g}"
        if loss is not None and diff is not None and p != "fp32":
            loss_text += f" ({diff:.2%})"
        notes = []
        if not r.get("native", True):
            notes.append("no native hardware: emulated/converted")
        if r.get("skipped_steps"):
            notes.append(f"{r['skipped_steps']} skipped warm-up step(s)")
        if r.get("peak_share") is not None:
            notes.append(f"{r['achieved_tflops']:.3g} TFLOP/s = {r['peak_share']:.0%} of peak")
        rows.append([p, f"{r['median_ms']:.3f}", f"{r['iqr_ms']:.3f}",
                     _rate(r.get("throughput"), r.get("throughput_unit", "")),
                     format_bytes(r.get("peak_memory_bytes"), missing="—"), _vs_fp32(vs, r.get("speedup_vs_fp32_ci")),
                     loss_text, "; ".join(notes)])
    for p, why in result.get("unavailable", {}).items():
        rows.append([p, "—", "—", "—", "—", "—", "—", f"unavailable: {why}"])
    for p, why in result.get("errors", {}).items():
        rows.append([p, "—", "—", "—", "—", "—", "—", f"error: {why}"])
    for p, why in (result.get("skipped") or {}).items():  # not started: its first step would pass the budget
        rows.append([p, "—", "—", "—", "—", "—", "—", f"not timed: {why}"])
    return rows


def _vs_fp32(speedup, ci) -> str:
    """The speedup with its 95% interval: a ratio alone hides whether the rounds agreed."""
    if not speedup:
        return "—"
    if ci and None not in ci:
        return f"{speedup:.2f}x ({ci[0]:.2f}–{ci[1]:.2f})"
    return f"{speedup:.2f}x"


def verdict_markdown(result: dict) -> str:
    v = result.get("verdict", {})
    dev, st, spec = result.get("device", {}), result.get("settings", {}), result.get("spec", {})
    lines = [f"### Verdict: {v.get('recommendation', 'no verdict')}", ""]
    if v.get("speedup_ci"):
        lo, hi = v["speedup_ci"]
        lines.append(f"- Speedup {v.get('speedup') or 0:.2f}x, 95% interval {lo:.2f}x to {hi:.2f}x "
                     "(median of paired per-round ratios, rounds in shuffled order).")
    lines += [f"- {reason}" for reason in v.get("reasons", [])]
    for f in result.get("findings", []):
        lines.append(f"- **{f['rule']}** {f.get('name', '')}: {f['message']} — {f.get('suggestion', '')}")
    lines += ["", f"*Measured on* {dev.get('summary', dev.get('name', '?'))}."]
    if dev.get("note"):
        lines.append(f"*{dev['note']}*")
    if st:
        lines.append(f"*{spec.get('name', 'model')}: {st.get('rounds')} interleaved rounds in "
                     f"{st.get('elapsed_s', 0):.1f} s (budget {st.get('budget_s', 0):g} s, stopped: "
                     f"{st.get('stopped_because')}); timer: {st.get('timer')}.*")
    return "\n".join(lines) + "\n"


def figure(result: dict):
    from ..engine.speedup_plot import plot_speedup

    return plot_speedup(result)


def _json_download(result: dict) -> str:
    name = str(result.get("spec", {}).get("name") or "model")
    return common.write_download(f"speedup_{name}.json", json.dumps(result, indent=2, default=str))


def ui_speedup(mode, preset, params, yaml_text, upload, device, precisions, budget_s, compile,
               progress=None) -> tuple:
    """The Run button: (status, table rows, plot, verdict, JSON download)."""
    source = specinput.source_from_inputs(mode, preset, params, yaml_text, upload)
    result = measure(source, device, precisions, budget_s, compile, progress=progress)
    name = result.get("spec", {}).get("name", "model")
    status = f"*{common.stamp()}* · Measured **{common.md_escape(name)}** in {', '.join(result.get('results', {})) or 'no precision'}."
    rows = [[common.for_page(c) if isinstance(c, str) else c for c in row] for row in table_rows(result)]
    return status, rows, figure(result), common.for_page(verdict_markdown(result)), _json_download(result)
