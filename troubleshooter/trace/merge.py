"""`trace --nproc N`: one report out of N ranks' traces.

Each rank's child result goes through the single-process pipeline (`trace_script(raw=...)`), so a
rank's findings mean what they mean for one process. This module then adds what only several ranks
show, runtime ids AMP270-AMP276:

| id | name | severity | seen when |
| --- | --- | --- | --- |
| AMP270 | ranks-disagree-on-skip | error | GradScaler skipped a step on some ranks and not on others (or their loss scales differ) |
| AMP271 | half-gradients-unscaled | warning (info for a DDP compression hook) | gradients computed or reduced in float16 while no enabled GradScaler scaled them |
| AMP272 | accumulation-syncs-every-micro-step | warning | several micro-steps per optimizer step, more than one of them reduced gradients |
| AMP273 | step-on-unsynced-gradients | error | the last micro-step before an optimizer step had gradient sync off |
| AMP274 | rank-failed | error | a rank raised, exited non-zero or died; the others were stopped |
| AMP275 | rank-hung | warning | ranks still running at the time limit, each named with where it was |
| AMP276 | backend-substituted | info | the script asked for nccl on a host without CUDA: gloo ran |

The merged report keeps the single-process contract (rank 0's report, the findings of every rank
merged, one per rule and place, with the ranks that saw it) and adds `distributed`: the launcher,
a row per rank, the per-step skip decisions and loss scales of every rank, the reductions and
their dtypes, the gradient sync of every micro-step and the FSDP policy in effect per module.
"""
from __future__ import annotations

import os
import re
from typing import Any, Callable

from ..findings import Finding, Location, Severity, sort_key
from ..jsonsafe import jsonable
from .locate import short_path
from .report import _first_step

SEEN = "seen at run time"
RANK_SKIP_DISAGREE = ("AMP270", "ranks-disagree-on-skip")
HALF_GRADIENTS_UNSCALED = ("AMP271", "half-gradients-unscaled")
SYNC_EVERY_MICRO_STEP = ("AMP272", "accumulation-syncs-every-micro-step")
STEP_WITHOUT_SYNC = ("AMP273", "step-on-unsynced-gradients")
RANK_FAILED = ("AMP274", "rank-failed")
RANK_HUNG = ("AMP275", "rank-hung")
BACKEND_SUBSTITUTED = ("AMP276", "backend-substituted")
# how a rank's collective fails when its peer process is gone (gloo on a CPU host): a consequence
PEER_GONE = re.compile(r"connection (closed|reset) by peer|broken pipe|read error|write error|"
                       r"gloo.*(timeout|timed out|socket)|nccl.*(abort|remote)", re.I)
HALF = ("float16",)


def trace_ranks(trace_one: Callable[..., dict], script, args, steps: int, device: str, timeout_s: float,
                nan: bool, headroom: bool, cwd: str | None, nproc: int, progress=None,
                autocast_policy: str = "cuda", steady: bool = True) -> dict:
    """Launch N ranks of the traced child (`torchrun.run_ranks`), report each (`trace_one(raw=...)`), merge."""
    from ..torchrun import check_nproc, run_ranks
    from .runner import validate_script

    nproc = check_nproc(nproc, device)
    path = validate_script(script, cwd)
    if progress is not None:
        progress(0.0, f"starting {os.fspath(script)} on {nproc} ranks")
    config = {"script": str(path.resolve()), "argv0": os.fspath(script), "args": [str(a) for a in args],
              "steps": steps, "nan": nan, "headroom": headroom,
              "autocast_policy": autocast_policy, "steady": steady}  # what trace/child.py reads, as runner.run_child writes it
    launched = run_ranks("troubleshooter.trace.child", config, nproc, timeout_s, cwd or str(path.parent), device,
                         steps, progress)
    reports = [trace_one(script, args, steps=steps, device=device, timeout_s=timeout_s, nan=nan, headroom=headroom,
                         cwd=cwd, autocast_policy=autocast_policy, raw=raw) for raw in launched["ranks"]]
    out = merge(os.fspath(script), [os.fspath(script), *map(str, args)], launched, reports)
    if progress is not None:
        progress(1.0, "trace finished")
    return out


