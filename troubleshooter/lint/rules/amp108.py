"""AMP108 accumulation-loss-not-normalized."""
import ast
import re

from ..analysis import names_in, text
from ..lazy_re import lazy
from ._steps import accumulations, divides_by
from .base import Hit, Rule


class AccumulationLossNotNormalized(Rule):
    id = "AMP108"
    name = "accumulation-loss-not-normalized"
    severity = "warning"
    summary = "Gradient accumulation (optimizer step every N iterations) where the loss is not divided by N."
    why = ("Accumulated gradients are summed over N micro-batches, so the update is N times larger than intended "
           "(an N-times larger learning rate), and under fp16 the summed scaled gradients overflow N times sooner, "
           "so GradScaler skips more steps.")
    example_bad = """
scaler.scale(loss).backward()
if (i + 1) % accum_steps == 0:
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
"""
    example_good = """
loss = loss / accum_steps
scaler.scale(loss).backward()
if (i + 1) % accum_steps == 0:
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
"""
    fix = "Divide the loss by the number of accumulation steps before backward: `loss = loss / accum_steps`."

    known_problems = "A loss summed over samples by design (`reduction=\"sum\"`, YOLOv5's `loss * bs`, torchtune's token-count sum with `scale_grads_` at the step) is not flagged: the sum over micro-batches is then the sum over the large batch, which the learning rate was chosen for. An accumulation count sized in samples (`accumulate = max(round(nbs / batch_size), 1)`, the YOLO family, whose loss is summed over the batch in another file) is not flagged either. A delayed update of another optimizer (TD3/DDPG: the actor's backward and step every N steps while the critic steps every iteration) is not accumulation. A normalisation done inside the model or in another file is not seen."
    references = ('https://pytorch.org/docs/stable/notes/amp_examples.html (Gradient accumulation)',)

    def check(self, m):
        for s in m.event_scopes:
            for acc in accumulations(s):
                if acc.count is None or divides_by(m, acc.count) or _summed_by_design(m) \
                        or _counted_in_samples(m, acc.count):
                    continue
                bw = next((b for b in acc.backwards if not b.managed), None)
                if bw is None:
                    continue
                n = text(acc.count)
                yield Hit.at(bw.node, f"gradients are accumulated over `{n}` micro-batches but the loss is never "
                                      f"divided by `{n}`", f"use `loss = loss / {n}` before backward")


_BATCH = lazy(r"^(bs|batch_size|batch|n_samples|num_samples|nb)$|batch_?size", re.I)


def _summed_by_design(m) -> bool:
    """The file sums its loss over samples on purpose: `reduction="sum"`, a loss multiplied by the batch
    size (`loss * bs`, or `return (lbox + lobj) * bs` in a loss function or class), or gradients divided
    at the step (`scale_grads_(params, 1 / num_tokens)`, `p.grad.div_(n)`)."""
    return m.memo.get(("amp108_summed",), lambda: _find_summed(m))


def _counted_in_samples(m, count: ast.AST) -> bool:
    """Is N a number of samples over the batch size (`accumulate = max(round(nbs / batch_size), 1)`)?

    Accumulating until a nominal batch of samples is seen is the idiom of code whose loss is a sum over
    samples (the YOLO family multiplies its loss by the batch size inside a loss class in another file),
    so an undivided loss is then correct; without seeing the loss, the rule stays silent."""
    for name in names_in(count):
        for value in m.assigns.get(name, ()):
            for n in m.walk(value):
                if isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Div, ast.FloorDiv)) \
                        and any(_BATCH.search(k) for k in names_in(n.right)):
                    return True
    return False


_GRAD_SCALING = lazy(r"scale_grads?_?$|normali[sz]e_grads?_?$|div_grads?_?$", re.I)


def _find_summed(m) -> bool:
    if any(_GRAD_SCALING.search(i) for i in m.identifiers):
        return True  # torchtune: sum token losses, then scale_grads_(params, 1 / num_tokens) at the step
    for n in m.calls:
        if isinstance(n.func, ast.Attribute) and n.func.attr in {"div_", "mul_"} \
                and isinstance(n.func.value, ast.Attribute) and n.func.value.attr == "grad":
            return True  # p.grad.div_(n_micro): the normalisation is applied to the gradients
    for n in m.of_class(ast.AugAssign):
        if isinstance(n.op, (ast.Div, ast.Mult)) and isinstance(n.target, ast.Attribute) and n.target.attr == "grad":
            return True
    for n in m.of_class(ast.keyword):
        if n.arg == "reduction" and isinstance(n.value, ast.Constant) and n.value.value == "sum":
            return True
    for n in m.of_class(ast.Return):
        if isinstance(n.value, (ast.BinOp, ast.Tuple)):
            value = n.value.elts[0] if isinstance(n.value, ast.Tuple) and n.value.elts else n.value
            scope = m.scope_of(n)
            if "loss" in f"{scope.name} {scope.cls or ''}".lower() and _times_batch(value):
                return True
    for n in m.of_class(ast.BinOp):
        if _times_batch(n) and "loss" in text(n).lower():
            return True
    return False


def _times_batch(n: ast.AST) -> bool:
    if not (isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult)):
        return False
    for side in (n.left, n.right):
        k = side.id if isinstance(side, ast.Name) else side.attr if isinstance(side, ast.Attribute) else None
        if k and _BATCH.search(k):
            return True
    return False
