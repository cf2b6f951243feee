"""What a NaN hunt's records say, without torch: the readable text of a non-finite event and the
AMP202/AMP205/AMP206 findings built from the first non-finite forward or backward value.

Why a module of its own: `trace` builds the same findings in its parent process from the child's
JSON, and the parent never imports torch (about 1 s here, 7 s on a fresh GPU host, on every CLI
trace); `nanhunt` (the hooks, the `nan` check) imports these from here.
"""
from __future__ import annotations

import re

from ..findings import Finding, Location, Severity
from ..jsonsafe import number
from .module_kind import overflow_fix


# -- human-readable reports ------------------------------------------------------------
def _where(d: dict, *extra: str) -> str:
    if d.get("module") is None:
        return "the loss"
    name = d["module"] or "<root>"
    inside = ", ".join(x for x in (d.get("class"), *extra) if x)
    return f"module '{name}' ({inside})" if inside else f"module '{name}'"


def _shown(d: dict) -> str:
    """The non-finite value as the user should read it: -inf stays -inf (kind alone says "inf")."""
    return d.get("value") or d["kind"]


def _a(kind: str) -> str:
    return f"an {kind}" if kind[:1] in "aeiou" else f"a {kind}"


def _describe_forward(d: dict) -> str:
    extra = [d.get("dtype") and f"{d['dtype']} output", d.get("autocast") and f"autocast {d['autocast']}"]
    text = f"forward: {_where(d, *extra)} outputs {_shown(d)}"
    if d.get("occurrence", 1) > 1:
        text += f" on call {d['occurrence']} of this module"
    if d.get("created"):
        ins = ", ".join(str(x) for x in d.get("input_max_abs", [])) or "none"
        text += f"; its inputs were finite (max |x| {ins}), so it creates the {_shown(d)}"
    else:
        text += f"; its inputs were already non-finite ({d.get('source', 'made outside any module')})"
    return text


def _describe_backward(d: dict) -> str:
    kind = _shown(d)
    if d.get("grad_of") == "loss":
        return f"backward: the loss's gradient w.r.t. the model output, made by {_where(d)}, is {kind}"
    if d.get("grad_of") == "parameter":
        return f"backward: the gradient of parameter '{d['parameter']}' of {_where(d)} is {kind}"
    outs = d.get("grad_output_max_abs") or []
    came = f"finite output gradients (max |g| {max(outs, key=float)})" if outs else "its output gradient"
    if d.get("grad_of") == "forward code":
        return (f"backward: code in the forward() of {_where(d)} turns {came} into {_a(kind)} gradient "
                f"for submodule '{d.get('grad_input_from')}'")
    return f"backward: {_where(d)} turns {came} into {_a(kind)} gradient w.r.t. its input"


def format_event(event: dict) -> str:
    """One readable paragraph for a step's non-finite report (what `NonFiniteError` says)."""
    parts = [f"nanhunt step {event['step']}:"]
    if event.get("skipped"):
        parts.append("scaled gradients are non-finite, so GradScaler skips this step and lowers its "
                     "scale (normal in fp16 while the scale calibrates; a problem only if it persists) -")
    elif event.get("persistent"):
        parts.append(f"scaled gradients have been non-finite for {event['consecutive']} steps in a row, "
                     "more than GradScaler's calibration explains -")
    if event.get("forward"):
        parts.append(_describe_forward(event["forward"]) + ".")
    if event.get("backward"):
        b = _describe_backward(event["backward"])
        if event.get("forward"):
            b += " (a consequence of the forward non-finite)"
        parts.append(b + ".")
    return " ".join(parts)



def section_summary(section: dict) -> str:
    """One line for the report table: what this precision's run found first."""
    if section.get("error"):
        return f"did not run: {section['error']}"
    if section["first_forward"] is not None:
        return _describe_forward(section["first_forward"])
    if not section["loss_finite"]:
        return "forward: every module output is finite but the loss is not"
    if section["first_backward"] is not None:
        return _describe_backward(section["first_backward"])
    if section.get("scaled_backward") is not None:
        return (f"finite; the scaled backward overflowed at loss scale {section['scaled_backward']['loss_scale']:g} "
                f"in {section['skipped_steps']} step(s), which GradScaler skips (it lowers the scale)")
    return "every module output and gradient is finite"