# -- the merged report ----------------------------------------------------------------------------
def merge(script: str, argv: list[str], launched: dict, reports: list[dict]) -> dict:
    raws = launched["ranks"]
    launcher = launched["launcher"]
    cause = _cause(raws, reports)
    rows = [_rank_row(r, raw, rep, cause) for r, (raw, rep) in enumerate(zip(raws, reports))]
    steps = _step_table(raws)
    findings = _merged_rank_findings(reports, rows)
    disagreement = disagreement_findings(steps, raws)
    findings = _without_unchecked_overflow(findings, disagreement)
    findings += disagreement
    findings += unscaled_half_findings(raws)
    findings += sync_findings(raws)
    findings += failure_findings(rows, launcher)
    findings += backend_findings(raws)
    fsdp = _fsdp(raws)
    precision, findings = _fsdp_compute(reports[0].get("precision") or {} if reports else {}, fsdp, findings)
    findings.sort(key=lambda f: (-f.severity.rank, *sort_key(f)))
    base = dict(reports[0]) if reports else {}
    base.update(script=script, argv=argv, findings=[{**f.to_dict(), "step": _first_step(f)} for f in findings],
                exit=_overall_exit(rows, reports), precision=precision)
    base["distributed"] = {
        "nproc": launcher["nproc"], "launcher": {k: launcher[k] for k in ("command", "returncode", "timed_out", "timeout_s", "wall_s",
                                                                          "pids", "leftover_processes", "stderr_tail")},
        "backend": _first(raws, "backend"), "ranks": rows, "steps": steps,
        "reductions": _reductions(raws), "ddp": _ddp(raws), "fsdp": fsdp, "gradient_sync": _sync_table(raws)}
    return jsonable(base)


def _dist(raw: dict) -> dict:
    return raw.get("distributed") or {}


def _first(raws: list[dict], key: str) -> Any:
    return next((_dist(r).get(key) for r in raws if _dist(r).get(key)), None)


def _cause(raws: list[dict], reports: list[dict]) -> int | None:
    """The rank whose failure stopped the run: the first (by when it ended) that raised, exited or
    died for a reason of its own; a collective that lost its peer (gloo's "Connection closed by
    peer") is a consequence, unless nothing else failed."""
    failed = []
    for rank, (raw, rep) in enumerate(zip(raws, reports)):
        proc = raw.get("rank_process") or {}
        ex = rep.get("exit") or {}
        if proc.get("stopped") or ex.get("status") not in ("raised", "exited", "crashed"):
            continue
        message = (ex.get("exception") or {}).get("message") or ""
        own = not (ex.get("status") == "raised" and PEER_GONE.search(message))
        failed.append((not own, proc.get("ended_at") or float("inf"), rank))
    return min(failed)[2] if failed else None


def _fsdp_compute(precision: dict, fsdp: list[dict], findings: list[Finding]) -> tuple[dict, list[Finding]]:
    """FSDP's param_dtype is half precision without any autocast: the optimizer's float32 shards
    read as "float32", and AMP292 would say no mixed precision ran. The policy in effect says it did."""
    half = sorted({p["compute_dtype"] for p in fsdp if p.get("compute_dtype") in ("float16", "bfloat16")})
    if not half or precision.get("mixed"):
        return precision, findings
    compute = "/".join(half) + " (FSDP param_dtype)"
    rest = (precision.get("summary") or "").split("; ", 1)[1:]
    summary = "; ".join([compute + (f" on {precision['device']}" if precision.get("device") else ""), *rest])
    return ({**precision, "compute": compute, "mixed": True, "summary": summary},
            [f for f in findings if f.rule != "AMP292"])


