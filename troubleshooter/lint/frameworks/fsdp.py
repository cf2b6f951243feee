"""PyTorch FSDP: FSDP1 (`FullyShardedDataParallel(mixed_precision=MixedPrecision(...))`) and FSDP2
(`fully_shard(module, mp_policy=MixedPrecisionPolicy(...))`), and which GradScaler each needs.

Checked in torch 2.13.0:

- torch/distributed/fsdp/sharded_grad_scaler.py: `ShardedGradScaler.unscale_` unscales the local
  shard (FP16 gradients allowed) and then `dist.all_reduce`s every `found_inf`, so all ranks agree
  to skip a step. A plain `torch.amp.GradScaler` on FSDP1 checks only the rank's own shard: ranks
  disagree on skipping, their parameters and loss scales drift apart, silently. With
  `MixedPrecision(..., keep_low_precision_grads=True)` a plain GradScaler raises "Attempting to
  unscale FP16 gradients." (torch/amp/grad_scaler.py, `allow_fp16=False`).
- FSDP2 (torch/distributed/fsdp/_fully_shard): gradients are DTensors; DTensor dispatch
  (torch/distributed/tensor/_dispatch.py, `found_inf_reduce_handler`) reduces the
  `_amp_foreach_non_finite_check_and_unscale_` inf flag over the mesh, so a plain
  `torch.amp.GradScaler` is right there (accelerate 1.15 uses one for FSDP2).
- `param_dtype=torch.float16` computes in float16 from float32 sharded master weights: gradients
  need loss scaling as with float16 autocast; `param_dtype=torch.bfloat16` does not.
"""
from __future__ import annotations

import ast

from ..analysis import func_tail, kwarg, tail
from . import BF16, FP16, FP32, Setup, of
from .values import LITERAL, NOTHING, Value

NAME = "fsdp"
FRAMEWORKS = frozenset({"fsdp1", "fsdp2"})  # the names of its setups (frameworks.of)


def _policy_dtype(m, node: ast.AST | None, ctor: str) -> tuple[str, ast.AST | None]:
    """param_dtype of a MixedPrecision(...) / MixedPrecisionPolicy(...) given directly or by name."""
    if node is None:
        return "none", None
    call = node
    if isinstance(node, ast.Name):
        call = next((v for v in m.assigns.get(node.id, []) if isinstance(v, ast.Call)), None)
    if not isinstance(call, ast.Call) or func_tail(call) != ctor:
        return "unknown", None
    pd = kwarg(call, "param_dtype")
    if pd is None:
        return "none", call
    return m.dtype_of(pd), call


def _value(dtype: str, call: ast.AST | None, what: str) -> Value:
    if dtype == "unknown":
        return NOTHING
    p = {"fp16": FP16, "bf16": BF16}.get(dtype, FP32)
    line = getattr(call, "lineno", None)
    return Value((p,), LITERAL, f"{what}(param_dtype={'torch.float16' if p == FP16 else 'torch.bfloat16' if p == BF16 else 'float32'})"
                 + (f" (line {line})" if line else ""), line)


def setups(m) -> list[Setup]:
    """This framework's setups in the file (computed once, by `find`)."""
    return of(m, "fsdp1", "fsdp2")


def find(m) -> list[Setup]:
    out = []
    for c, q in m.calls_resolving(lambda last: last.endswith("FullyShardedDataParallel"), ("FSDP", "fully_shard")):
        t = func_tail(c)
        if q.endswith("FullyShardedDataParallel") or (t == "FSDP" and "fsdp" in (m.names.alias.get("FSDP") or "").lower()):
            dtype, policy = _policy_dtype(m, kwarg(c, "mixed_precision"), "MixedPrecision")
            out.append(Setup("fsdp1", c, _value(dtype, policy, "MixedPrecision"), frozenset(),
                             f"FullyShardedDataParallel(...) (line {c.lineno})", {"policy": policy}))
        elif t == "fully_shard" and ("fsdp" in q or "fully_shard" in q):
            dtype, policy = _policy_dtype(m, kwarg(c, "mp_policy"), "MixedPrecisionPolicy")
            out.append(Setup("fsdp2", c, _value(dtype, policy, "MixedPrecisionPolicy"), frozenset(),
                             f"fully_shard(...) (line {c.lineno})", {"policy": policy}))
    return out


def owner(m, recv: str | None, scope) -> Setup | None:
    return None


def plain_scalers(m) -> list[tuple[str, ast.Call]]:
    """(key, constructor) of torch GradScalers that are not ShardedGradScaler."""
    out = []
    for key, ctors in m.scaler_ctor.items():
        for c in ctors:
            if func_tail(c) == "GradScaler" or (m.names.qual(c.func) or "").endswith(".GradScaler"):
                out.append((key, c))
    return out


def sharded_scalers(m) -> list[ast.Call]:
    return [c for ctors in m.scaler_ctor.values() for c in ctors if func_tail(c) == "ShardedGradScaler"]


def scaler_keys(m) -> set[str]:
    return {tail(k) or k for k in m.scaler_ctor}
