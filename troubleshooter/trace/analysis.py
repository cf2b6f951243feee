"""Turn what the child saw into Findings: protocol violations located in the user's files,
numerics (first non-finite module, skip rate, gradient underflow) and the script's own exception.

Rule ids, names and severities come from the linter's catalogue (`lint.rules.BY_ID`) and the
engine, so a rule means the same whether it was read in the source or seen at run time.
"""
from __future__ import annotations


import math
from typing import Any

from ..engine.collapse_findings import collapse_finding, fold_consequences
from ..engine.nonfinite_findings import backward_finding, forward_finding, made_by
from ..engine.skip_summary import summarize
from ..engine.unsafe_op_findings import banned_findings
from ..findings import Finding, Location, Severity
from ..lint.rules import BY_ID
from .nonfinite_event import is_real
from .precision import not_in_effect_findings

SCRIPT_RAISED = ("AMP290", "script-raised")  # the traced script itself raised
TIME_LIMIT = ("AMP291", "trace-time-limit")  # the traced script was stopped by the time limit
UNDERFLOW_SHARE = 0.05  # AMP203 at --headroom: share of non-zero gradients lost after scaling
SEEN = "seen at run time"
MIN_SKIP_STEPS = 10  # AMP204 warns on a skip rate only over this many scaled steps (errors need fewer)


def protocol_findings(violations: list[dict]) -> list[Finding]:
    """One Finding per (rule, file, line); data keeps the steps and how often it happened."""
    grouped: dict[tuple, dict] = {}
    for v in violations:
        key = (v["rule"], v.get("path"), v.get("line"))
        g = grouped.get(key)
        if g is None:
            grouped[key] = {**v, "steps": [v["step"]], "count": 1}
        else:
            g["count"] += 1
            if v["step"] not in g["steps"] and len(g["steps"]) < 50:
                g["steps"].append(v["step"])
    out = []
    for (rule, path, line), g in grouped.items():
        spec = BY_ID.get(rule)
        data = {"seen": SEEN, "steps": g["steps"], "count": g["count"], "function": g.get("function"),
                **g.get("data", {})}
        out.append(Finding(rule, spec.name if spec else rule.lower(), spec.severity if spec else "warning",
                           f"{g['message']} (step {g['steps'][0]}{', ' + str(g['count']) + ' times' if g['count'] > 1 else ''})",
                           spec.fix if spec else "", Location(path=path, line=line), None, data))
    return out


def scheduler_note(raw: dict) -> list[Finding]:
    """AMP107 not confirmed: the scheduler follows every scaler step but no step was skipped."""
    if any(v["rule"] == "AMP107" for v in raw.get("violations", [])):
        return []
    n = raw.get("scheduler_after_scaler_steps", 0)
    if not n or any(s.get("skipped") for s in raw.get("series", [])):
        return []
    spec = BY_ID["AMP107"]
    where = raw.get("scheduler_where") or {}
    return [Finding("AMP107", spec.name, Severity.INFO,
                    f"inconclusive: the LR scheduler stepped after {n} scaler.step() calls, but GradScaler "
                    "skipped no step while traced, so whether it also steps on skipped steps was not seen",
                    spec.fix, Location(path=where.get("path"), line=where.get("line")), None,
                    {"seen": SEEN, "scheduler_steps_after_scaler": n})]


def scale_series(series: list[dict]) -> tuple[list, list[int]]:
    """Loss scale per step (None where no enabled scaler) and the steps GradScaler skipped."""
    return [s.get("scale") for s in series], [s["step"] for s in series if s.get("skipped")]