def _rank_row(rank: int, raw: dict, report: dict, cause: int | None) -> dict:
    """How one rank ended, in words a person can act on."""
    proc = raw.get("rank_process") or {}
    ex = report.get("exit") or {}
    status, description = ex.get("status"), ex.get("description")
    first = {"rank": cause} if cause is not None else {}
    exc = ex.get("exception") or {}
    where = {"path": exc.get("path"), "line": exc.get("line")} if exc else None
    consequence = False
    doing = (proc.get("blocked") or {}).get("doing")
    if not proc.get("said_hello") and proc.get("stopped_because") == "time limit":
        doing = "still starting, before the script"
        status, description = "timeout", "was stopped by the time limit before it reached the script (still starting)"
    elif not proc.get("said_hello"):
        status, description = "not started", "never reached the script (it failed while starting)"
    elif proc.get("stopped"):
        blocked = proc.get("blocked") or {}
        why = "the time limit" if proc.get("stopped_because") == "time limit" else \
            f"rank {first.get('rank')} failed" if first else "another rank failed"
        status = "timeout" if proc.get("stopped_because") == "time limit" else "stopped"
        description = f"was stopped because of {why}" + (f", {blocked['doing']}" if blocked.get("doing") else "")
        where = {"path": blocked.get("path"), "line": blocked.get("line")} if blocked.get("path") else where
    elif proc.get("died") and status == "crashed":
        description = "died without reporting (killed, out of memory, or a crash in native code)"
    elif status == "raised" and first and first.get("rank") != rank and PEER_GONE.search(exc.get("message") or ""):
        consequence = True
        description = f"raised because rank {first['rank']} ended: its collective lost the other side"
    scale = [s for s in report.get("scale") or [] if s is not None]
    return {"rank": rank, "pid": proc.get("pid"), "status": status, "description": description,
            "consequence": consequence, "doing": doing, "steps_observed": report.get("steps_observed"),
            "skipped_steps": report.get("skipped_steps") or [], "final_scale": scale[-1] if scale else None,
            "where": where, "exception": {"type": exc.get("type"), "message": (exc.get("message") or "")[:300]}
            if exc else None, "findings": len(report.get("findings") or [])}


def _overall_exit(rows: list[dict], reports: list[dict]) -> dict:
    """The run's exit: the first failing rank's, else rank 0's (a timeout anywhere is the run's)."""
    base = dict((reports[0] if reports else {}).get("exit") or {})
    failed = [r for r in rows if r["status"] in ("raised", "exited", "crashed", "not started") and not r["consequence"]]
    timed = [r for r in rows if r["status"] == "timeout"]
    pick = failed[0] if failed else timed[0] if timed else None
    if pick is not None:
        rep = reports[pick["rank"]] if pick["rank"] < len(reports) else {}
        base = dict(rep.get("exit") or {})
        base["status"] = "crashed" if pick["status"] == "not started" else pick["status"]
        base["description"] = f"rank {pick['rank']} {pick['description']}"
        base["rank"] = pick["rank"]
    return base


def _merged_rank_findings(reports: list[dict], rows: list[dict]) -> list[Finding]:
    """Every rank's own findings, one per (rule, place, module), with the ranks that saw it. A rank
    stopped because another failed adds no script-raised/time-limit finding of its own: AMP274 says it."""
    merged: dict[tuple, tuple[Finding, list[int]]] = {}
    for rank, report in enumerate(reports):
        row = rows[rank]
        for d in report.get("findings") or []:
            f = Finding.from_dict(d)
            if f.rule in ("AMP290", "AMP291") and (row["consequence"] or row["status"] in ("stopped", "timeout")):
                continue
            key = (f.rule, f.location.path, f.location.line, f.location.module)
            if key in merged:
                merged[key][1].append(rank)
            else:
                merged[key] = (f, [rank])
    out = []
    n = len(reports)
    for f, ranks in merged.values():
        note = "every rank" if len(ranks) == n else f"rank{'s' if len(ranks) > 1 else ''} {_ranks(ranks)}"
        message = _ONE_PROCESS.sub(f"Traced on {n} ranks here (see AMP270 for a disagreement seen)", f.message) \
            if n > 1 else f.message
        out.append(Finding(f.rule, f.name, f.severity, f"{message} [{note}]", f.suggestion, f.location, f.precision,
                           {**f.data, "ranks": ranks}))
    return out


# a single-process finding's note that its multi-rank consequence could not be seen (issue 23's AMP135)
_ONE_PROCESS = re.compile(r"This trace ran one process[^.]*(\.[^.]*could not be observed here)?\.?")


