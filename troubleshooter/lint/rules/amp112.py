"""AMP112 unscale-called-twice."""
from ..analysis import UNSCALE, UPDATE, compatible, text
from .base import Hit, Rule


class UnscaleCalledTwice(Rule):
    id = "AMP112"
    name = "unscale-called-twice"
    severity = "error"
    summary = "`scaler.unscale_(optimizer)` called more than once per step."
    why = ("`unscale_` may be called once per optimizer between updates: the second call raises "
           "`RuntimeError: unscale_() has already been called on this optimizer since the last update()`.")
    example_bad = """
scaler.unscale_(optimizer)
clip_grad_norm_(model.parameters(), 1.0)
scaler.unscale_(optimizer)
scaler.step(optimizer)
"""
    example_good = """
scaler.unscale_(optimizer)
clip_grad_norm_(model.parameters(), 1.0)
scaler.step(optimizer)
scaler.update()
"""
    fix = "Call `scaler.unscale_(optimizer)` once, right before the first thing that needs real gradients."

    def check(self, m):
        for s in m.scopes:
            uns = [e for e in s.of(UNSCALE) if not e.via_call]
            updates = s.of(UPDATE)
            for i, b in enumerate(uns):
                for a in uns[:i]:
                    if text(a.arg) != text(b.arg) or a.innermost_loop != b.innermost_loop or not compatible(a, b):
                        continue
                    if a.loops != b.loops or any(a.order < u.order < b.order for u in updates):
                        continue
                    yield Hit.at(b.node, f"`unscale_({text(b.arg)})` was already called on line {a.line} "
                                         "in this step (no `update()` in between)")
                    break
