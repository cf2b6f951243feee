"""`check`: run the diagnostics on one workload and gather them into one report.

Each check runs on its own: an out-of-memory error, a non-finite loss or a crash in one is
recorded as that check's error entry (memory released) and the others still run, so a user
always gets every answer that could be measured. The returned dict is the `check --format json`
object and is JSON-safe (non-finite numbers appear as the strings "inf", "-inf", "nan").
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable, Iterable

import torch

from ..findings import Finding, Severity
from ..jsonsafe import jsonable  # non-finite numbers as "inf"/"nan": in a check they are the finding
from ..units import format_seconds
from ..workload import Workload
from . import precision as prec
from .check_options import CHECKS, DEFAULT_STEPS, FIRST_ANSWER_BUDGET_S, MAX_BUDGET_S, MAX_STEPS, parse_only, \
    validated  # noqa: F401 (kept importable here)
from .check_options import check_budget as _check_budget, check_steps as _check_steps
from .budget import Budget, StepCosts, expected_step_s, fits, scaled, track_costs, untrack
from .device_info import describe_device as device_info
from .autocast_policy import autocast_policy as cuda_policy_on_cpu, banned_findings, check_policy, \
    describe as describe_policy
from .lowp_emulation import describe as describe_emulation, half_on_float32
from .threads import cpu_threads
from .training_step import is_oom, release, shared_start

DEFAULT_TIMEOUT_S = 900.0
DEFAULT_BUDGET_S = 60.0  # the whole run, for library callers (run_check, check_source)
_WEIGHT = {"capability": 1, "alignment": 1, "skiprate": 4, "nan": 3, "headroom": 1}  # for progress
# Run order: the fast checks that find the most first (alignment and the one-step headroom check
# find AMP201/202/203/210; the NaN check AMP205/206/212), the skip-rate probe, which needs many
# steps before its verdict means much, last: a short budget cuts it, not the others.
RUN_ORDER = ("capability", "alignment", "headroom", "nan", "skiprate")
# Shares of the budget when it is tight: the first answer favours the checks that run first (headroom:
# an fp32 step with hooks, two half forwards and an fp16 GradScaler step; nan: three hooked steps).
# Time a check does not use carries over, so with room the skip-rate probe gets the rest.
_BUDGET_WEIGHT = {"capability": 0.25, "alignment": 0.25, "headroom": 4, "nan": 4, "skiprate": 2}
HOOKED_STEP = 1.3  # a step with the nan/headroom hooks on, relative to a plain step (bench/nan_overhead.py)
Progress = Callable[[float, str], None]


# ---------------------------------------------------------------- one function per check
# Each returns (section, findings[, extra top-level keys[, error entry]]). `deadline` is the
# perf_counter time by which it should stop at a step boundary; `progress` takes its own 0..1.


def _capability(workload: Workload, device: torch.device, steps: int, seed: int, deadline=None, progress=None):
    try:
        from .capability import detect
    except ImportError:
        raise _NotAvailable("the capability check is not available in this build") from None
    report = detect(str(device))
    section = dict(report.to_dict())
    section.pop("findings", None)  # they go to the top-level list
    return section, list(report.findings)


def _alignment(workload: Workload, device: torch.device, steps: int, seed: int, deadline=None, progress=None):
    from .alignment import check_alignment

    result = check_alignment(workload, device)
    return result.to_list(), result.findings, {"alignment_summary": result.summary}


def _skiprate(workload: Workload, device: torch.device, steps: int, seed: int, deadline=None, progress=None):
    from .skiprate import DEFAULT_BUDGET_S as PROBE_BUDGET_S, check_skiprate

    result = check_skiprate(workload, device, steps=steps, seed=seed,
                            budget_s=PROBE_BUDGET_S if deadline is None else None, deadline=deadline,
                            progress=progress)
    return result.to_dict(), result.findings


def _nan(workload: Workload, device: torch.device, steps: int, seed: int, deadline=None, progress=None):
    try:
        from .nanhunt import hunt_nonfinite
    except ImportError:
        raise _NotAvailable("the nan check is not available in this build") from None
    section = dict(hunt_nonfinite(workload, device, seed=seed, deadline=deadline, progress=progress))
    findings = [f if isinstance(f, Finding) else Finding.from_dict(f) for f in section.pop("findings", [])]
    return section, findings, {}, _precisions_not_run("nan", section.get("precisions") or {})


def _precisions_not_run(name: str, sections: dict[str, Any]) -> dict[str, Any] | None:
    """An error entry when some precision's run never happened: nothing was verified there, so
    the check must not read as clean (a dict-returning model without a loss, a crash)."""
    failed = {p: s["error"] for p, s in sections.items() if isinstance(s, dict) and s.get("error")}
    cut = [p for p, s in sections.items() if isinstance(s, dict) and s.get("not_run") == "budget"]
    if not failed and not cut:
        return None
    if not failed:
        return {"kind": "budget", "precisions": cut,
                "message": f"the {name} check ran out of its time budget before {', '.join(cut)}: not verified "
                           "there (raise --budget)"}
    first = next(iter(failed.values()))
    every = len(failed) == len(sections)
    which = "any precision" if every else ", ".join(failed)
    return {"kind": "failed" if every else "incomplete", "precisions": list(failed) + cut,
            "message": f"the {name} check could not run in {which}: {first}"
                       + (f" (and {', '.join(cut)} was cut by the time budget)" if cut else "")}


def _headroom(workload: Workload, device: torch.device, steps: int, seed: int, deadline=None, progress=None):
    from .headroom import check_headroom

    result = check_headroom(workload, device, seed=seed, deadline=deadline, progress=progress)
    return result.to_dict(), result.findings


_RUNNERS = {"capability": _capability, "alignment": _alignment, "skiprate": _skiprate,
            "nan": _nan, "headroom": _headroom}


class _NotAvailable(Exception):
    pass


# ---------------------------------------------------------------- the report


def spec_info(workload: Workload) -> dict[str, Any]:
    return {"name": workload.name, "batch_size": workload.batch_size, "seq_len": workload.seq_len,
            "loss_weight": workload.loss_weight, "flops_per_step": workload.flops_per_step,
            "summary": workload.summary}


def _tagged(f: Finding, check: str) -> Finding:
    """Every finding says which check produced it (data["check"])."""
    if f.data.get("check") == check:
        return f
    return Finding(f.rule, f.name, f.severity, f.message, f.suggestion, f.location, f.precision,
                   {"check": check, **f.data})


def _key(f: Finding) -> tuple:
    return (f.rule, f.location.module, f.precision)


def merge_findings(findings: list[Finding]) -> list[Finding]:
    """The same problem seen by two checks (e.g. AMP202 from nan and headroom) is one finding:
    the more severe one is kept, and its data says which checks confirmed it."""
    kept: dict[tuple, Finding] = {}
    confirmed: dict[tuple, list[str]] = {}
    for f in findings:
        k = _key(f)
        confirmed.setdefault(k, [])
        check = f.data.get("check")
        if check and check not in confirmed[k]:
            confirmed[k].append(check)
        if k not in kept or f.severity.rank > kept[k].severity.rank:
            kept[k] = f
    out = []
    for k, f in kept.items():
        if len(confirmed[k]) > 1:
            f = Finding(f.rule, f.name, f.severity, f.message, f.suggestion, f.location, f.precision,
                        {**f.data, "confirmed_by": confirmed[k]})
        out.append(f)
    return sorted(out, key=lambda f: (-f.severity.rank, f.rule, f.location.module or "", f.precision or ""))


def exit_code(result: dict[str, Any]) -> int:
    """0: no warning or error finding; 1: some, or a check that could not finish (out of memory,
    a crash, a precision it could not run in): nothing was verified there, so the run must not
    read as clean."""
    bad = {Severity.ERROR.value, Severity.WARNING.value}
    if any(f.get("severity") in bad for f in result.get("findings", [])):
        return 1
    failed = [e for e in (result.get("errors") or {}).values() if e.get("kind") != "not_available"]
    return 1 if failed else 0


def _error_entry(name: str, exc: BaseException, device: torch.device) -> dict[str, Any]:
    if isinstance(exc, _NotAvailable):
        return {"kind": "not_available", "message": str(exc)}
    if is_oom(exc):
        where = "GPU" if device.type == "cuda" else "host"
        return {"kind": "out_of_memory",
                "message": f"the {name} check ran out of {where} memory: use a smaller batch or model "
                           "(memory was released and the other checks still ran)"}
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return {"kind": "failed", "message": f"the {name} check failed: {type(exc).__name__}"
                                         + (f": {text}" if text else "")}


def run_check(workload: Workload, device: str | torch.device = "auto", only: str | Iterable[str] | None = None,
              steps: int = DEFAULT_STEPS, seed: int = 0, progress: Progress | None = None,
              budget_s: float | None = DEFAULT_BUDGET_S, started_at: float | None = None,
              autocast_policy: str = "cuda") -> dict[str, Any]:
    """Run the selected checks on `workload` within `budget_s` seconds (None: no limit); return
    the `check --format json` object. `started_at` (a `time.time()`, e.g. when the CLI started
    or before the model was built) counts those fixed costs against the budget too.
    `autocast_policy` 'cuda' (default): on a CPU, autocast follows CUDA's op lists, so the
    answers are those of the user's GPU; 'host': the CPU's own lists (training on CPUs)."""
    dev = prec.resolve_device(device)
    policy = check_policy(autocast_policy)
    selected = parse_only(only)
    _check_steps(steps)
    _check_budget(budget_s)
    budget = Budget(budget_s, {c: _BUDGET_WEIGHT[c] for c in selected})
    start_up = None if started_at is None else max(0.0, time.time() - started_at)
    if start_up is not None:
        budget.started -= start_up
    token = track_costs(StepCosts(workload.flops_per_step, dev))
    try:
        with cuda_policy_on_cpu(dev, policy) as policy_run, cpu_threads(dev) as threads, \
                half_on_float32(dev) as emulation:  # numerics of half precision in float32's time
            with shared_start(workload, seed):  # the checks' models: one build, copied
                result = _run_selected(workload, dev, selected, steps, seed, progress, budget_s, budget)
    finally:
        untrack(token)
    if start_up is not None:  # on a GPU host importing torch alone took 7 s of the 9 s budget: say so
        result["timings_s"]["start_up"] = round(start_up, 3)
    result["device"]["autocast_policy"] = describe_policy(policy_run, policy, str(dev))
    banned = [f.to_dict() for f in banned_findings(result["device"]["autocast_policy"])]
    if banned:
        result["findings"] = result["findings"] + banned
        result["exit_code"] = exit_code(result)
    if threads:
        result["device"]["threads"] = threads
    emulated = describe_emulation(emulation)
    if emulated:
        result["device"]["half_emulation"] = emulated
    return result


def _first_unit_s(name: str) -> float | None:
    """What a check's first unit of work is expected to take here (None: unknown or negligible)."""
    if name == "skiprate":
        return expected_step_s("fp16")
    if name == "headroom":  # an fp32 step with hooks, then an fp16 and a bf16 forward
        parts = [expected_step_s("fp32", HOOKED_STEP), expected_step_s("fp16", 1 / 3), expected_step_s("bf16", 1 / 3)]
        return None if None in parts else sum(parts)
    if name == "nan":  # its first precision (the others are decided inside, per precision)
        return expected_step_s("fp32", HOOKED_STEP)
    return None  # capability and alignment take no training step