def _without_unchecked_overflow(findings: list[Finding], disagreement: list[Finding]) -> list[Finding]:
    """With --nan, a rank whose GradScaler did not skip a step the others skipped sees the overflow
    in its unsharded gradients (FSDP1 reduces them after the hooks): that is AMP270's symptom, not a
    non-finite value of its own, and its "without loss scaling" would be wrong. Folded into AMP270."""
    if not disagreement:
        return findings
    d = disagreement[0].data
    steps, stepped = set(d.get("steps") or []), set(d.get("stepped_ranks") or [])
    kept, folded = [], []
    for f in findings:
        if f.rule in ("AMP202", "AMP205", "AMP206") and f.data.get("step") in steps \
                and set(f.data.get("ranks") or []) <= stepped:
            folded.append(f.rule)
        else:
            kept.append(f)
    if folded:
        d["folded_nonfinite_findings"] = folded
    return kept


def _ranks(ranks) -> str:
    return ", ".join(str(r) for r in ranks)


# -- per-step skip decisions -------------------------------------------------------------------
def _step_table(raws: list[dict]) -> list[dict]:
    """Per step: each rank's skip decision and loss scale (scaled steps only)."""
    by_step: dict[int, dict] = {}
    for rank, raw in enumerate(raws):
        for s in raw.get("series") or []:
            if not s.get("via_scaler"):
                continue
            row = by_step.setdefault(s["step"], {"step": s["step"], "skipped": {}, "scale": {}, "scale_after": {}})
            row["skipped"][str(rank)] = bool(s.get("skipped"))
            row["scale"][str(rank)] = s.get("scale")
            row["scale_after"][str(rank)] = s.get("scale_after")
    table = [by_step[k] for k in sorted(by_step)]
    for row in table:
        row["agree"] = len(set(row["skipped"].values())) <= 1 and len(set(row["scale"].values())) <= 1
    return table


def disagreement_findings(steps: list[dict], raws: list[dict]) -> list[Finding]:
    """AMP270 at the first step where ranks disagree (skip decision or loss scale)."""
    bad = [row for row in steps if not row["agree"] and len(row["skipped"]) > 1]
    if not bad:
        return []
    first = bad[0]
    skipped = sorted(int(r) for r, v in first["skipped"].items() if v)
    stepped = sorted(int(r) for r, v in first["skipped"].items() if not v)
    if skipped and stepped:
        what = (f"ranks disagree on skipping step {first['step']}: rank{'s' if len(skipped) > 1 else ''} "
                f"{_ranks(skipped)} skipped it (inf/NaN in its gradients), rank{'s' if len(stepped) > 1 else ''} "
                f"{_ranks(stepped)} stepped")
    else:
        what = f"ranks disagree on the loss scale at step {first['step']}"
    last = bad[-1]
    after = last["scale_after"] if any(v is not None for v in last["scale_after"].values()) else last["scale"]
    scales = ", ".join(f"rank {r} {_fmt_scale(v)}" for r, v in after.items())
    fsdp1 = any(p.get("version") == 1 for raw in raws for p in _dist(raw).get("fsdp") or [])
    sharded_steps = {s for raw in raws for r in _dist(raw).get("reductions") or [] if r.get("by") == "ShardedGradScaler"
                     for s in r.get("steps") or []}  # steps whose found_inf a ShardedGradScaler all-reduced
    if fsdp1 and first["step"] not in sharded_steps:
        cause = ("a plain GradScaler on an FSDP1 model: each rank checks only its own shard of the gradients for "
                 "inf/NaN, so one rank skips while the others update their shards and their loss scales split")
        fix = ("Use `ShardedGradScaler` (torch.distributed.fsdp.sharded_grad_scaler) with FSDP1: it all-reduces "
               "found_inf so every rank skips together; or train in bfloat16 (no scaler)")
    else:
        cause = ("each rank's GradScaler looked at different gradients: something rank-local changed them after "
                 "the all-reduce (a gradient edit on some ranks, no_sync on the last micro-step, unsharded grads "
                 "checked per shard)")
        fix = ("Every rank must unscale and check the same (reduced) gradients: reduce them before "
               "scaler.unscale_/step, use ShardedGradScaler for FSDP1, and edit gradients identically on every rank")
    where = next((raw.get("scaler_step_where") for raw in raws if raw.get("scaler_step_where")), None) or {}
    data = {"seen": SEEN, "step": first["step"], "steps": [row["step"] for row in bad], "skipped_ranks": skipped,
            "stepped_ranks": stepped, "scale": first["scale"], "disagreeing_steps": len(bad), "compared_steps": len(steps)}
    return [Finding(RANK_SKIP_DISAGREE[0], RANK_SKIP_DISAGREE[1], Severity.ERROR,
                    f"{what}; {len(bad)} of {len(steps)} scaled steps disagree, loss scales after step {last['step']}: "
                    f"{scales}. Cause: {cause}",
                    fix, Location(path=where.get("path"), line=where.get("line")), "fp16", data)]