# -- findings --------------------------------------------------------------------------
_REFERENCES = ("fp32", "tf32", "bf16")


def _reference_call(traces: dict, precision: str, step: int, index: int, module: str) -> dict | None:
    """The same call in a wider-range precision at the same step, when it ran there."""
    for ref in _REFERENCES:
        if ref == precision or ref not in traces or len(traces[ref]) <= step:
            continue
        calls = traces[ref][step]
        if index < len(calls) and calls[index]["module"] == module:
            return {"precision": ref, **calls[index]}
    return None


def hunt_findings(sections: dict, traces: dict) -> list[Finding]:
    out: list[Finding] = []
    for p, s in sections.items():
        if s.get("not_run"):  # cut by the budget: nothing measured, nothing to say (errors.nan says it)
            continue
        ff, fb = s.get("first_forward"), s.get("first_backward")
        if ff is not None or not s.get("loss_finite", True):
            f = forward_finding(p, s, ff, traces)
        elif fb is not None:
            f = backward_finding(p, s, fb)
        else:
            continue
        shared = _shared_with_fp32(p, f, sections)
        if shared:
            f = _not_a_precision_problem(f, shared)
        elif p == "fp32":
            f = Finding(f.rule, f.name, f.severity, f.message, _MODEL_BUG_FP32 + f.suggestion, f.location,
                        f.precision, {**f.data, "precision_problem": False})
        out.append(f)
    return out


def _fp32_event(sections: dict) -> tuple[str, str | None] | None:
    """('forward'|'backward', module) of fp32's first non-finite value, when fp32 has one."""
    s = sections.get("fp32")
    if not isinstance(s, dict) or s.get("error"):
        return None
    if s.get("first_forward") is not None or not s.get("loss_finite", True):
        return "forward", blamed_module(s.get("first_forward"))
    if s.get("first_backward") is not None:
        return "backward", s["first_backward"].get("module")
    return None


def _shared_with_fp32(p: str, f: Finding, sections: dict) -> dict | None:
    """fp32 shows the same non-finite value (same pass, same module) as precision `p`."""
    if p == "fp32":
        return None
    ref = _fp32_event(sections)
    if ref is None:
        return None
    direction = "backward" if f.rule == "AMP206" else "forward"
    if ref != (direction, f.location.module):
        return None
    return {"precision": "fp32", "pass": direction, "module": f.location.module}


_MODEL_BUG = ("This happens in fp32 too, so it is a model or data bug, not a precision problem; bf16 or "
              "keeping a module in float32 will not cure it. ")


_MODEL_BUG_FP32 = "In fp32 this is a model or data bug, not a precision problem. "


def _fix_text(f: Finding) -> str:
    if f.rule == "AMP206":
        return ("Look for an operation whose derivative is infinite at the values seen: sqrt or pow(x, <1) at 0 "
                "(an L2 norm of an all-zero padding row: use torch.linalg.vector_norm or sqrt(x + eps)), log "
                "near 0, division by a small number; add an eps or mask the padding.")
    return ("Guard the operation that makes it: division by a zero norm (padding rows: mask them or clamp "
            "the norm with an eps), log/sqrt of non-positive values, inf - inf, weights or inputs that are "
            "already non-finite; check the data feeding it.")


def _not_a_precision_problem(f: Finding, shared: dict) -> Finding:
    """The same finding, saying it is shared with fp32 and dropping any half-precision cure."""
    where = "the loss" if f.location.module is None else f"module '{f.location.module}'"
    return Finding(f.rule, f.name, f.severity,
                   f"{f.message}; fp32 shows the same non-finite value at {where}: a model or data bug, "
                   "not a precision problem",
                   _MODEL_BUG + (f.suggestion if f.rule == "AMP205" and f.location.module is None else _fix_text(f)),
                   f.location, f.precision,
                   {**f.data, "also_in_fp32": shared, "precision_problem": False})