def _cut_entry(name: str, need_s: float, deadline: float) -> dict[str, Any]:
    share = max(0.0, deadline - time.perf_counter())
    left = (f"more than its {format_seconds(share)} share of the time budget" if share >= 0.001
            else "and its share of the time budget was already spent")
    return {"kind": "budget", "expected_s": round(need_s, 1), "share_s": round(share, 1),
            "message": f"the {name} check was not run: its first step is expected to take about "
                       f"{format_seconds(need_s)} on this device, {left} "
                       "(raise --budget, or use --only to spend it on fewer checks)"}


def _run_selected(workload: Workload, dev: torch.device, selected: list[str], steps: int, seed: int,
                  progress: Progress | None, budget_s: float | None, budget: Budget) -> dict[str, Any]:
    result: dict[str, Any] = {"device": device_info(dev), "spec": spec_info(workload), "findings": []}
    result.update({c: None for c in CHECKS})
    result["skipped"] = {c: "not selected (--only)" for c in CHECKS if c not in selected}
    errors: dict[str, dict[str, Any]] = {}
    timings: dict[str, float] = {}
    findings: list[Finding] = []
    total = sum(_WEIGHT[c] for c in selected)
    done = 0
    for name in [c for c in RUN_ORDER if c in selected]:
        if progress is not None:
            progress(done / total, f"{name} check on {dev}")
        started = time.perf_counter()
        deadline = budget.deadline_for(name)
        local = scaled(progress, done / total, _WEIGHT[name] / total)
        need = _first_unit_s(name) if deadline is not None else None
        if not fits(deadline, need):  # a step that cannot end in time is not started
            errors[name] = _cut_entry(name, need, deadline)
            timings[name] = round(time.perf_counter() - started, 3)
            done += _WEIGHT[name]
            continue
        try:
            out = _RUNNERS[name](workload, dev, steps, seed, deadline, local)
            section, found = out[0], out[1]
            if len(out) > 2 and out[2]:
                result.update(out[2])
            result[name] = section
            findings += [_tagged(f, name) for f in found]
            if len(out) > 3 and out[3]:
                errors[name] = out[3]
        except Exception as exc:  # noqa: BLE001 - one failing check must not lose the others
            errors[name] = _error_entry(name, exc, dev)
        finally:
            release(dev)
            timings[name] = round(time.perf_counter() - started, 3)
        done += _WEIGHT[name]
    if progress is not None:
        progress(1.0, "done")
    result["findings"] = [f.to_dict() for f in merge_findings(findings)]
    result["errors"] = errors
    result["timings_s"] = timings
    result["seed"] = seed
    result["steps"] = steps
    result["budget"] = _budget_report(budget_s, budget, result)
    result = jsonable(result)
    result["exit_code"] = exit_code(result)
    return result


