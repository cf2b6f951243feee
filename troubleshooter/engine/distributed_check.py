"""`check --nproc N`: what sharding changes about a model's mixed precision, measured under
torch.distributed (gloo on a CPU host, nccl on GPUs), on the model wrapped the way it will train.

    result = check_distributed(SpecSource.preset("mlp"), nproc=2, wrap="fsdp2",
                               param_dtype="float16", reduce_dtype="float16")

The ranks (`engine/distributed_rank.py`) run under `torchrun.run_ranks`. The report says, per rank
and per step, what GradScaler decided and whether the rank's own gradients were finite (found-inf
agreement across ranks), what the reduction in the reduce dtype did to the gradients (elements
flushed to zero or turned inf), and whether a non-finite step went through unskipped. Findings:

| id | severity | when |
| --- | --- | --- |
| AMP204 | as in `check` | the skip pattern, judged like the single-process probe (rank 0's) |
| AMP270 | error | ranks disagree on skipping a step (or their loss scales differ) |
| AMP277 reduce-dtype-underflow | warning | the reduction flushes over 5% of non-zero gradient elements to zero, or makes any inf |
| AMP278 nonfinite-under-sharding | error | a rank's loss or gradients were non-finite on a step nothing skipped |
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

from ..errors import UserError
from ..findings import Finding, Location, Severity
from ..jsonsafe import jsonable

WRAPS = ("ddp", "fsdp2")
DTYPES = ("float16", "bfloat16", "float32")
UNDERFLOW_SHARE = 0.05  # as AMP203: the share of non-zero gradient elements lost that is worth a warning
REDUCE_UNDERFLOW = ("AMP277", "reduce-dtype-underflow")
NONFINITE = ("AMP278", "nonfinite-under-sharding")
DEFAULT_TIMEOUT_S = 300.0
_DTYPE_ALIASES = {"fp16": "float16", "half": "float16", "float16": "float16", "bf16": "bfloat16",
                  "bfloat16": "bfloat16", "fp32": "float32", "float": "float32", "float32": "float32"}


def check_options(nproc, wrap: str, param_dtype: str, reduce_dtype: str | None, device: str = "auto",
                  host: bool = True) -> dict:
    """The options validated (UserError with the reason); reduce_dtype None: param_dtype's, as FSDP2
    reduces in the compute dtype when none is given (DDP: float32, its default all-reduce).
    `host` False: nproc is not checked against this host (the page checks it without torch)."""
    wrap = (wrap or "").strip().lower()
    if wrap not in WRAPS:
        raise UserError(f"--wrap must be one of {', '.join(WRAPS)}, got {wrap!r}")
    dtypes = []
    for name, value in (("--param-dtype", param_dtype), ("--reduce-dtype", reduce_dtype)):
        if value is None:
            dtypes.append(None)
            continue
        canonical = _DTYPE_ALIASES.get(str(value).strip().lower())
        if canonical is None:
            raise UserError(f"{name} must be one of {', '.join(DTYPES)}, got {value!r}")
        dtypes.append(canonical)
    param, reduce = dtypes
    if param is None:
        raise UserError("--param-dtype is needed")
    if reduce is None:
        reduce = param if wrap == "fsdp2" else "float32"
    if host:
        from ..torchrun import check_nproc

        nproc = check_nproc(nproc, device)
    return {"nproc": nproc, "wrap": wrap, "param_dtype": param,
            "reduce_dtype": reduce}


def check_distributed(source, nproc: int, wrap: str = "ddp", param_dtype: str = "float16",
                      reduce_dtype: str | None = None, steps: int = 20, seed: int = 0, device: str = "cpu",
                      allow_exec: bool = False, timeout_s: float = DEFAULT_TIMEOUT_S,
                      progress: Callable[[float, str], None] | None = None) -> dict[str, Any]:
    """Run the ranks and return the report (JSON-safe). Bad options and specs raise UserError /
    SpecError before anything starts; a rank that fails is reported."""
    from ..spec import load_workload
    from ..torchrun import run_ranks

    opts = check_options(nproc, wrap, param_dtype, reduce_dtype, device)
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= 10_000:
        raise UserError(f"--steps must be a whole number from 1 to 10000, got {steps!r}")
    if source.kind == "python" and not allow_exec:
        load_workload(source, allow_exec=False)  # raises the spec loader's own "needs --allow-exec" error
    if source.kind != "python":
        load_workload(source)  # a bad spec fails here, once, not on every rank
    dev = "cuda" if (device or "auto").lower().startswith("cuda") or (device == "auto" and _has_cuda()) else "cpu"
    config = {"source": dataclasses.asdict(source), "allow_exec": allow_exec, "steps": steps, "seed": seed,
              "device": dev, "wrap": opts["wrap"], "param_dtype": opts["param_dtype"],
              "reduce_dtype": opts["reduce_dtype"]}
    launched = run_ranks("troubleshooter.engine.distributed_rank", config, opts["nproc"], timeout_s,
                         cwd=source.base_dir or os.getcwd(), device=dev, steps=steps, progress=progress)
    return report(source, opts, steps, launched)


def _has_cuda() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


def report(source, opts: dict, steps: int, launched: dict) -> dict[str, Any]:
    from ..trace.analysis import skiprate_findings
    from ..trace.merge import _step_table, disagreement_findings

    raws = launched["ranks"]
    launcher = launched["launcher"]
    rows = [_row(r, raw) for r, raw in enumerate(raws)]
    table = _step_table(raws)
    for row in table:
        row["local_grads_finite"] = {str(r): s.get("local_grads_finite") for r, raw in enumerate(raws)
                                     for s in raw.get("series") or [] if s["step"] == row["step"]}
    findings = disagreement_findings(table, raws)
    findings += [_tag(f) for f in skiprate_findings(raws[0].get("series") or [])] if raws else []
    reduction = _reduction(raws, opts)
    findings += reduction_findings(reduction, opts)
    findings += nonfinite_findings(raws)
    failed = [r for r in rows if r["status"] != "finished"]
    errors = {}
    if failed:
        errors["distributed"] = {"kind": "failed", "message": "; ".join(
            f"rank {r['rank']} {r['status']}" + (f": {r['error']}" if r.get("error") else "") for r in failed)}
    findings.sort(key=lambda f: (-f.severity.rank, f.rule))
    result = {
        "spec": {"source": source.describe()},
        "device": {"type": (raws[0].get("device") or "cpu").split(":")[0] if raws else None},
        "distributed": {"nproc": opts["nproc"], "wrap": opts["wrap"],
                        "policy": {"param_dtype": opts["param_dtype"], "reduce_dtype": opts["reduce_dtype"]},
                        "backend": next((raw.get("backend") for raw in raws if raw.get("backend")), None),
                        "ranks": rows, "steps": table, "reduction": reduction,
                        "launcher": {k: launcher[k] for k in ("returncode", "timed_out", "wall_s", "pids",
                                                               "leftover_processes")}},
        "findings": [f.to_dict() for f in findings], "errors": errors, "steps": steps,
    }
    result = jsonable(result)
    bad = any(f["severity"] in ("error", "warning") for f in result["findings"])
    result["exit_code"] = 1 if bad or errors else 0
    return result


def _tag(f: Finding) -> Finding:
    return Finding(f.rule, f.name, f.severity, f.message, f.suggestion, f.location, f.precision,
                   {**{k: v for k, v in f.data.items() if k != "seen"}, "check": "skiprate", "rank": 0})


def _row(rank: int, raw: dict) -> dict:
    proc = raw.get("rank_process") or {}
    series = raw.get("series") or []
    status = "finished" if series and not raw.get("error") and not proc.get("stopped") else \
        "raised" if raw.get("error") else "timeout" if proc.get("stopped_because") == "time limit" else \
        "stopped" if proc.get("stopped") else "crashed"
    scales = [s.get("scale_after") for s in series if s.get("scale_after") is not None]
    return {"rank": rank, "status": status, "steps": len(series), "error": raw.get("error"),
            "skipped_steps": [s["step"] for s in series if s.get("skipped")],
            "final_scale": scales[-1] if scales else None,
            "locally_nonfinite_steps": [s["step"] for s in series if s.get("local_grads_finite") is False],
            "where": proc.get("blocked")}


def _reduction(raws: list[dict], opts: dict) -> dict:
    """Per step, summed over ranks: elements, non-zero ones flushed to zero, finite ones made inf."""
    per: dict[int, dict] = {}
    error = None
    for raw in raws:
        for e in raw.get("reduction") or []:
            if e.get("step", 0) < 0:
                error = e.get("error")
                continue
            t = per.setdefault(e["step"], {"step": e["step"], "elements": 0, "nonzero": 0, "flushed": 0,
                                           "finite": 0, "overflowed": 0})
            for k in ("elements", "nonzero", "flushed", "finite", "overflowed"):
                t[k] += int(e.get(k) or 0)
    table = [per[k] for k in sorted(per)]
    for t in table:
        t["flushed_share"] = t["flushed"] / t["nonzero"] if t["nonzero"] else 0.0
    where = ("DDP's communication hook (each bucket divided by the world size, cast to the reduce dtype)"
             if opts["wrap"] == "ddp" else "FSDP2's reduce-scatter copy-in (each gradient cast to the reduce dtype "
                                           "and pre-divided)")
    return {"dtype": opts["reduce_dtype"], "measured_at": where, "steps": table, "error": error,
            "worst_flushed_share": max((t["flushed_share"] for t in table), default=0.0),
            "overflowed": sum(t["overflowed"] for t in table)}


def reduction_findings(reduction: dict, opts: dict) -> list[Finding]:
    """AMP277: the reduce dtype loses the gradients (underflow share, or overflow to inf)."""
    worst = reduction["worst_flushed_share"]
    inf = reduction["overflowed"]
    if worst < UNDERFLOW_SHARE and not inf:
        return []
    step = max(reduction["steps"], key=lambda t: (t["flushed_share"], t["overflowed"]))
    parts = []
    if worst >= UNDERFLOW_SHARE:
        parts.append(f"{worst:.1%} of the non-zero gradient elements become zero (step {step['step']})")
    if inf:
        parts.append(f"{inf} finite gradient elements become inf")
    scaled = opts["param_dtype"] == "float16"
    return [Finding(REDUCE_UNDERFLOW[0], REDUCE_UNDERFLOW[1], Severity.WARNING,
                    f"reducing gradients in {opts['reduce_dtype']} ({opts['wrap'].upper()}, "
                    f"{opts['nproc']} ranks): " + "; ".join(parts) + f", measured at {reduction['measured_at']}"
                    + (" after loss scaling" if scaled else " with no loss scaling"),
                    "Reduce in float32 (reduce_dtype=torch.float32; for DDP drop the compression hook) or "
                    "bfloat16" + ("" if scaled else ", or scale the loss with a GradScaler"),
                    Location(), "fp16" if opts["reduce_dtype"] == "float16" else None,
                    {"check": "distributed", "reduction": {k: v for k, v in reduction.items() if k != "steps"},
                     "step": step["step"]})]


def nonfinite_findings(raws: list[dict]) -> list[Finding]:
    """AMP278: a step that went through with non-finite loss or gradients (nothing skipped it)."""
    hits = [(s["step"], r) for r, raw in enumerate(raws) for s in raw.get("series") or []
            if s.get("stepped_nonfinite") or (s.get("loss") in ("nan", "inf") and not s.get("skipped"))]
    if not hits:
        return []
    step = min(h[0] for h in hits)
    ranks = sorted({r for s, r in hits if s == step})
    return [Finding(NONFINITE[0], NONFINITE[1], Severity.ERROR,
                    f"step {step} went through with non-finite loss or gradients on rank{'s' if len(ranks) > 1 else ''} "
                    f"{', '.join(map(str, ranks))} and no GradScaler skipped it: the parameters are now non-finite",
                    "Find the module that makes it with `check --only nan` (one process), then keep it in float32 or "
                    "train in bfloat16; with float16 compute, use a GradScaler",
                    Location(), None, {"check": "distributed", "step": step, "ranks": ranks})]


def render_text(result: dict) -> str:
    d = result.get("distributed") or {}
    pol = d.get("policy") or {}
    lines = [f"check --nproc {d.get('nproc')}: {result.get('spec', {}).get('source')} wrapped in {str(d.get('wrap')).upper()} "
             f"(compute {pol.get('param_dtype')}, reduce {pol.get('reduce_dtype')}) on {d.get('backend') or '?'}", ""]
    findings = result.get("findings") or []
    for f in findings:
        lines.append(f"{f['severity'].upper():7} {f['rule']} {f['name']}")
        lines.append(f"        {f['message']}")
        if f.get("suggestion"):
            lines.append(f"        fix: {f['suggestion']}")
    if not findings:
        lines.append("No findings: the ranks agreed on every step and the reduction kept the gradients.")
    lines += ["", "Per rank:"]
    for r in d.get("ranks") or []:
        lines.append(f"  rank {r['rank']}: {r['status']}, {r['steps']} steps, skipped "
                     f"{', '.join(map(str, r['skipped_steps'])) or 'none'}, loss scale "
                     f"{r['final_scale'] if r['final_scale'] is not None else '-'}"
                     + (f", own gradients non-finite at steps {', '.join(map(str, r['locally_nonfinite_steps']))}"
                        if r.get("locally_nonfinite_steps") else "") + (f" ({r['error']})" if r.get("error") else ""))
    red = d.get("reduction") or {}
    if red.get("steps"):
        lines.append(f"Reduction in {red.get('dtype')}: at most {red.get('worst_flushed_share', 0):.2%} of non-zero "
                     f"gradient elements flushed to zero, {red.get('overflowed', 0)} made inf ({red.get('measured_at')})")
    for e in (result.get("errors") or {}).values():
        lines.append(f"error: {e['message']}")
    return "\n".join(lines)
