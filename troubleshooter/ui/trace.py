"""Trace: run the user's own training script for a few steps on this host (only with
--allow-exec) and show what its AMP really did, beside the static findings.

`troubleshooter.trace.trace_script` does the work; it is imported lazily so the app runs (and
says so) where that module is absent. The job goes through the GPU queue and a worker like a
check; the script itself runs in the tracer's own child process, in a folder of its own.
"""
from __future__ import annotations

import shlex
import shutil
from pathlib import Path

from ..errors import UserError
from . import common, host, jobs
from .ranks import parse_nproc, trace_ranks_markdown
from .server import SETTINGS

MAX_STEPS = 500
SEEN_AT_RUN_TIME = "seen at run time"
_NO_EXEC = ("this server does not run uploaded scripts. The operator can start it with --allow-exec "
            "(each run then happens in a child process with a time limit); meanwhile the static "
            "diagnosis (lint) needs no execution")


def _trace_fn():
    try:
        from ..trace import trace_script
    except ImportError:
        raise UserError("tracing a script is not available in this version of the troubleshooter "
                        "(its trace module is not installed); the static diagnosis still works") from None
    return trace_script


def parse_args(text: str | None) -> list[str]:
    """The script's command-line arguments, split as a shell would (no shell runs them)."""
    try:
        return shlex.split(text or "")
    except ValueError as exc:
        raise UserError(f"the script arguments could not be split: {exc} (check the quotes)") from None


def parse_steps(steps) -> int:
    try:
        value = float(steps)
    except (TypeError, ValueError):
        raise UserError(f"steps must be a whole number, not {steps!r}") from None
    if value != int(value) or not 1 <= value <= MAX_STEPS:
        raise UserError(f"steps must be a whole number from 1 to {MAX_STEPS}, not {steps}")
    return int(value)


def stage_script(code: str | None, upload) -> Path:
    """Copy the uploaded script (or write the pasted code) into a fresh folder, the run's cwd, so
    the script sees only its own folder and keeps the name the user gave it."""
    path = common.upload_path(upload)
    folder = common.fresh_dir(prefix="amp-trace-")
    if path:
        name = common.display_name(path)
        if Path(name).suffix.lower() != ".py":
            raise UserError(f"{name}: only a Python script (.py) can be run; a notebook is diagnosed statically")
        common.check_size(path, SETTINGS.max_file_bytes)
        target = folder / name
        shutil.copyfile(path, target)
        return target
    text = common.check_text_size(code, SETTINGS.max_file_bytes, "the pasted code")
    if not text.strip():
        raise UserError("nothing to run: upload a training script (.py) or paste one")
    target = folder / "pasted.py"
    target.write_text(text, encoding="utf-8")
    return target


def run(code: str | None, upload, args: str | None = "", steps=20, device: str = "auto", progress=None,
        autocast_policy: str = "cuda", nproc=1) -> dict:
    """The tracer's JSON for the user's script, run on this host (refused without --allow-exec);
    `nproc` > 1: under torch.distributed.run with that many ranks (bounded: ui/ranks.py)."""
    if not SETTINGS.allow_exec:
        raise UserError(_NO_EXEC)
    _trace_fn()  # an absent trace module is refused here, before a worker starts
    argv, n = parse_args(args), parse_steps(steps)
    device = host.validate_device(device)
    from ..engine.check_options import check_policy  # torch-free: the server validates the option

    autocast_policy = check_policy(autocast_policy)
    ranks = parse_nproc(nproc, device)
    script = stage_script(code, upload)
    limit = SETTINGS.job_timeout_s
    # the tracer stops its own child at `limit`; the worker around it gets a margin to report that
    result = jobs.run_job(_traced, str(script), timeout_s=limit + 30, progress=progress,
                          device_key=host.device_key(device), args=tuple(argv), steps=n, device=device,
                          limit_s=limit, cwd=str(script.parent), autocast_policy=autocast_policy, nproc=ranks)
    return _memory_note(public_result(result, script.name, str(script.parent)))


def _memory_note(result: dict) -> dict:
    """Say so when the script failed for want of memory under the server's per-job limit."""
    exc = (result.get("exit") or {}).get("exception") or {}
    if SETTINGS.job_memory_mb and (exc.get("type") == "MemoryError" or "can't allocate memory" in str(exc.get("message"))):
        result["note"] = (f"the script ran out of memory: this server lets a job use at most "
                          f"{SETTINGS.job_memory_mb:g} MiB")
    return result


def _traced(script: str, args=(), steps=20, device="auto", limit_s=120.0, cwd=None, progress=None,
            autocast_policy="cuda", nproc=None) -> dict:
    """In the worker: `trace_script` with the server's time limit (module-level: picklable)."""
    ranks = {"nproc": nproc} if nproc is not None else {}  # one process: the call as it always was
    return _trace_fn()(script, args=tuple(args), steps=steps, device=device, timeout_s=limit_s, cwd=cwd,
                       progress=progress, autocast_policy=autocast_policy, **ranks)