# -- reductions and their dtypes ----------------------------------------------------------------
def _reductions(raws: list[dict]) -> list[dict]:
    merged: dict[tuple, dict] = {}
    for rank, raw in enumerate(raws):
        for r in _dist(raw).get("reductions") or []:
            key = (r["op"], r["dtype"], r["by"])
            entry = merged.setdefault(key, {**r, "ranks": []})
            entry["ranks"].append(rank)
    return list(merged.values())


def _ddp(raws: list[dict]) -> list[dict]:
    """Rank 0's DDP wrappers with the dtype each all-reduces gradients in."""
    out = []
    for d in _dist(raws[0]).get("ddp") or [] if raws else []:
        hook = d.get("comm_hook") or {}
        mp = d.get("mixed_precision") or {}
        reduce = hook.get("compress_dtype") or mp.get("reduce_dtype") or mp.get("param_dtype") or d.get("param_dtype")
        how = ("its communication hook compresses gradients to " + hook["compress_dtype"]) if hook.get("compress_dtype") \
            else "its reducer all-reduces buckets in the gradients' dtype (the parameters' dtype)"
        out.append({**d, "reduce_dtype": reduce, "reduce_dtype_from": how})
    return out


def _fsdp(raws: list[dict]) -> list[dict]:
    """The FSDP policy in effect per module (rank 0's; a rank that differs is said)."""
    first = _dist(raws[0]).get("fsdp") or [] if raws else []
    others = [(_dist(raw).get("fsdp") or []) for raw in raws[1:]]
    keys = ("module", "compute_dtype", "reduce_dtype")
    sig = [tuple(p.get(k) for k in keys) for p in first]
    out = [dict(p) for p in first]
    for rank, policies in enumerate(others, start=1):
        if policies and [tuple(p.get(k) for k in keys) for p in policies] != sig:
            for p in out:
                p.setdefault("differs_on_ranks", []).append(rank)
    return out


def unscaled_half_findings(raws: list[dict]) -> list[Finding]:
    """AMP271: float16 gradients (FSDP compute or a float16 reduction) with no enabled GradScaler."""
    raw = raws[0] if raws else {}
    if not raw or int(raw.get("scaler_steps") or 0) > 0:
        return []
    out = []
    for p in _dist(raw).get("fsdp") or []:
        half_compute = p.get("compute_dtype") in HALF
        half_reduce = p.get("reduce_dtype") in HALF
        if not (half_compute or half_reduce):
            continue
        at = p.get("policy_at") or p  # the line that wrote the dtypes, else the wrap that applied them
        what = ("computes in float16 and reduces gradients in " + str(p.get("reduce_dtype")) if half_compute else
                f"computes in {p.get('compute_dtype')} but reduces gradients in float16")
        fix = ("Add loss scaling: ShardedGradScaler() for FSDP1, torch.amp.GradScaler() for FSDP2 (scale/step/update); "
               "or use bfloat16 for param_dtype and reduce_dtype") if half_compute else \
            ("Reduce in float32 (reduce_dtype=torch.float32) or bfloat16, or scale the loss with a GradScaler")
        out.append(Finding(HALF_GRADIENTS_UNSCALED[0], HALF_GRADIENTS_UNSCALED[1], Severity.WARNING,
                           f"FSDP{p.get('version')} module '{p.get('module')}' {what} with no loss scaling: gradients "
                           "below float16's smallest value (6e-8) flush to zero, above 65504 become inf, and no "
                           "GradScaler skips those steps",
                           fix, Location(path=at.get("path"), line=at.get("line")), "fp16",
                           {"seen": SEEN, "policy": p, "wrapped_at": {"path": p.get("path"), "line": p.get("line")}}))
        break  # one finding for the model: the first module whose policy does it
    for d in _ddp(raws):
        hook = d.get("comm_hook") or {}
        if hook.get("compress_dtype") in HALF:
            out.append(Finding(HALF_GRADIENTS_UNSCALED[0], HALF_GRADIENTS_UNSCALED[1], Severity.INFO,
                               f"DDP's communication hook {hook.get('name')} all-reduces gradients in float16 with no "
                               "loss scaling: gradients below 6e-8 flush to zero and above 65504 become inf (a step "
                               "nothing skips); PyTorch offers it as a bandwidth trade-off",
                               "Use bf16_compress_hook (bfloat16 keeps float32's range), or scale the loss with a "
                               "GradScaler so the compressed gradients sit inside float16's range",
                               Location(path=hook.get("path"), line=hook.get("line")), None,
                               {"seen": SEEN, "comm_hook": hook}))
    return out