def _budget_report(budget_s: float | None, budget: Budget, result: dict[str, Any]) -> dict[str, Any]:
    """What the budget cut: the skip-rate steps not taken, the precisions and measurements skipped."""
    cut = [f"{name}: not run (its first step would not fit)" for name, e in (result.get("errors") or {}).items()
           if e.get("kind") == "budget" and result.get(name) is None]
    sr = (result.get("skiprate") or {}).get("summary") or {}
    if sr.get("stopped_by_budget"):
        cut.append(f"skiprate: {sr.get('steps')} of {sr.get('steps_requested')} fp16 steps (the rest did not fit "
                   "its share of the budget); its verdict rests on those")
    for p, sec in ((result.get("nan") or {}).get("precisions") or {}).items():
        if isinstance(sec, dict) and sec.get("not_run") == "budget":
            cut.append(f"nan: {p} not run")
    hd = (result.get("headroom") or {}).get("gradient_summary") or {}
    if hd.get("default_scaler_not_measured") == "budget":
        cut.append("headroom: the fp16 GradScaler step was not measured (AMP203 estimated from fp32 gradients)")
    elapsed = time.perf_counter() - budget.started
    result["timings_s"]["total"] = round(elapsed, 3)
    out = {"budget_s": budget_s, "cut": cut,
           "exceeded_s": round(elapsed - budget_s, 3) if budget_s is not None and elapsed > budget_s else None}
    if cut and budget_s is not None:
        out["suggested_s"] = suggested_budget(budget_s, elapsed, _left_s(result))
        out["more"] = f"run again with --budget {out['suggested_s']:g} to measure the rest"
    return out