def public_result(result: dict, name: str, folder: str | None = None) -> dict:
    """The trace JSON with no server path left in it: files in the staging folder become paths
    relative to it (`train.py`, `pkg/model.py`), any other absolute path its file's own name."""
    prefix = (str(folder).rstrip("/") + "/") if folder else None

    def clean(value):
        if isinstance(value, str):
            if prefix and prefix in value:
                value = value.replace(prefix, "")
            return common.public_text(value) if "/" in value else value
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        return value

    result = clean(dict(result))
    result["script"] = name
    return result


def finding_rows(result: dict) -> list[list]:
    """Rows for the Diagnose table, each marked as seen at run time (same columns as lint's)."""
    rows = []
    for f in result.get("findings") or []:
        where = f.get("line") if f.get("line") is not None else ""
        if f.get("path") and f.get("path") != result.get("script"):
            where = f"{f['path']}:{where}" if where != "" else f["path"]
        if f.get("step") is not None:
            where = f"{where} (step {f['step']})" if where != "" else f"step {f['step']}"
        detail = f.get("module") or ""
        rows.append([f.get("severity", "info") if f.get("severity") != "error" else "ERROR",
                     f"{f.get('rule', '')} ({SEEN_AT_RUN_TIME})", str(where), detail,
                     f.get("message", ""), common.for_page(f.get("suggestion", ""))])  # the message may quote the script
    return rows


def _device_name(result: dict) -> str:
    """The device in words (the report keeps a dict: requested, type, index, name)."""
    dev = result.get("device")
    if isinstance(dev, dict):
        return str(dev.get("name") or dev.get("type") or dev.get("requested") or "?")
    return str(dev or "?")


def _exception_text(exc) -> str:
    """`TypeError: message` and the line of the user's file it came from, not the raw record."""
    if not isinstance(exc, dict):
        return str(exc)
    text = f"{exc.get('type', 'Exception')}: {exc.get('message') or ''}".strip()
    if exc.get("path"):
        text += f" (at {exc['path']}" + (f":{exc['line']}" if exc.get("line") else "") + ")"
    return text


def summary_markdown(result: dict) -> str:
    ex = result.get("exit") or {}
    status = ex.get("status", "?")
    n = len(result.get("findings") or [])
    counted = "backward passes" if str(result.get("steps_counted", "")).startswith("backward") else "step(s)"
    lines = [f"**Ran {common.md_escape(result.get('script', 'the script'))}** on "
             f"{common.md_escape(_device_name(result))}: {result.get('steps_observed', 0)} {counted} observed, "
             f"exit: {common.md_escape(status)}; {n} finding{'s' if n != 1 else ''} {SEEN_AT_RUN_TIME} "
             "(added to the table)."]
    from ..trace.precision import ran_without_mixed_precision

    precision = result.get("precision") or {}
    if precision.get("summary"):
        note = " (no mixed precision ran)" if ran_without_mixed_precision(precision) else ""
        lines.append(f"Precision in effect{note}: {common.md_escape(precision['summary'])}.")
    if ex.get("exception"):
        title = ("The tracer failed (not your script)" if (ex["exception"] or {}).get("caused_by_tool")
                 else "The script stopped with")
        lines.append(common.error_markdown(_exception_text(ex["exception"]), title=title))
    if result.get("note"):
        lines.append(f"**{common.md_escape(result['note'])}**")
    skipped = result.get("skipped_steps") or []
    if result.get("scale"):
        lines.append(f"Loss scale over {len(result['scale'])} step(s); {len(skipped)} step(s) skipped.")
    if result.get("distributed"):
        lines.append(trace_ranks_markdown(result))
    from ..trace.report import overhead_line

    if overhead_line(result):  # the page states the tracer's cost as the CLI and JSON do
        lines.append(common.md_escape(overhead_line(result)))
    return "\n\n".join(lines) + "\n"


def scale_figure(result: dict):
    """The loss scale per step with skipped steps marked; None when no GradScaler ran."""
    scale = [s for s in (result.get("scale") or [])]
    if not scale or all(s is None for s in scale):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 2.6))
    steps = list(range(len(scale)))
    ax.step(steps, [s if s is not None else float("nan") for s in scale], where="post", label="loss scale")
    skipped = [s for s in (result.get("skipped_steps") or []) if isinstance(s, int) and 0 <= s < len(scale)]
    if skipped:
        ax.scatter(skipped, [scale[s] for s in skipped], color="red", marker="x", zorder=3, label="skipped step")
    ax.set_yscale("log", base=2)
    ax.set_xlabel("step")
    ax.set_ylabel("loss scale")
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    return fig


def ui_trace(code: str | None, upload, args: str | None, steps, lint_rows, row_rules, autocast_policy="cuda",
             nproc=1, progress=None) -> tuple:
    """The "Run it on this host" button: (run summary, the findings table with the run-time rows
    added after the static ones, the rule of each row, the loss-scale plot or None)."""
    result = run(code, upload, args, steps, "auto", progress=progress, autocast_policy=autocast_policy,
                 nproc=nproc)
    static_rows = list(lint_rows or [])
    static_rules = list(row_rules or [])[:len(static_rows)]
    rows = finding_rows(result)
    rules = [str(f.get("rule", "")) for f in result.get("findings") or []]
    return (summary_markdown(result), static_rows + rows, static_rules + rules, scale_figure(result))
