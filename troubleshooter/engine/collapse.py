"""Silent half-precision collapses: a module whose output is all zeros, or one constant value,
in float16/bfloat16 while in float32 it varies (AMP212), and the op inside it that starts it.

Why: nothing goes non-finite, so neither the NaN hunt nor GradScaler notices. An RMSNorm whose
`mean(x * x)` overflows float16 turns `rsqrt(inf)` into 0 and outputs zeros; a hand-written
softmax whose `sum(exp(x))` overflows divides by inf and every weight becomes 0. The loss stays
finite and the model trains on nothing.

How: the NaN hunt's per-call records carry each module output's min and max in every precision
(one seeded step, same weights and batch). The first call whose half-precision output is constant
(min == max) while float32's spreads (by more than 1% of its magnitude, so rounding alone cannot
explain it) is the collapse. Then that module's forward is run once more in each precision with
a `TorchFunctionMode` recording every op it calls (output finite, min, max, the user's line):
the first op whose half-precision output is non-finite, or constant, where float32's is not, is
named (an overflow that a later op swallows: `x * x` -> inf -> `rsqrt` -> 0).
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ..findings import Finding, Location, Severity
from .module_kind import overflow_fix
from .nanhooks import number

COLLAPSE = ("AMP212", "half-forward-collapse")
RELATIVE_SPREAD = 1e-2  # float32's output must vary by more than this share of its magnitude
FP16_TINY = 2.0 ** -24
MAX_OPS = 512


def first_collapse(half: list[dict], ref: list[dict]) -> dict | None:
    """The first call (same order, same module) whose half-precision output is constant where the
    float32 one spreads; None when the runs diverge, go non-finite (another finding) or never do."""
    seen: dict[str, int] = {}
    for i, (h, r) in enumerate(zip(half, ref)):
        if h["module"] != r["module"]:
            return None
        seen[h["module"]] = seen.get(h["module"], 0) + 1
        if not (h.get("finite") and r.get("finite")):
            return None
        if not h.get("constant") or r.get("constant") or "min" not in r:
            continue
        if r["max"] - r["min"] <= RELATIVE_SPREAD * r["max_abs"]:
            continue  # rounding to half precision alone could make these equal
        return {"index": i, "module": h["module"], "occurrence": seen[h["module"]], "value": number(h["min"]),
                "zero": h["max_abs"] == 0, "reference": {"min": number(r["min"]), "max": number(r["max"]),
                                                         "max_abs": number(r["max_abs"])}}
    return None


class OpTape(TorchFunctionMode):
    """Every torch function called while it is on, with its output's finiteness, min and max and
    the innermost line of the user's code (a one-off diagnostic run: it syncs per op)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[dict] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if getattr(func, "__name__", "") == "__get__" or len(self.ops) >= MAX_OPS:
            return out
        t = next((x for x in (out if isinstance(out, (tuple, list)) else (out,))
                  if isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel()), None)
        if t is not None:
            with torch.no_grad():
                d = t.detach().float()
                lo, hi = (float(v) for v in torch.aminmax(d))
                finite = bool(torch.isfinite(d).all())
            self.ops.append({"op": op_name(func), "where": _user_line(), "dtype": str(t.dtype).replace("torch.", ""),
                             "finite": finite, "min": lo, "max": hi})
        return out


def op_name(func) -> str:
    """`torch.exp`, `Tensor.__mul__`, `F.softmax`: how a user would recognise the call."""
    name = getattr(func, "__name__", None) or repr(func)
    qual = getattr(func, "__qualname__", "") or ""
    if qual.startswith("TensorBase.") or qual.startswith("Tensor."):
        return "Tensor." + name
    module = getattr(func, "__module__", None) or ""
    if module.startswith("torch.nn.functional"):
        return "F." + name
    return f"torch.{name}" if module.startswith("torch") else name


def _user_line() -> dict | None:
    from ..trace.outside import _user_frame  # the innermost line of the user's own files

    path, line, function = _user_frame(3)
    return {"path": path, "line": line, "function": function} if path else None


def record_module_ops(model: nn.Module, name: str, occurrence: int, forward: Callable[[], Any]) -> list[dict]:
    """The ops of call number `occurrence` of submodule `name` while `forward()` runs the model."""
    target = model.get_submodule(name) if name else model
    tape, calls = OpTape(), [0]

    def pre(module, args):
        calls[0] += 1
        if calls[0] == occurrence:
            tape.__enter__()

    def post(module, args, output):
        if calls[0] == occurrence:
            tape.__exit__(None, None, None)

    handles = [target.register_forward_pre_hook(pre), target.register_forward_hook(post)]
    try:
        with torch.no_grad():
            forward()
    finally:
        for h in handles:
            h.remove()
    return tape.ops


def _spreads(op: dict) -> bool:
    return op["finite"] and op["max"] - op["min"] > RELATIVE_SPREAD * max(abs(op["min"]), abs(op["max"]))


def first_bad_op(half: list[dict], ref: list[dict]) -> dict | None:
    """The first op whose half-precision output is non-finite, or constant, where float32's is
    finite and varies (same op at the same place in both runs)."""
    for h, r in zip(half, ref):
        if h["op"] != r["op"]:
            return None
        if not r["finite"]:
            continue
        if not h["finite"] or (h["min"] == h["max"] and _spreads(r)):
            tiny = max(abs(r["min"]), abs(r["max"])) < FP16_TINY
            if not h["finite"]:
                kind = "overflow"
            else:
                kind = "underflow" if h["max"] == 0 == h["min"] and tiny else "constant"
            reference = {"min": number(r["min"]), "max": number(r["max"]), "dtype": r["dtype"]}
            return {**h, "kind": kind, "reference": reference}
    return None


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