def _left_s(result: dict[str, Any]) -> float:
    """What the work the budget cut is expected to take here (seconds, from this run's steps)."""
    left = 0.0
    for name, e in (result.get("errors") or {}).items():
        if e.get("kind") == "budget" and result.get(name) is None:
            if name == "skiprate":
                left += (expected_step_s("fp16") or e.get("expected_s") or 0.0) * result.get("steps", DEFAULT_STEPS)
            elif name == "nan":
                left += sum(expected_step_s(p, HOOKED_STEP) or e.get("expected_s") or 0.0 for p in prec.PRECISIONS
                            if p != "tf32")
            else:
                left += e.get("expected_s") or 0.0
    sr = (result.get("skiprate") or {}).get("summary") or {}
    if sr.get("stopped_by_budget"):
        left += (expected_step_s("fp16") or 0.0) * max(0, (sr.get("steps_requested") or 0) - (sr.get("steps") or 0))
    for p, sec in ((result.get("nan") or {}).get("precisions") or {}).items():
        if isinstance(sec, dict) and sec.get("not_run") == "budget":
            left += expected_step_s(p, HOOKED_STEP) or 0.0
    hd = (result.get("headroom") or {}).get("gradient_summary") or {}
    if hd.get("default_scaler_not_measured") == "budget":
        left += expected_step_s("fp16") or 0.0
    return left