# -- gradient sync over micro-steps ---------------------------------------------------------------
def _micro_steps(raw: dict) -> dict[int, list[dict]]:
    """Training forwards of the wrapped model, grouped by the optimizer step they belong to."""
    completed = int(raw.get("steps_observed") or 0)
    out: dict[int, list[dict]] = {}
    for f in _dist(raw).get("forwards") or []:
        if f["step"] < completed:
            out.setdefault(f["step"], []).append(f)
    return out


def _backwards(raw: dict, step: int) -> list[dict]:
    for rec in raw.get("timeline") or []:
        if rec.get("step") == step:
            return [e for e in rec.get("events", []) if e.get("kind") == "backward"]
    return []


def _sync_table(raws: list[dict]) -> list[dict]:
    raw = raws[0] if raws else {}
    return [{"step": step, "micro_steps": len(fw), "synced": [bool(f["sync"]) for f in fw], "kind": fw[0]["kind"]}
            for step, fw in sorted(_micro_steps(raw).items())]


def sync_findings(raws: list[dict]) -> list[Finding]:
    """AMP273 (the last micro-step before a step did not reduce) and AMP272 (several did)."""
    raw = raws[0] if raws else {}
    if len(raws) < 2 or not raw:
        return []
    unsynced, every = [], []
    for step, fw in sorted(_micro_steps(raw).items()):
        if not fw[-1]["sync"]:
            unsynced.append((step, fw))
        elif sum(1 for f in fw if f["sync"]) > 1 and len(_backwards(raw, step)) > 1:
            every.append((step, fw))  # several backwards, several of them reduced (an eval forward is not one)
    out = []
    if unsynced:
        step, fw = unsynced[0]
        last = fw[-1]
        site = last.get("sync_off") or {}
        back = _backwards(raw, step)
        at = site if site.get("path") else (back[-1] if back else last)
        out.append(Finding(
            STEP_WITHOUT_SYNC[0], STEP_WITHOUT_SYNC[1], Severity.ERROR,
            f"the optimizer stepped (step {step}) on gradients that were never reduced across ranks: the last of its "
            f"{len(fw)} micro-step(s) ran with gradient sync off"
            + (f" ({site.get('call')}() at line {site.get('line')})" if site.get("line") else "")
            + f", so each rank updates with its own gradients and the {last['kind']} replicas drift apart "
            f"({len(unsynced)} of {len(_micro_steps(raw))} steps)",
            "Keep no_sync() (or set_requires_gradient_sync(False)) for the micro-steps before the last one only: the "
            "last backward before optimizer.step() must run with sync on, it reduces the accumulated gradients",
            Location(path=at.get("path"), line=at.get("line")), None,
            {"seen": SEEN, "step": step, "steps": [s for s, _ in unsynced], "micro_steps": len(fw),
             "synced": [bool(f["sync"]) for f in fw], "wrapper": last["kind"]}))
    if every:
        step, fw = every[0]
        back = _backwards(raw, step)
        first_synced = next(i for i, f in enumerate(fw) if f["sync"])
        at = back[first_synced] if first_synced < len(back) else fw[first_synced]
        n = sum(1 for f in fw if f["sync"])
        out.append(Finding(
            SYNC_EVERY_MICRO_STEP[0], SYNC_EVERY_MICRO_STEP[1], Severity.WARNING,
            f"gradient accumulation under {fw[0]['kind']} reduced gradients across ranks on {n} of the {len(fw)} "
            f"micro-steps of step {step} ({len(every)} steps like this): only the last one needs to, the others "
            "are a full all-reduce each for nothing",
            "Run the micro-steps before the last under `with model.no_sync():` (DDP, FSDP1) or "
            "`model.set_requires_gradient_sync(False)` (FSDP2), and the last one with sync on",
            Location(path=at.get("path"), line=at.get("line")), None,
            {"seen": SEEN, "step": step, "steps": [s for s, _ in every], "micro_steps": len(fw),
             "synced": [bool(f["sync"]) for f in fw], "wrapper": fw[0]["kind"]}))
    return out


