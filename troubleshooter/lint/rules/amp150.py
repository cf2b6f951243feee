"""AMP150 half-reduce-without-scaling."""
import ast

from ..analysis import func_tail, kwarg, text
from ._distributed import qual, unmanaged_backwards
from .base import Hit, Rule

_POLICIES = {"MixedPrecision", "MixedPrecisionPolicy"}
_FP16_HOOKS = {"fp16_compress_hook", "fp16_compress_wrapper"}


class HalfReduceWithoutScaling(Rule):
    id = "AMP150"
    name = "half-reduce-without-scaling"
    severity = "warning"
    summary = ("An FSDP mixed precision policy that reduces gradients in float16 (`reduce_dtype=torch.float16`) while "
               "the model computes in another dtype, or DDP's `fp16_compress_hook`, in a file with no loss scaling.")
    why = ("The reduce-scatter / all-reduce then sums (and averages) every rank's gradients in float16: values below "
           "6e-8 flush to zero, values above 65504 become inf, and without a GradScaler nothing skips the step that "
           "got them. With bfloat16 or float32 compute the gradients themselves are fine; only their reduction "
           "loses them. (FSDP computing in float16 without any loss scaling is AMP135's case.)")
    example_bad = """
policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float16)
fully_shard(model, mp_policy=policy)
loss = model(x).mean()
loss.backward()
optimizer.step()
"""
    example_good = """
policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
fully_shard(model, mp_policy=policy)
loss = model(x).mean()
loss.backward()
optimizer.step()
"""
    fix = ("Reduce in float32 (`reduce_dtype=torch.float32`) or bfloat16; keep float16 reductions only together with "
           "loss scaling (`ShardedGradScaler` for FSDP1, `torch.amp.GradScaler` for FSDP2). For DDP, "
           "`bf16_compress_hook` keeps float32's range.")
    known_problems = ("Only policies and hooks written in this file are seen, and any GradScaler-like name in the file "
                      "counts as loss scaling. A file that builds the policy without training (a config module) gets "
                      "info: its loss scaling may live elsewhere. `fp16_compress_hook` is PyTorch's documented "
                      "bandwidth trade-off, so it is info, not a warning. float16 compute (`param_dtype=torch.float16`) "
                      "with no scaler is left to AMP135.")
    references = ("https://github.com/pytorch/pytorch/blob/v2.13.0/torch/distributed/fsdp/_fully_shard/_fsdp_api.py",
                  "https://pytorch.org/docs/stable/ddp_comm_hooks.html")

    def check(self, m):
        if m.any_scaler:
            return
        trains = bool(unmanaged_backwards(m))
        for c in m.calls_named(*_POLICIES, "register_comm_hook"):  # the only names looked at below
            t = func_tail(c)
            if t in _POLICIES and ("fsdp" in qual(m, c) or "fsdp" in m.names.alias.get(t, "")):
                reduce_dtype, param_dtype = kwarg(c, "reduce_dtype"), kwarg(c, "param_dtype")
                if m.dtype_of(reduce_dtype) != "fp16" or m.dtype_of(param_dtype) == "fp16":
                    continue
                hit = Hit.at(reduce_dtype, f"`{t}(reduce_dtype={text(reduce_dtype)})` reduces gradients in float16 "
                                           f"while the model computes in {_compute(m, param_dtype)}, and nothing in this "
                                           "file scales the loss: small gradients flush to zero in the reduction")
                yield hit if trains else hit.lowered("info")
            elif t == "register_comm_hook" and _is_fp16_hook(hook := (c.args[1] if len(c.args) >= 2 else kwarg(c, "hook"))):
                yield Hit(c.lineno, c.col_offset + 1,
                          f"`{text(hook)}` all-reduces DDP's gradients in float16 with no loss scaling in this "
                          "file: gradients below 6e-8 flush to zero and above 65504 become inf",
                          "use `bf16_compress_hook` (float32's range), or scale the loss with a GradScaler",
                          severity="info")


def _compute(m, param_dtype) -> str:
    kind = m.dtype_of(param_dtype) if param_dtype is not None else "fp32"
    return {"bf16": "bfloat16", "fp32": "float32"}.get(kind, f"`{text(param_dtype)}`")


def _is_fp16_hook(node: ast.AST | None) -> bool:
    if node is None:
        return False
    target = node.func if isinstance(node, ast.Call) else node  # fp16_compress_wrapper(hook)
    return isinstance(target, (ast.Name, ast.Attribute)) and (text(target).rsplit(".", 1)[-1] in _FP16_HOOKS)