_MADE_IN = re.compile(r"code in the forward\(\) of '([^']+)' \(")


def made_by(fwd: dict | None) -> str | None:
    """The module whose own forward() code (not a submodule) made the first non-finite value:
    an overflowing `att += bias` in Attention.forward or `silu(gate) * up` in MLP.forward shows up
    first at the input of the next submodule, but the module that made it is the enclosing one
    ("" for the model's own forward). None when a module's output was the first non-finite value,
    or the batch was."""
    if not fwd or fwd.get("inputs_finite") is not False:
        return None
    if fwd.get("made_by"):
        return fwd["made_by"]["module"]
    m = _MADE_IN.match(str(fwd.get("source") or ""))  # a record without `made_by`
    if m is None:
        return None
    return "" if m.group(1) == "<root>" else m.group(1)


def blamed_module(fwd: dict | None) -> str | None:
    """The module a forward finding names: the maker of the value, else the first bad output."""
    maker = made_by(fwd)
    return maker if maker is not None else (fwd or {}).get("module")


def _made_in_forward_code(p: str, ff: dict, maker: str, traces: dict, reference: dict | None) -> Finding:
    """One finding at the module whose own code made the value: AMP202 when its output is finite
    in a wider-range precision (fp16's range was the problem), AMP205 otherwise; without such a
    run under fp16 an overflow is not ruled out, and the finding says so."""
    info = ff.get("made_by") or {}
    cls = info.get("class")
    ref = reference if reference is not None and reference.get("module", maker) == maker else None
    if ref is None and info.get("call_index") is not None:
        r = _reference_call(traces, p, ff.get("step", 0), info["call_index"], maker)
        if r is not None:
            ref = {"precision": r["precision"], "finite": r["finite"], "max_abs": number(r["max_abs"])}
    name = f"'{maker or '<root>'}'" + (f" ({cls})" if cls else "")
    first = ff.get("module")
    data = {"first_forward": ff, "first_nonfinite_output": first}
    value = _shown(ff)
    seen = f"first seen at the input of '{first}'"
    if p == "fp16" and ref is not None and ref.get("finite"):
        data["reference"] = {"precision": ref["precision"], "max_abs": ref.get("max_abs")}
        return Finding(
            "AMP202", "fp16-overflow", Severity.ERROR,
            f"{name} overflows float16 in the forward pass: its own forward() code makes {value} from finite "
            f"inputs under fp16 autocast ({seen}), while in {ref['precision']} its output is finite (max |x| "
            f"{ref.get('max_abs')}); float16's largest value is 65504",
            overflow_fix(maker, cls), Location(module=maker), p, data)
    message = f"{name} makes {value} in its own forward() code from finite inputs in {p} ({seen})"
    suggestion = ("Guard the operation in its forward() that makes it: clamp inputs of log/sqrt/pow/division, add "
                  "an eps, check the weights it uses.")
    if ref is not None and ref.get("finite"):
        message += f"; finite in {ref['precision']}"
        data["reference"] = {"precision": ref["precision"], "max_abs": ref.get("max_abs")}
        suggestion = (f"Keep '{maker or '<root>'}' in float32 under {p} (autocast enabled=False) or make the operation "
                      "tolerant of reduced precision (eps, clamping).")
    elif ref is None and p == "fp16":
        data["float32_check"] = "not run"
        message += (f"; the float32 check of '{maker or '<root>'}' could not run, so an fp16 overflow is not ruled "
                    "out: if it is finite with autocast off, this is AMP202 (keep it in float32 or use bf16)")
    return Finding("AMP205", "nonfinite-in-forward", Severity.ERROR, message, suggestion, Location(module=maker),
                   p, data)