# -- failures, hangs, backend -------------------------------------------------------------------
def failure_findings(rows: list[dict], launcher: dict) -> list[Finding]:
    """AMP274 naming the rank that failed first; AMP275 naming the ranks the time limit stopped."""
    out = []
    failed = [r for r in rows if r["status"] in ("raised", "exited", "crashed", "not started") and not r["consequence"]]
    others = [r for r in rows if r not in failed]
    if failed:
        first = failed[0]
        where = first.get("where") or {}
        exc = first.get("exception") or {}
        what = f"rank {first['rank']} {first['description']}"
        if exc:
            what += f" ({exc.get('type')}: {exc.get('message', '').splitlines()[0][:200] if exc.get('message') else ''})"
        if first.get("steps_observed") is not None:
            what += f" after {first['steps_observed']} optimizer steps"
        rest = "; ".join(f"rank {r['rank']} {r['description']}" + _at(r) for r in others)
        out.append(Finding(RANK_FAILED[0], RANK_FAILED[1], Severity.ERROR,
                           what + (f"; {rest}" if rest else "") + (
                               f"; also failed: {', '.join(str(r['rank']) for r in failed[1:])}" if failed[1:] else ""),
                           "Fix the failing rank's error (its traceback is in ranks[].exception and exit); the other "
                           "ranks only stopped because it did",
                           Location(path=where.get("path"), line=where.get("line")), None,
                           {"seen": SEEN, "rank": first["rank"], "failed_ranks": [r["rank"] for r in failed],
                            "stopped_ranks": [r["rank"] for r in others if r["status"] in ("stopped", "timeout")]}))
    timed = [r for r in rows if r["status"] == "timeout"]
    if timed and not failed:
        running = [r for r in timed if r.get("doing") == "running"]
        lead = running[0] if running else timed[0]
        where = lead.get("where") or {}
        out.append(Finding(RANK_HUNG[0], RANK_HUNG[1], Severity.WARNING,
                           f"the time limit ({launcher.get('timeout_s') or 0:g} s) stopped "
                           + "; ".join(f"rank {r['rank']} after {r.get('steps_observed') or 0} steps"
                                       + (f", {r['doing']}" if r.get("doing") else "") + _at(r) for r in timed)
                           + (f": rank {_ranks(r['rank'] for r in running)} was not waiting in a collective, the "
                              "others waited for it" if running and len(running) < len(timed) else ""),
                           "If a rank is stuck, make every rank run the same collectives in the same order; otherwise "
                           "raise --timeout or lower --steps",
                           Location(path=where.get("path"), line=where.get("line")), None,
                           {"seen": SEEN, "ranks": [r["rank"] for r in timed],
                            "where": {str(r["rank"]): r.get("where") for r in timed}}))
    return out


def _at(row: dict) -> str:
    where = row.get("where") or {}
    return f" at {short_path(where['path'])}:{where['line']}" if where.get("path") else ""


def backend_findings(raws: list[dict]) -> list[Finding]:
    backend = _first(raws, "backend") or {}
    if not backend.get("substituted"):
        return []
    return [Finding(BACKEND_SUBSTITUTED[0], BACKEND_SUBSTITUTED[1], Severity.INFO,
                    f"the script asked for backend '{backend.get('asked')}'; {backend['substituted']}",
                    "Nothing to change for the GPU run; on a CPU host pick the backend by device "
                    "(\"nccl\" if torch.cuda.is_available() else \"gloo\")",
                    Location(path=backend.get("path"), line=backend.get("line")), None, {"seen": SEEN, **backend})]


# -- renderings ------------------------------------------------------------------------------------
def _fmt_scale(v) -> str:
    return f"{v:g}" if isinstance(v, (int, float)) else "-"