def skiprate_findings(series: list[dict], where: dict | None = None) -> list[Finding]:
    """AMP204 from the observed skip pattern, with the engine's thresholds (`skiprate.summarize`)."""
    scaled = [s for s in series if s.get("via_scaler") and s.get("scale") is not None]
    if len(scaled) < 2:
        return []
    steps, calibrating = [], True
    for s in scaled:
        calibrating = calibrating and bool(s["skipped"])
        loss = s.get("loss")
        loss = float(loss) if isinstance(loss, (int, float)) else (float(loss) if loss in ("nan", "inf", "-inf") else 0.0)
        before = float(s["scale"])
        after = s.get("scale_after")
        after = float(after) if isinstance(after, (int, float)) else before
        steps.append({"phase": "calibration" if calibrating else "training", "skipped": bool(s["skipped"]),
                      "loss": loss, "scale_before": before, "scale_after": after})
    summary, rec = summarize(steps, init_scale=steps[0]["scale_before"])
    if not rec.get("severity"):
        return []
    severity = rec["severity"]
    inconclusive = ""
    if severity == "warning" and len(steps) < MIN_SKIP_STEPS:  # a scaler may still be calibrating
        severity, inconclusive = "info", f"inconclusive after only {len(steps)} steps: "
    trajectory = [s["scale_before"] for s in steps]
    msg = (f"{inconclusive}GradScaler skipped {summary['skipped']} of {summary['steps']} traced steps "
           f"(skip rate {summary['skip_rate']:.0%}); loss scale {trajectory[0]:g} -> {summary['final_scale']:g}: "
           f"{rec['reason']}")
    suggestion = ("Train in bfloat16 where the hardware has it, or find the overflowing layer "
                  "(trace with --nan)" if rec["action"] == "bf16" else
                  f"Start the scaler where it settles: GradScaler(init_scale={rec.get('init_scale') or summary['final_scale']:g})")
    data = {"seen": SEEN, "summary": summary, "recommendation": rec, "scale_trajectory": trajectory,
            "skipped_steps": [s["step"] for s in scaled if s["skipped"]]}
    where = where or {}
    return [Finding("AMP204", "high-skip-rate", severity, msg, suggestion,
                    Location(path=where.get("path"), line=where.get("line")), "fp16", data)]


def numerics_findings(numerics: dict, series: list[dict], timeline: list[dict] | None = None) -> list[Finding]:
    """AMP202/205/206 from the first non-finite event that is not a GradScaler skip."""
    events = numerics.get("events") or []
    first = next((e for e in events if is_real(e)), None)
    outside = numerics.get("outside")
    if outside is not None and (first is None or first["step"] > outside["step"]
                                or first.get("forward") is None and first["step"] == outside["step"]):
        # the loss code made the first non-finite value from the model's finite output; a module
        # going non-finite only in a later step is a consequence, not the cause
        return [outside_finding(outside)]
    if first is None:
        return []
    p = first.get("precision") or "fp32"
    fwd, bwd = first.get("forward"), first.get("backward")
    loss = first.get("loss")
    loss_finite = not isinstance(loss, str)
    if fwd is not None or not loss_finite:
        if fwd is not None:
            fwd = {**fwd, "step": first["step"]}
        f = forward_finding(p, {"failed_step": first["step"], "loss_finite": loss_finite,
                                "loss_kind": loss if isinstance(loss, str) else None}, fwd, {},
                            reference=first.get("reference"))
    elif bwd is not None:
        f = backward_finding(p, {}, bwd)
    else:
        return []
    data = {**f.data, "seen": SEEN, "step": first["step"], "phase": "forward" if fwd is not None else "backward",
            "localised_by": {"nan": "--nan hooks on every step",
                             "re-run of the failing step": "the failing step's forward/backward re-run with "
                             "hooks before the optimizer step"}.get(
                first.get("mode"), f"hooks attached after a non-finite step, re-checking steps "
                                   f"{numerics.get('rechecked_steps')}")}
    message, suggestion = f"{f.message} (step {first['step']})", f.suggestion
    before = first.get("parameters_nonfinite_before") or []
    if before:
        data["parameters_nonfinite_before"] = before
        message += (f"; inconclusive: parameters were already non-finite when the hooks were attached "
                    f"({', '.join(before[:3])}), so an earlier step made them")
        suggestion = f"To find the step that made them, rerun with --nan. {suggestion}".strip()
    where = first.get("where") or {}
    if where.get("module") is not None and where["module"] != f.location.module:
        data["source_module"] = where["module"]  # the enclosing module whose code the user wrote
    if fwd is None and not loss_finite and where.get("path") is None:
        # every module output finite, the loss not: the loss was computed outside the model; the
        # ops that made it are not hooked, so point at that step's backward() on it
        back = _backward_of_step(timeline or [], first["step"])
        if back is not None:
            where = {"path": back["path"], "line": back["line"]}
            data["located_at"] = "the backward() of the non-finite loss; the op that made it runs before"
    location = Location(path=where.get("path"), line=where.get("line"), module=f.location.module)
    return [Finding(f.rule, f.name, f.severity, message, suggestion, location, f.precision, data)]


NONFINITE_RULES = ("AMP202", "AMP205", "AMP206", "AMP212")
STEADY_WHY = ("the step ran in steady state (after {after} identical clean steps the loss watch and the "
              "output-gradient keeper stand down until a step deviates)")