def forward_finding(p: str, s: dict, ff: dict | None, traces: dict, reference: dict | None = None) -> Finding:
    """AMP202/AMP205 for the first non-finite forward value (`ff` None: only the loss is);
    `reference` is a float32 run of the module that made it, when the caller made one (trace)."""
    if ff is None:
        # Every module output is finite, the loss is not: no module is at fault (module None);
        # data names the module whose output the loss took, and the message its magnitude.
        step = s.get("failed_step") or 0
        calls = traces.get(p, [])[step] if len(traces.get(p, [])) > step else []
        made = next((c for c in reversed(calls) if c["module"] != ""), None)
        peak = f" (the model output peaks at max |x| {number(made['max_abs'])})" if made else ""
        return Finding(
            "AMP205", "nonfinite-in-forward", Severity.ERROR,
            f"the loss is {s.get('loss_kind', 'not finite')} in {p} although every module output is finite"
            f"{peak}: the loss computation overflows",
            "Check the loss function and its inputs: a log/division on model outputs or targets "
            "out of range, outputs so large their square overflows, or a loss weight so large the loss overflows.",
            Location(module=None), p, {"where": "loss", "loss_finite": False,
                                       "output_module": made["module"] if made else None},
        )
    maker = made_by(ff)
    if maker is not None:
        return _made_in_forward_code(p, ff, maker, traces, reference)
    module, step = ff["module"], ff.get("step", 0)
    ref = _reference_call(traces, p, step, ff["call_index"], module) if ff.get("created") else None
    data = {"first_forward": ff}
    where = _where(ff)
    if p == "fp16" and ff.get("created") and (ref is not None and ref["finite"] or ref is None and ff["kind"] == "inf"):
        peak = f" ({ref['precision']} peaks at max |x| {number(ref['max_abs'])})" if ref else ""
        data["reference"] = {"precision": ref["precision"], "max_abs": number(ref["max_abs"])} if ref else None
        return Finding(
            "AMP202", "fp16-overflow", Severity.ERROR,
            f"{where} overflows float16 in the forward pass: its output is {_shown(ff)} under fp16 "
            f"autocast{peak}; float16's largest value is 65504",
            overflow_fix(module, ff.get("class")), Location(module=module), p, data,
        )
    only = ""
    if ref is not None and ref["finite"]:
        only = f" (finite in {ref['precision']})"
        data["reference"] = {"precision": ref["precision"], "max_abs": number(ref["max_abs"])}
    made = "creates it from finite inputs" if ff.get("created") else "receives non-finite inputs: " + ff.get("source", "")
    suggestion = ("Guard the operation that makes it: clamp inputs of log/sqrt/pow/division, add an eps, "
                  "check weights and inputs feeding this module.")
    if only:
        suggestion = (f"Keep '{module or '<root>'}' in float32 under {p} (autocast enabled=False) or "
                      "make the operation tolerant of reduced precision (eps, clamping).")
    return Finding(
        "AMP205", "nonfinite-in-forward", Severity.ERROR,
        f"{where} outputs {_shown(ff)} in the forward pass in {p}{only}; it {made}",
        suggestion, Location(module=module), p, data,
    )


def backward_finding(p: str, s: dict, fb: dict) -> Finding:
    where = _where(fb)
    what = {"parameter": f"the gradient of its parameter '{fb.get('parameter')}'",
            "loss": "the loss's gradient w.r.t. its output (the model output)",
            "forward code": "the gradient its forward() code passes to a submodule"}.get(
        fb.get("grad_of"), "the gradient w.r.t. its input")
    unscaled = " without loss scaling" if p == "fp16" else ""
    data = {"first_backward": fb}
    if s.get("scaled_backward") is not None:
        data["scaled_backward"] = s["scaled_backward"]
    if fb.get("grad_of") == "loss":
        suggestion = ("The loss (with its weight) is too large for these gradients: lower the loss weight or "
                      "normalise the loss" + ("; in fp16 prefer bf16, whose range is float32's." if p == "fp16" else "."))
    else:
        suggestion = ("Look for operations whose derivative blows up at the values seen (sqrt or pow at 0, log "
                      "near 0, division by small numbers, large weights); add eps/clamping there"
                      + ("; in fp16 prefer bf16 or keep this module in float32." if p == "fp16" else "."))
    return Finding(
        "AMP206", "nonfinite-in-backward", Severity.ERROR,
        f"{where}: {what} is {_shown(fb)} in the backward pass in {p}{unscaled}, although the forward "
        "pass is finite",
        suggestion, Location(module=fb.get("module")), p, data,
    )
