"""AMP116 optimizer-step-bypasses-scaler."""
import ast

from ..analysis import BACKWARD, HELPER_OPT_STEP, OPT_STEP, SCALER_STEP, UNSCALE, UPDATE, compatible, text
from ._steps import scaler_key_for
from .base import Hit, Rule


class OptimizerStepBypassesScaler(Rule):
    id = "AMP116"
    name = "optimizer-step-bypasses-scaler"
    severity = "error"
    summary = "`optimizer.step()` directly after `scaler.scale(loss).backward()`."
    why = ("The gradients are still multiplied by the loss scale (65536 at first): stepping the optimizer directly "
           "applies updates thousands of times too large (SGD) or skews Adam's moments, and never skips steps "
           "with inf/NaN gradients.")
    example_bad = """
scaler.scale(loss).backward()
optimizer.step()
"""
    example_good = """
scaler.scale(loss).backward()
scaler.step(optimizer)
scaler.update()
"""
    fix = "Replace `optimizer.step()` with `scaler.step(optimizer)` followed by `scaler.update()`."

    known_problems = 'A custom optimizer wrapper that unscales inside its own `step()` is not recognised when defined in another file.'
    fix_safety = 'Safe: made only when `scaler.update()` already follows, so the step/update pair stays whole.'
    references = ('https://pytorch.org/docs/stable/notes/amp_examples.html (Typical mixed precision training)',)

    def apply_fix(self, fixer, hit) -> bool:
        call = fixer.node(hit, ast.Call)
        scaler = hit.data.get("scaler")
        if call is None or not scaler or not hit.data.get("update_follows") or call.args or call.keywords \
                or not isinstance(call.func, ast.Attribute) or call.func.attr != "step":
            return False
        start, end = fixer.src.span(call)
        opt_start, opt_end = fixer.src.span(call.func.value)
        return fixer.add(start, end, f"{scaler}.step({fixer.src.text[opt_start:opt_end]})")

    def check(self, m):
        for s in m.event_scopes:
            for h, b in self._helper_hits(s, m):
                yield Hit.at(h.node, f"`{text(h.node.func)}()` steps the optimizer directly (no `scaler.step`) on "
                                     f"gradients still multiplied by the loss scale (scaled backward on line {b.line})",
                             f"inside `{h.via_call}` use `scaler.step(optimizer)` then `scaler.update()`")
            for o in s.of(OPT_STEP):
                double = self._after_scaler_step(s, o)
                if double is not None:
                    yield Hit.at(o.node, f"`{text(o.node.func)}()` steps the optimizer a second time after "
                                         f"`{text(double.node.func)}({text(double.arg)})` on line {double.line}: the "
                                         "update is applied twice per iteration and this one is never skipped "
                                         "on inf/NaN gradients",
                                 "step through the scaler only: drop this call on the GradScaler path "
                                 "(put it in the `else:` of the AMP branch)")
                    continue
                prior = [e for e in s.events if e.kind == BACKWARD and e.order < o.order and compatible(e, o)]
                if not prior:
                    continue
                b = prior[-1]
                if not b.scaled or b.managed or not m.scaler_enabled(b.recv):
                    continue
                if any(e.kind in (UNSCALE, SCALER_STEP) and b.order < e.order < o.order for e in s.events):
                    continue
                if s.sibling_has(o, {SCALER_STEP}) or any(e.kind == SCALER_STEP and e.order > o.order
                                                          and compatible(e, o) and e.loops == o.loops
                                                          for e in s.events):
                    continue
                scaler = scaler_key_for(s, m)
                updated_after = any(e.kind == UPDATE and e.order > o.order and not e.via_call for e in s.events)
                yield Hit.at(o.node, f"`{text(o.node.func)}()` steps on gradients still multiplied by the loss scale "
                                     f"(scaled backward on line {b.line})",
                             f"use `{scaler}.step({text(o.node.func.value)})` then `{scaler}.update()`",
                             scaler=scaler, update_follows=updated_after)

    @staticmethod
    def _helper_hits(s, m):
        """`self.optimizer_step()` whose body is a plain `optimizer.step()` (scaler calls commented out)."""
        for h in s.of(HELPER_OPT_STEP):
            prior = [e for e in s.events if e.kind == BACKWARD and e.order < h.order and compatible(e, h)]
            if not prior:
                continue
            b = prior[-1]
            if not b.scaled or b.managed or not m.scaler_enabled(b.recv):
                continue
            if any(e.kind in (UNSCALE, SCALER_STEP) and compatible(e, h) for e in s.events):
                continue
            yield h, b

    @staticmethod
    def _after_scaler_step(s, o):
        """A `scaler.step(opt)` on the same path, same optimizer, same loop, with no backward in between."""
        if o.via_call or not isinstance(o.node.func, ast.Attribute):
            return None
        opt = text(o.node.func.value)
        for e in reversed(s.events):
            if e.order >= o.order or e.via_call or not compatible(e, o) or e.loops != o.loops:
                continue
            if e.kind == SCALER_STEP and e.arg is not None and text(e.arg) == opt:
                if not {(b[0], b[1]) for b in o.branches} <= {(b[0], b[1]) for b in e.branches}:
                    return None  # the plain step has its own condition: likely the other precision's path
                if any(b.kind == BACKWARD and e.order < b.order < o.order and compatible(b, e)
                       and compatible(b, o) for b in s.events):
                    return None
                # an early exit (return/continue/break/raise) between the two makes them alternatives
                for n in ast.walk(s.node) if hasattr(s, "node") else ():
                    if isinstance(n, (ast.Return, ast.Continue, ast.Break, ast.Raise)) \
                            and e.line <= n.lineno < o.line:
                        return None
                return e
        return None