def steady_findings(numerics: dict, findings: list[Finding], timeline: list[dict]) -> list[Finding]:
    """A non-finite loss or gradient first seen on a steady-state step, where the instruments
    that would have named its op or module were standing down. Named at a later step by the
    same kind of reading (a loss op outside the model for a loss the model's re-run forward did
    not explain; a backward for gradients): that finding says where it was first seen. Otherwise a
    finding at that step's backward() that says plainly it was not localised."""
    misses = numerics.get("steady_unlocalised") or []
    if not misses:
        return findings
    miss = misses[0]
    step = miss["step"]
    why = STEADY_WHY.format(after=numerics.get("steady_after") or 3)
    loss_bad = miss.get("nonfinite") == "loss"
    nonfinite = [f for f in findings if f.rule in NONFINITE_RULES]
    if any(isinstance(f.data.get("step"), int) and f.data["step"] <= step for f in nonfinite):
        return findings  # localised on that step (a module's forward re-run) or an earlier one
    later = next((f for f in nonfinite if (f.data.get("made_outside_model") and f.data.get("phase") == "forward"
                                           if loss_bad else f.data.get("phase") == "backward" or f.rule == "AMP212")),
                 None)
    if later is not None:
        noted = Finding(later.rule, later.name, later.severity,
                        f"{later.message}; first seen at step {step}, where it was not localised: {why}",
                        later.suggestion, later.location, later.precision,
                        {**later.data, "first_seen": {"step": step, "instruments": "steady", "localised": False}})
        return [noted if f is later else f for f in findings]
    back = _backward_of_step(timeline, step) or {}
    precision = {"float16": "fp16", "bfloat16": "bf16"}.get(miss.get("autocast"), "fp32")
    what = (f"the loss of step {step} was non-finite ({miss.get('loss')})"
            if loss_bad else f"the gradients of step {step} were non-finite (the loss {miss.get('loss')} was finite)")
    data = {"seen": SEEN, "step": step, "phase": "forward" if loss_bad else "backward", "loss_finite": not loss_bad,
            "localised": False, "instruments": "steady", "standing_down": miss.get("standing_down"),
            "localised_from": "the next such step"}
    if back.get("path"):
        data["located_at"] = "the backward() of that step; the op or module that made it is not named"
    rule, name = ("AMP205", "nonfinite-in-forward") if loss_bad else ("AMP206", "nonfinite-in-backward")
    return findings + [Finding(
        rule, name, Severity.ERROR,
        f"{what}, and it was not localised: {why}; the op or module that makes it is named from the next such "
        "step on, and it did not happen again while traced",
        "Rerun with --no-steady (or --nan) to name the op or module on its first occurrence.",
        Location(path=back.get("path"), line=back.get("line")), precision, data)]


def collapse_findings(numerics: dict) -> list[Finding]:
    """AMP212 (--nan): the first step's half-precision forward flattened a module's output where
    float32's varies; located at the op that started it when it is in the user's files."""
    event = numerics.get("collapse")
    if not event:
        return []
    f = collapse_finding(event["precision"], event["collapse"], event.get("class"), event.get("op"))
    at = ((event.get("op") or {}).get("where") or {})
    where = at if at.get("path") else (event.get("where") or {})
    data = {**f.data, "seen": SEEN, "step": event.get("step"), "reference_run": event.get("reference"),
            "localised_by": "the step's forward re-run in its half precision and in float32 with --nan hooks"}
    return [Finding(f.rule, f.name, f.severity, f"{f.message} (step {event.get('step')})", f.suggestion,
                    Location(path=where.get("path"), line=where.get("line"), module=f.location.module),
                    f.precision, data)]


def outside_finding(op: dict) -> Finding:
    """AMP205 (AMP202 for a float16 overflow) at the line of the op, outside the model, that made
    the first non-finite value of the loss from finite inputs; module None: no module made it."""
    if op.get("phase") == "backward":
        return _outside_backward_finding(op)
    p, name, fn = _op_label(op)
    data = {"seen": SEEN, "step": op["step"], "phase": "forward", "where": "loss", "made_outside_model": True,
            "op": name, "function": op.get("function"), "output_dtype": op.get("dtype"), "loss_kind": op.get("loss"),
            "loss_finite": False, "localised_by": "the ops run on the model's output outside it (from its "
            "return to backward()), each checked for finite inputs and outputs"}
    if op.get("inplace"):
        data["inplace"] = True
    ref = op.get("reference") or {}
    location = Location(path=op.get("path"), line=op.get("line"), module=None)
    if op.get("dtype") == "float16" and ref.get("finite"):
        data["reference"] = {"precision": ref["precision"], "max_abs": ref.get("max_abs")}
        return Finding(
            "AMP202", "fp16-overflow", Severity.ERROR,
            f"{name}{fn} overflows float16 outside the model: its inputs are finite, its float16 output is not, "
            f"while in float32 it peaks at max |x| {ref.get('max_abs'):g}; float16's largest value is 65504 "
            f"(the loss is {op.get('loss')}, step {op['step']})",
            "Compute the loss in float32: cast the model output with .float() before this helper, or run it under "
            "torch.autocast(device_type, enabled=False); or bring the values into range (a mean instead of a sum, "
            "a smaller weight applied before squaring).", location, "fp16", data)
    return Finding(
        "AMP205", "nonfinite-in-forward", Severity.ERROR,
        f"{name}{fn} makes a non-finite value from finite inputs, outside the model, in the loss computation "
        f"({p}): the model's output is finite, the loss is {op.get('loss')} (step {op['step']})",
        "Guard the operation at this line: clamp the input of log/sqrt/pow (torch.log(p.clamp_min(eps)), or a "
        "fused stable form such as F.binary_cross_entropy_with_logits / F.log_softmax), and keep a division's "
        "denominator away from zero (x / n.clamp_min(1)).", location, p, data)


