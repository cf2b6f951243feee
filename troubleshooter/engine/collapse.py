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
The AMP212 finding itself is written by `collapse_findings`, without torch (the trace parent
writes it from the child's JSON).
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from .nanhooks import number

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