def rank_table(report: dict) -> list[list[str]]:
    """Header + a row per rank: rank, status, steps, skipped steps, last loss scale, where it ended."""
    rows = [["rank", "status", "steps", "skipped steps", "loss scale", "where / why"]]
    for r in (report.get("distributed") or {}).get("ranks") or []:
        where = r.get("where") or {}
        at = f"{short_path(where['path'])}:{where['line']} " if where.get("path") else ""
        rows.append([str(r["rank"]), str(r.get("status")), str(r.get("steps_observed") or 0),
                     ", ".join(map(str, r.get("skipped_steps") or [])) or "none", _fmt_scale(r.get("final_scale")),
                     (at + (r.get("description") or "")).strip()])
    return rows


def step_lines(report: dict, limit: int = 20) -> list[str]:
    """Per scaled step: each rank's decision (S skipped, . stepped) and scale, disagreements marked."""
    out = []
    for row in ((report.get("distributed") or {}).get("steps") or [])[:limit]:
        marks = " ".join(f"r{r}:{'S' if v else '.'}@{_fmt_scale(row['scale'].get(r))}" for r, v in row["skipped"].items())
        out.append(f"step {row['step']:>3}  {marks}" + ("" if row["agree"] else "   <- ranks disagree"))
    return out


def _policy_lines(report: dict) -> list[str]:
    d = report.get("distributed") or {}
    lines = []
    for p in d.get("fsdp") or []:
        dtypes = (f"compute {p.get('compute_dtype')}, reduce {p.get('reduce_dtype')}" if p.get("compute_dtype")
                  else "no parameters of its own")
        lines.append(f"FSDP{p.get('version')} '{p.get('module')}' ({p.get('class')}): {dtypes}"
                     + (f", output {p['output_dtype']}" if p.get("output_dtype") else "")
                     + (f", wrapped at {short_path(p['path'])}:{p['line']}" if p.get("path") else ""))
    for x in d.get("ddp") or []:
        lines.append(f"DDP ({x.get('module')}): gradients all-reduced in {x.get('reduce_dtype')} ({x.get('reduce_dtype_from')})"
                     + (f", wrapped at {short_path(x['path'])}:{x['line']}" if x.get("path") else ""))
    for r in d.get("reductions") or []:
        if r.get("gradients"):
            lines.append(f"{r['by']} {r['op']} in {r['dtype']} ({r['count']} calls on rank {r['ranks'][0]})")
    sync = d.get("gradient_sync") or []
    accum = [s for s in sync if s["micro_steps"] > 1]
    if accum:
        s = accum[0]
        lines.append(f"gradient accumulation: {s['micro_steps']} micro-steps per step, gradient sync per micro-step "
                     + " ".join("on" if x else "off" for x in s["synced"]))
    return lines


def render_text(report: dict, single: Callable[[dict], str]) -> str:
    """The single-process text (`single`) with a launcher line, the per-rank table and step table."""
    d = report.get("distributed") or {}
    backend = d.get("backend") or {}
    head = (f"Ran under torch.distributed.run with {d.get('nproc')} ranks"
            + (f" (backend {backend.get('used')})" if backend.get("used") else "") + ".")
    table = rank_table(report)
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table]
    parts = [head, single(report), "", "Per rank:", *lines]
    steps = step_lines(report)
    if any("S@" in s or "disagree" in s for s in steps):  # every rank stepping every step says nothing
        parts += ["", "Skip decisions per step (S skipped, . stepped, @ loss scale):", *steps]
    policy = _policy_lines(report)
    if policy:
        parts += ["", "Mixed precision under torch.distributed:", *policy]
    return "\n".join(parts)


def render_markdown(report: dict, single: Callable[[dict], str]) -> str:
    table = rank_table(report)
    md = ["| " + " | ".join(table[0]) + " |", "|" + "---|" * len(table[0])]
    md += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in table[1:]]
    parts = [single(report), "**Per rank**", "", *md]
    steps = step_lines(report)
    if any("S@" in s or "disagree" in s for s in steps):
        parts += ["", "**Skip decisions per step** (S skipped, . stepped, @ loss scale)", "", "```", *steps, "```"]
    policy = _policy_lines(report)
    if policy:
        parts += ["", "**Mixed precision under torch.distributed**", "", *[f"- {p}" for p in policy]]
    return "\n".join(parts) + "\n"
