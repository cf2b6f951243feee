"""The AMP212 finding of a silent half-precision collapse, and the folding of its consequences,
without torch: `trace` writes them in its parent process from the child's JSON, and that process
never imports torch; the `nan` check (`nanhunt`) writes them from here too. What a collapse is
and how it is found: `collapse`.
"""
from __future__ import annotations

from typing import Any

from ..findings import Finding, Location, Severity
from .module_kind import overflow_fix

COLLAPSE = ("AMP212", "half-forward-collapse")


def collapse_finding(precision: str, collapse: dict, cls: str | None, op: dict | None) -> Finding:
    """AMP212 at the module whose output collapsed, naming the op that started it when known."""
    module = collapse["module"]
    ref = collapse["reference"]
    what = "all zeros" if collapse["zero"] else f"one constant value ({collapse['value']})"
    name = f"'{module or '<root>'}'" + (f" ({cls})" if cls else "")
    message = (f"{name} outputs {what} under {precision} while in fp32 its output ranges over "
               f"[{ref['min']}, {ref['max']}]: a silent collapse (no NaN/Inf leaves the module and the loss stays "
               "finite), so the model learns from a flat activation")
    data: dict[str, Any] = {"collapse": collapse}
    if op is not None:
        at = op.get("where") or {}
        line = f" ({_short(at['path'])}:{at['line']}, in {at['function']})" if at.get("path") else ""
        data["op"] = {k: op[k] for k in ("op", "kind", "dtype", "finite", "min", "max", "reference")} | {"where": at}
        if op["kind"] == "overflow":
            message += (f"; it starts at {op['op']}{line}, whose {op['dtype']} output is non-finite while in fp32 it "
                        f"peaks at {max(abs(op['reference']['min']), abs(op['reference']['max'])):g} (float16's "
                        "largest value is 65504), and the ops after it turn that into a flat output")
        elif op["kind"] == "underflow":
            message += (f"; it starts at {op['op']}{line}, whose values in fp32 stay below float16's smallest "
                        "subnormal (6e-8) and become 0")
        else:
            message += f"; it starts at {op['op']}{line}, whose {op['dtype']} output is already constant"
    else:
        data["op"] = None
        message += "; the op inside it that starts it could not be told"
    if op is not None and op["kind"] == "overflow":
        fix = overflow_fix(module, cls)
    elif op is not None and op["kind"] == "underflow":
        fix = (f"Keep '{module or '<root>'}' in float32 (autocast enabled=False with .float() inputs) or scale its "
               "values up before this op (bf16 keeps float32's range).")
    else:
        fix = (f"Keep '{module or '<root>'}' in float32 (autocast enabled=False with .float() inputs), or compute "
               "the reduction that flattens it in float32.")
    return Finding(COLLAPSE[0], COLLAPSE[1], Severity.ERROR, message, fix, Location(module=module), precision, data)


def _short(path: str) -> str:
    from ..trace.locate import short_path

    return short_path(path)


def is_collapse_candidate(section: dict) -> bool:
    """A precision whose run was finite (a non-finite one has its own finding)."""
    return (isinstance(section, dict) and not section.get("error") and not section.get("not_run")
            and section.get("first_forward") is None and section.get("loss_finite") is not False
            and section.get("steps_run"))


def _inside(module: str | None, parent: str) -> bool:
    return module is not None and (module == parent or not parent or module.startswith(parent + "."))


def fold_consequences(findings: list[Finding]) -> list[Finding]:
    """One finding per fault: a non-finite backward (AMP206) in the module whose forward collapsed,
    in the same precision, is that collapse's consequence (the inf the forward swallowed returns
    as NaN gradients), so it is folded into the AMP212 finding."""
    collapses = [f for f in findings if f.rule == COLLAPSE[0]]
    folded: dict[int, list[Finding]] = {}
    out = []
    for f in findings:
        owner = next((c for c in collapses if f.rule == "AMP206" and f.precision == c.precision
                      and _inside(f.location.module, c.location.module or "")), None)
        if owner is None:
            out.append(f)
        else:
            folded.setdefault(id(owner), []).append(f)
    result = []
    for f in out:
        extra = folded.get(id(f))
        if extra:
            f = Finding(f.rule, f.name, f.severity,
                        f"{f.message}; its backward then makes non-finite gradients ({extra[0].rule}, a consequence)",
                        f.suggestion, f.location, f.precision,
                        {**f.data, "consequences": [{"rule": e.rule, "module": e.location.module,
                                                     "message": e.message} for e in extra]})
        result.append(f)
    return result