def _outside_backward_finding(op: dict) -> Finding:
    """AMP206: an op outside the model received a finite gradient and produced a non-finite one."""
    p, name, fn = _op_label(op)
    data = {"seen": SEEN, "step": op["step"], "phase": "backward", "where": "loss", "made_outside_model": True,
            "op": name, "function": op.get("function"), "output_dtype": op.get("dtype"), "loss": op.get("loss"),
            "localised_by": "gradient hooks on the ops run on the model's output outside it"}
    return Finding(
        "AMP206", "nonfinite-in-backward", Severity.ERROR,
        f"the backward of {name}{fn}, outside the model in the loss computation ({p}), turns a finite gradient "
        f"into a non-finite one while the loss itself is finite (step {op['step']}): its derivative is infinite "
        "at the values it got (sqrt or pow(x, <1) at 0, log at 0, division by ~0)",
        "Keep the op off its singular point: torch.sqrt(x + eps) or x.clamp_min(eps).sqrt(), pow on clamped "
        "inputs, or a formulation whose gradient is finite (squared distance, torch.cdist with eps).",
        Location(path=op.get("path"), line=op.get("line"), module=None), p, data)


def _op_label(op: dict) -> tuple[str, str, str]:
    """(precision, op name, " in fn()") of a loss op recorded outside the model."""
    fn = f" in {op['function']}()" if op.get("function") and op["function"] != "<module>" else ""
    return op.get("precision") or "fp32", op.get("op") or "an op", fn


def _backward_of_step(timeline: list[dict], step: int) -> dict | None:
    for rec in timeline:
        if rec.get("step") == step:
            return next((e for e in rec.get("events", []) if e.get("kind") == "backward" and e.get("path")), None)
    return None


_making_module = made_by  # where the child decided it (numerics.making_module), for the same reading here


def headroom_findings(numerics: dict, where: dict | None = None) -> list[Finding]:
    """AMP203 (--headroom): non-zero gradients the loss scale leaves below float16's smallest value."""
    steps = [s for s in numerics.get("headroom_steps") or [] if not s.get("skipped")]
    if not steps:
        return []
    worst = max(steps, key=lambda s: s["underflow_share"])
    if worst["underflow_share"] < UNDERFLOW_SHARE or not any(s.get("scale") for s in steps):
        return []
    scale = worst.get("scale")
    return [Finding("AMP203", "fp16-gradient-underflow", Severity.WARNING,
                    f"{worst['underflow_share']:.1%} of non-zero gradient elements stay below float16's "
                    f"smallest value even after loss scale {scale:g} (step {worst['step']}): they flush to zero",
                    "Raise the loss scale (GradScaler(init_scale=...) higher, growth_interval lower) or train in bf16.",
                    Location(path=(where or {}).get("path"), line=(where or {}).get("line")), "fp16",
                    {"seen": SEEN, "worst_step": worst})]


def steps_word(raw: dict) -> str:
    """What a step was in this run: an optimizer step, or (a loop without a torch.optim
    optimizer) a backward pass."""
    return "backward passes" if raw.get("step_unit") == "backward" else "optimizer steps"


