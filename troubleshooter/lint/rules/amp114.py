"""AMP114 manual-loss-scaling."""
import ast
import re

from ..analysis import walk, BACKWARD, tail
from ..lazy_re import lazy
from .base import Hit, Rule

_SCALE_NAME = lazy(r"loss_?scale|scale_?factor|^scale$|static_scale|loss_scaling", re.I)


def _factor(node: ast.AST) -> ast.AST | None:
    """The constant-looking factor of `x * C` (either side), if it looks like a loss scale."""
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult)):
        return None
    for side in (node.left, node.right):
        if _is_scale(side):
            return side
    return None


def _is_scale(n: ast.AST) -> bool:
    if isinstance(n, ast.Constant) and isinstance(n.value, (int, float)) and not isinstance(n.value, bool):
        return n.value >= 128
    if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Pow) and isinstance(n.left, ast.Constant) \
            and n.left.value == 2 and isinstance(n.right, ast.Constant) and isinstance(n.right.value, int):
        return n.right.value >= 7
    k = tail(n) if isinstance(n, (ast.Name, ast.Attribute)) else None
    return bool(k and _SCALE_NAME.search(k))


class ManualLossScaling(Rule):
    id = "AMP114"
    name = "manual-loss-scaling"
    severity = "warning"
    summary = "backward on a loss multiplied by a constant (e.g. `loss * 65536`) instead of GradScaler."
    why = ("A fixed scale cannot adapt: too high and gradients overflow to inf with nothing to skip the step; too "
           "low and they still underflow. The grads must also be divided back before clipping and stepping, which "
           "manual code often forgets. GradScaler does all of this dynamically.")
    example_bad = """
(loss * 65536).backward()
for p in model.parameters():
    p.grad /= 65536
optimizer.step()
"""
    example_good = """
scaler.scale(loss).backward()
scaler.step(optimizer)
scaler.update()
"""
    fix = "Use `torch.amp.GradScaler`: `scaler.scale(loss).backward()`, `scaler.step(optimizer)`, `scaler.update()`."

    known_problems = 'A factor computed per batch (a sample weight) or updated in place (a hand-written dynamic scale) is not a fixed scale and is not reported. Nor is a scale read from a loss-scaler object (`self.loss_scaler.loss_scale`, mmcv/apex style).'
    references = ('https://pytorch.org/docs/stable/amp.html (Gradient scaling)',)

    def check(self, m):
        for s in m.event_scopes:
            for e in s.of(BACKWARD):
                if e.managed or e.scaled or e.arg is None:
                    continue
                f = _factor(e.arg)
                if f is None and isinstance(e.arg, ast.Name):
                    f = self._assigned_factor(_assignments(m, s).get(e.arg.id, []), e.arg.id, e.line)
                if f is not None and _computed(m, f):
                    continue  # `loss_scale = batch["weight"].mean()`, `2 ** self.lg_loss_scale`: not a fixed scale
                if f is not None:
                    yield Hit.at(e.node, f"loss is multiplied by a fixed `{ast.unparse(f)}` before backward "
                                         "(manual loss scaling)")

    @staticmethod
    def _assigned_factor(nodes, name, before):
        for n in nodes:
            if getattr(n, "lineno", before) >= before:
                continue
            if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in n.targets):
                f = _factor(n.value)
                if f is not None:
                    return f
            if isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Mult) and isinstance(n.target, ast.Name) \
                    and n.target.id == name and _is_scale(n.value):
                return n.value
        return None


def _computed(m, factor: ast.AST) -> bool:
    """A named factor whose every assignment in the file computes it (a call, a subscript, arithmetic on
    other names) or that is updated in place: a per-batch weight or a dynamic scale, not a fixed one."""
    if not isinstance(factor, (ast.Name, ast.Attribute)):
        return False
    key = tail(factor)
    values = m.assigns.get(key or "", [])
    owner = tail(factor.value) if isinstance(factor, ast.Attribute) else None
    if not values and owner and "scal" in owner.lower():
        return True  # `self.loss_scaler.loss_scale`: read from a loss-scaler object (mmcv, apex), dynamic there
    if key in m.memo.get(("amp114_augmented",), lambda: {tail(n.target) for n in m.nodes
                                                          if isinstance(n, ast.AugAssign)}):
        return True
    return bool(values) and all(not _is_scale(v) and any(isinstance(x, (ast.Call, ast.Subscript, ast.Name, ast.Attribute))
                                                         for x in walk(v)) for v in values)


def _assignments(m, scope) -> dict:
    """name -> its Assign/AugAssign nodes in the scope, indexed once per scope."""
    return m.memo.get(("amp114_assignments", id(scope.node)), lambda: _index(m, scope))


def _index(m, scope) -> dict:
    index: dict = {}
    for n in m.subtree(scope.node):
        if isinstance(n, ast.Assign):
            for t in n.targets:
                if isinstance(t, ast.Name):
                    index.setdefault(t.id, []).append(n)
        elif isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name):
            index.setdefault(n.target.id, []).append(n)
    return index