def suggested_budget(budget_s: float, elapsed_s: float, left_s: float) -> float:
    """A budget that should fit what was cut: this run's time plus the cut work's expected time,
    with a quarter to spare for a busy host, rounded up to 10 s; at least twice this budget."""
    want = max(2 * budget_s, 1.25 * (elapsed_s + left_s))
    return float(min(MAX_BUDGET_S, 10 * math.ceil(want / 10)))


def check_source(source, allow_exec: bool = False, device: str | torch.device = "auto",
                 only: str | Iterable[str] | None = None, steps: int = DEFAULT_STEPS, seed: int = 0,
                 progress: Progress | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 budget_s: float | None = DEFAULT_BUDGET_S, started_at: float | None = None,
                 autocast_policy: str = "cuda") -> dict[str, Any]:
    """`run_check` on a `spec.SpecSource`: YAML and presets in-process, a Python file in a child
    process with a time limit (and without the progress callback, which cannot cross processes).
    The budget counts from `started_at` (default: now), so building the model is inside it."""
    from ..spec import run_with_workload

    started_at = time.time() if started_at is None else started_at
    parse_only(only)  # bad options fail before anything is built (or a child is started)
    _check_steps(steps)
    _check_budget(budget_s)
    autocast_policy = check_policy(autocast_policy)
    if budget_s is not None:
        timeout_s = min(timeout_s, 3 * budget_s + 120)  # a step past the budget, plus building the model
    if isinstance(device, str):
        device = str(prec.resolve_device(device))  # a bad device fails before the model is built
    if getattr(source, "kind", None) == "python":
        progress = None
    result = run_with_workload(source, run_check, allow_exec=allow_exec, timeout_s=timeout_s,
                               device=device, only=only, steps=steps, seed=seed, progress=progress,
                               budget_s=budget_s, started_at=started_at, autocast_policy=autocast_policy)
    result.setdefault("spec", {})["source"] = source.describe()
    return result


# ---------------------------------------------------------------- typed report and option checks


def check_options(device: str | torch.device = "auto", only: str | Iterable[str] | None = None,
                  steps: Any = DEFAULT_STEPS, budget_s: Any = DEFAULT_BUDGET_S,
                  autocast_policy: str = "cuda") -> dict[str, Any]:
    """The options of a check run, validated by the rules `run_check` applies (UserError with
    the reason), as `check_source` keyword arguments (the app's server uses `check_options.validated`
    with its own device probe, so it never imports torch)."""
    out = validated(device, only, steps, budget_s, autocast_policy)
    out["device"] = device if isinstance(device, torch.device) else str(prec.resolve_device(device))
    return out


def check_report(source, **kwargs: Any):
    """`check_source` as a typed `CheckReport` (picklable: what crosses the app's worker boundary)."""
    from .check_report import CheckReport

    return CheckReport.from_dict(check_source(source, **kwargs))
