"""trace: run the user's own training script on this host and report what its mixed precision
actually does (docs/trace.md).

    report = trace_script("train.py", ["--amp"], steps=20)

One-job modules: `runner` (the child process and its time limit), `child` (runs the script with
the observers), `patches` (hooks and wrappers), `recorder` (events per step and the protocol
state), `numerics` (first non-finite module, headroom), `analysis` (events -> Findings) and
`report` (the JSON object and its renderings); `trace --nproc`: `rank` (a rank's torch.distributed
observers) and `merge` (the ranks' reports as one), launched by `troubleshooter.torchrun`.
Only the child imports torch: this process (`analysis`, `report`, `runner`, `merge`) builds the
report from the child's JSON without it (`import troubleshooter.trace` loads no torch).
"""
from __future__ import annotations

import importlib.util
import os
import sys
from typing import Callable, Sequence

from ..errors import UserError
from .report import exit_code, render_markdown, render_text

__all__ = ["trace_script", "exit_code", "render_markdown", "render_text"]

MAX_STEPS = 10_000


def trace_script(script: str | os.PathLike, args: Sequence[str] = (), steps: int = 20, device: str = "auto",
                 timeout_s: float = 120, nan: bool = False, headroom: bool = False, cwd: str | None = None,
                 progress: Callable[[float, str], None] | None = None, autocast_policy: str = "cuda",
                 nproc: int | None = None, raw: dict | None = None, steady: bool = True) -> dict:
    """Run `python SCRIPT ARGS` in a child for at most `steps` optimizer steps and `timeout_s`
    seconds; return the trace report (JSON-serialisable). A script that fails is reported, not
    raised; one that cannot be started raises UserError. `cwd` None: the script's own folder
    (an uploaded script next to its files); the CLI passes the current directory.
    `autocast_policy` 'cuda' (default): on a host without a GPU the script's CPU autocast regions
    follow CUDA autocast's op lists, so the answers are its GPU's; 'host': the CPU's own lists.
    `nproc` N: the script runs under torch.distributed.run with N ranks (1 included), each traced,
    and the report merges them (trace/merge.py, docs/distributed.md). `raw`: a child's result
    already run (one rank's), reported instead of running the script. `steady` False keeps every
    instrument armed on every step (`--no-steady`; docs/trace.md, "Steady state")."""
    if raw is None:
        require_torch()
    from ..explain import explain_log
    from ..jsonsafe import jsonable
    from . import analysis, framework_report, report
    from .precision import in_effect
    from .runner import device_env, run_child, validate_script

    if isinstance(args, str):
        raise UserError("args must be a list of strings, not one string")
    args = [str(a) for a in args]
    if not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= MAX_STEPS:
        raise UserError(f"steps must be an integer from 1 to {MAX_STEPS}, got {steps!r}")
    try:
        timeout_s = float(timeout_s)
    except (TypeError, ValueError):
        raise UserError(f"timeout must be a number of seconds, got {timeout_s!r}") from None
    if not timeout_s > 0:
        raise UserError(f"timeout must be positive, got {timeout_s:g}")
    device_env(device)  # validates
    from ..engine.check_options import check_policy  # torch-free: the parent of a trace never imports torch

    autocast_policy = check_policy(autocast_policy)
    if raw is None and nproc is not None:
        from .merge import trace_ranks
        return trace_ranks(trace_script, script, args, steps, device, timeout_s, nan, headroom, cwd, nproc, progress,
                           autocast_policy=autocast_policy, steady=steady)
    path = validate_script(script, cwd)
    if progress is not None:
        progress(0.0, f"starting {os.fspath(script)}")
    if raw is None:
        raw = run_child(path, os.fspath(script), args, steps, timeout_s, nan, headroom, cwd, device, progress,
                        autocast_policy=autocast_policy, steady=steady)
    exc = (raw.get("exit") or {}).get("exception")
    explained = []
    if exc and not exc.get("caused_by_tool"):
        explained = [m.to_dict() for m in explain_log(exc.get("traceback") or exc.get("message") or "").matches]
    framework_report.adjust(raw)  # mistakes seen through a framework's GradScaler get the framework rules
    precision = framework_report.apply_to_precision(raw, in_effect(raw))
    findings = analysis.all_findings(raw, explained, precision)
    fw_section = framework_report.section(raw, precision)
    findings += (framework_report.findings(raw, precision, fw_section) + framework_report.fsdp_findings(raw)
                 + framework_report.lightning_scheduler_findings(raw))
    scale, skipped = analysis.scale_series(raw.get("series") or [])
    out = report.build(os.fspath(script), [os.fspath(script), *args], device, raw, findings, explained,
                       nan, headroom, scale, skipped, precision)
    if fw_section is not None:
        out["framework"] = jsonable(fw_section)
    if progress is not None:
        progress(1.0, "trace finished")
    return out


def require_torch() -> None:
    """The child runs the script with torch. Where torch is not installed (the lint-only install)
    the CLI says so and names the extra, as for every engine command, instead of reporting a
    child that died; torch is looked up here, not imported (this process never needs it)."""
    if sys.modules.get("torch") is None and importlib.util.find_spec("torch") is None:
        raise ModuleNotFoundError("No module named 'torch'", name="torch")
