"""AMP112 unscale-called-twice."""
import ast

from ..analysis import UNSCALE, UPDATE, compatible, text
from ._steps import accumulations
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

    known_problems = 'An `unscale_` on every micro-batch of accumulation is an error when the count is a literal above 1, a warning otherwise (one micro-batch per step runs it once).'
    references = ('https://pytorch.org/docs/stable/notes/amp_examples.html (Gradient clipping)', 'https://pytorch.org/docs/stable/amp.html (GradScaler.unscale_)')

    def check(self, m):
        yield from _per_micro_batch(m)
        for s in m.event_scopes:
            uns = [e for e in s.of(UNSCALE) if not e.via_call or _helper_always_unscales(m, e)]
            updates = s.of(UPDATE)
            for i, b in enumerate(uns):
                for a in uns[:i]:
                    if a.via_call and b.via_call:
                        continue
                    if not _same_optimizer(a, b) or a.innermost_loop != b.innermost_loop or not compatible(a, b):
                        continue
                    if a.loops != b.loops or any(a.order < u.order < b.order for u in updates):
                        continue
                    what = f"`{b.via_call}()` calls `unscale_`" if b.via_call else f"`unscale_({text(b.arg)})`"
                    yield Hit.at(b.node, f"{what} but `unscale_` was already called on line {a.line} "
                                         "in this step (no `update()` in between)")
                    break


def _same_optimizer(a, b) -> bool:
    """Same optimizer text; a helper call matches when that optimizer is one of its arguments."""
    if not a.via_call and not b.via_call:
        return text(a.arg) == text(b.arg)
    direct, helper = (b, a) if a.via_call else (a, b)
    args = [text(x) for x in helper.node.args] + [text(k.value) for k in helper.node.keywords]
    return text(direct.arg) in args or any(text(direct.arg).endswith("." + x) for x in args if x)


def _helper_always_unscales(m, e) -> bool:
    """The local helper calls `unscale_` unconditionally (a top-level statement of its body)."""
    for d in m.local_defs(e.via_call):
        for st in d.body:
            if isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) and \
                    getattr(st.value.func, "attr", None) == "unscale_":
                return True
    return False


def _per_micro_batch(m):
    """`unscale_` on every micro-batch of an accumulation loop: the second micro-batch raises
    "unscale_() has already been called on this optimizer since the last update()"."""
    for s in m.event_scopes:
        for acc in accumulations(s):
            for e in s.of(UNSCALE):
                if e.via_call or not acc.per_micro(e) or not any(b.order < e.order for b in acc.backwards):
                    continue
                n = acc.count.value if isinstance(acc.count, ast.Constant) else None
                hit = Hit.at(e.node, f"`unscale_({text(e.arg)})` runs on every micro-batch of the accumulation "
                                     f"loop on line {acc.node.lineno}: the second micro-batch raises RuntimeError "
                                     "(unscale_() has already been called since the last update())",
                             "unscale once, after the last micro-batch's backward and right before clipping")
                if not (isinstance(n, int) and n > 1):  # with one micro-batch per step it runs once
                    hit.message += f" whenever `{text(acc.count) or 'the accumulation count'}` > 1"
                    hit.lowered()
                yield hit
                break
