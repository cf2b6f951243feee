"""AMP111 half-precision-master-weights."""
import ast

from ..analysis import BACKWARD, OPT_STEP, chain_base, names_in, walk
from .base import Hit, Rule


def optimized_names(m) -> set[str]:
    """Names that feed an optimizer's parameter list (one level through simple assignments)."""
    out: set[str] = set()
    for ctors in m.optimizer_ctor.values():
        for c in ctors:
            args = list(c.args[:1]) + [k.value for k in c.keywords
                                       if k.arg in {"params", "model", "model_or_params"} or k.arg is None]
            for a in args:
                found = names_in(a)
                for n in list(found):
                    if n in m.consts:
                        found |= names_in(m.consts[n])
                out |= found
    return out


def trained_half_models(m) -> dict[str, ast.AST]:
    """Half-converted models whose parameters an optimizer then trains.

    The conversion must be followed, in its own (non-export) scope, by building the optimizer or
    by a backward/optimizer step, so `model.half()` inside an export helper is not a training bug.
    """
    if not any(e.kind == BACKWARD for s in m.event_scopes for e in s.events):
        return {}
    opt_names = optimized_names(m)
    out = {}
    if _adapter_training(m):
        return {}  # a half base model with LoRA/PEFT adapters or a requires_grad filter: only adapters train
    candidates = dict(m.halved)
    for k, node in m.halved_pretrained.items():
        if not _cast_back(m, k):
            candidates.setdefault(k, node)
    for k, node in candidates.items():
        if k not in opt_names or k in m.frozen:
            continue
        scope = m.scope_of(node)
        if scope.is_eval:
            continue
        if _trains_after(m, scope, node.lineno) or (scope.name == "<module>" and _module_trains_later(m, node)):
            out[k] = node
        elif scope.name != "<module>" and _returns(scope.node, k):
            # `def make_net(): ...; net.half(); return net` and `net = make_net()` elsewhere, then trained
            for key, call_scope, line in _results_of(m, scope.name):
                if key in opt_names and key not in m.frozen and not call_scope.is_eval \
                        and _trains_after(m, call_scope, line):
                    out[k] = node
                    break
    return out


def _trains_after(m, scope, line: int) -> bool:
    """An optimizer is built, or backward/step runs, in `scope` after `line`."""
    lo, hi = scope.node.lineno if scope.name != "<module>" else 0, getattr(scope.node, "end_lineno", 10 ** 9)
    if any(lo <= c.lineno <= hi and c.lineno > line for cs in m.optimizer_ctor.values() for c in cs):
        return True
    return any(e.kind in (BACKWARD, OPT_STEP) and e.line > line for e in scope.events)


def _returns(func: ast.AST, key: str) -> bool:
    return any(isinstance(n, ast.Return) and n.value is not None and chain_base(n.value) == key for n in walk(func))


def _results_of(m, func_name: str):
    """(assigned key, scope, line) for every `x = func_name(...)` in the file."""
    for n in m.nodes:
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and chain_base(n.value.func) == func_name \
                and not isinstance(n.value.func, ast.Attribute):
            for t in n.targets:
                if isinstance(t, (ast.Name, ast.Attribute)):
                    yield (t.id if isinstance(t, ast.Name) else t.attr), m.scope_of(n), n.lineno


def _cast_back(m, key: str) -> bool:
    """`model.float()` / `model.to(torch.float32)` somewhere: the float16 load is undone before training."""
    for n in m.nodes:
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and chain_base(n.func.value) == key:
            if n.func.attr == "float":
                return True
            if n.func.attr == "to" and any(m.dtype_of(a) == "fp32" for a in list(n.args) + [k.value for k in n.keywords]):
                return True
    return False


def _adapter_training(m) -> bool:
    """Only some parameters train: PEFT/LoRA adapters, or an optimizer fed a `requires_grad` filter."""
    if any(("lora" in i or "peft" in i or "adapter" in i or "kbit" in i) for i in m.identifiers):
        return True
    for ctors in m.optimizer_ctor.values():
        for c in ctors:
            for a in list(c.args[:1]) + [k.value for k in c.keywords if k.arg == "params"]:
                if any(isinstance(n, ast.Attribute) and n.attr == "requires_grad" for n in walk(a)):
                    return True
    return False


def _module_trains_later(m, node) -> bool:
    """Module-level conversion before a training function is called at module level."""
    return any(e.line > node.lineno for e in m.scopes[0].events) or any(
        isinstance(n, ast.Call) and getattr(n, "lineno", 0) > node.lineno and
        any(s.of(BACKWARD) for s in m.by_name.get(getattr(n.func, "id", getattr(n.func, "attr", "")), []))
        for n in m.tree.body for n in walk(n) if isinstance(n, ast.Call))


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

    known_problems = "Deliberate pure-fp16 training with a hand-written master copy (apex O2 style, guided-diffusion's `MixedPrecisionTrainer`) keeps float32 masters in a separate list; the rule skips conversions followed by a float32 copy it can see, and frozen or adapter-only (LoRA) models."
    references = ('https://pytorch.org/docs/stable/notes/amp_examples.html', 'https://pytorch.org/docs/stable/amp.html')

    def check(self, m):
        for key, node in trained_half_models(m).items():
            yield Hit.at(node, f"`{key}` is converted to half precision and then trained: the optimizer updates "
                               "half-precision weights (no float32 master copy)")
