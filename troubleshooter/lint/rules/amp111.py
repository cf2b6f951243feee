"""AMP111 half-precision-master-weights."""
import ast

from ..analysis import BACKWARD, names_in
from .base import Hit, Rule


def optimized_names(m) -> set[str]:
    """Names that feed an optimizer's parameter list (one level through simple assignments)."""
    out: set[str] = set()
    for ctors in m.optimizer_ctor.values():
        for c in ctors:
            args = list(c.args[:1]) + [k.value for k in c.keywords if k.arg in {"params", "model", "model_or_params"}]
            for a in args:
                found = names_in(a)
                for n in list(found):
                    if n in m.consts:
                        found |= names_in(m.consts[n])
                out |= found
    return out


def trained_half_models(m) -> dict[str, ast.AST]:
    if not any(e.kind == BACKWARD for s in m.scopes for e in s.events):
        return {}
    opt_names = optimized_names(m)
    return {k: node for k, node in m.halved.items() if k in opt_names and k not in m.frozen}


class HalfPrecisionMasterWeights(Rule):
    id = "AMP111"
    name = "half-precision-master-weights"
    severity = "error"
    summary = "Training a model converted with `.half()` / `.to(torch.float16 or bfloat16)`: no float32 master weights."
    why = ("Mixed precision keeps the weights in float32 and computes in half precision. With half weights, "
           "updates smaller than the weight's precision (lr x grad is often < 1e-3 of the weight) round to zero, "
           "so training stalls; float16 weights also overflow and underflow. Autocast + GradScaler gives the speed "
           "without this.")
    example_bad = """
model = Net().cuda().half()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
"""
    example_good = """
model = Net().cuda()  # float32 master weights
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
with torch.autocast("cuda", dtype=torch.bfloat16):
    loss = model(x)
"""
    fix = ("Keep the model in float32 and use `torch.autocast` for the forward pass (plus GradScaler for float16). "
           "Converting a frozen module (no grad, not in the optimizer) is fine.")

    def check(self, m):
        for key, node in trained_half_models(m).items():
            yield Hit.at(node, f"`{key}` is converted to half precision and then trained: the optimizer updates "
                               "half-precision weights (no float32 master copy)")