def exception_finding(exc: dict, explained: list[dict], unit: str = "optimizer steps") -> Finding:
    """The script raised: where in the user's code, and what `explain` recognises in the message.
    An exception that came from this package is its own finding (AMP219), never blamed on a line
    of the script."""
    if exc.get("caused_by_tool"):
        return tool_error_finding(exc, unit)
    rule = next((m["rule"] for m in explained if m.get("rule")), None)
    cause = next((m for m in explained), None)
    msg = f"the script raised {exc['type']}: {exc['message'].splitlines()[0][:300] if exc['message'] else ''}"
    if exc.get("step") is not None:
        msg += f" (after {exc['step']} {unit})"
    if cause is not None:
        msg += f"; {cause['title']}: {cause['cause']}"
    suggestion = cause["fix"] if cause is not None else "Fix the error at the location shown (full traceback in exit.exception)."
    return Finding(SCRIPT_RAISED[0], SCRIPT_RAISED[1], Severity.ERROR, msg, suggestion,
                   Location(path=exc.get("path"), line=exc.get("line")), None,
                   {"seen": SEEN, "exception": exc["type"], "related_rule": rule, "step": exc.get("step")})


TOOL_ERROR = ("AMP219", "trace-internal-error")


def tool_error_finding(exc: dict, unit: str = "optimizer steps") -> Finding:
    """The trace itself failed while the script ran: not the script's fault, and what ran before it
    is all that was seen (inconclusive for the rest)."""
    step = exc.get("step")
    return Finding(TOOL_ERROR[0], TOOL_ERROR[1], Severity.WARNING,
                   f"the tracer failed while running the script ({exc['type']}: "
                   f"{(exc.get('message') or '').splitlines()[0][:200] if exc.get('message') else ''}): this is a "
                   "bug of the troubleshooter, not of your script; the findings cover only the "
                   f"{step if step is not None else 0} {unit} before it (inconclusive for the rest)",
                   "Run the script without the tracer to confirm it works, and report this with the tool's "
                   "traceback (exit.exception.tool_traceback in the JSON report).",
                   Location(), None, {"seen": SEEN, "exception": exc["type"], "step": step, "caused_by_tool": True})


def all_findings(raw: dict, explained: list[dict], precision: dict) -> list[Finding]:
    findings = protocol_findings(raw.get("violations") or [])
    findings += scheduler_note(raw)
    numerics = raw.get("numerics") or {}
    findings += fold_consequences(steady_findings(
        numerics, numerics_findings(numerics, raw.get("series") or [], raw.get("timeline") or [])
        + collapse_findings(numerics), raw.get("timeline") or []))
    findings += banned_findings(raw.get("autocast_policy"), SEEN)
    findings += skiprate_findings(raw.get("series") or [], raw.get("scaler_step_where"))
    findings += headroom_findings(numerics, raw.get("scaler_step_where"))
    exc = (raw.get("exit") or {}).get("exception")
    if exc:
        findings.append(exception_finding(exc, explained, steps_word(raw)))
    findings += time_limit_finding(raw)
    findings += exited_finding(raw)
    findings += not_in_effect_findings(precision)
    return findings


def exited_finding(raw: dict) -> list[Finding]:
    """sys.exit(non-zero) before N steps: usually arguments the script did not accept."""
    ex = raw.get("exit") or {}
    if ex.get("status") != "exited":
        return []
    where = ex.get("where") or {}
    tail = ((raw.get("process") or {}).get("stderr_tail") or "").strip().splitlines()[-1:] or [""]
    return [Finding(SCRIPT_RAISED[0], SCRIPT_RAISED[1], Severity.ERROR,
                    f"the script exited with status {ex.get('code')}"
                    + (f" ({ex['message']})" if ex.get("message") else "")
                    + f" after {raw.get('steps_observed') or 0} {steps_word(raw)}; last stderr line: {tail[0][:300]}",
                    "Check the arguments passed after `--` and the script's own error message (exit.stderr_tail).",
                    Location(path=where.get("path"), line=where.get("line")), None,
                    {"seen": SEEN, "exit_code": ex.get("code")})]


def time_limit_finding(raw: dict) -> list[Finding]:
    """The time limit stopped the script: everything above covers only the steps seen."""
    proc = raw.get("process") or {}
    if not proc.get("timed_out"):
        return []
    where = (raw.get("exit") or {}).get("where") or {}
    n = raw.get("steps_observed") or 0
    return [Finding(TIME_LIMIT[0], TIME_LIMIT[1], Severity.WARNING,
                    f"the script was stopped by the time limit ({proc.get('wall_s', 0):.0f} s) after {n} "
                    f"{steps_word(raw)}" + (f", while running line {where['line']}" if where.get("line") else "")
                    + "; findings cover only what ran before it (inconclusive for the rest)",
                    "Raise --timeout, lower --steps, or pass arguments that make the script reach its "
                    "training loop sooner (smaller data, fewer warm-up batches).",
                    Location(path=where.get("path"), line=where.get("line")), None,
                    {"seen": SEEN, "steps_observed": n})]


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)
