"""AMP115 unscaled-backward-with-scaler."""
import ast

from ..analysis import BACKWARD, SCALER_STEP, compatible, text
from .base import Hit, Rule


class UnscaledBackwardWithScaler(Rule):
    id = "AMP115"
    name = "unscaled-backward-with-scaler"
    severity = "error"
    summary = "`loss.backward()` directly while `scaler.step(optimizer)` is used."
    why = ("`scaler.step` divides the gradients by the current scale (65536 at first) before stepping. If backward "
           "was not run on `scaler.scale(loss)`, the real gradients are divided by the scale, shrinking every update "
           "towards zero, and fp16 gradients underflow.")
    example_bad = """
loss.backward()
scaler.step(optimizer)
scaler.update()
"""
    example_good = """
scaler.scale(loss).backward()
scaler.step(optimizer)
scaler.update()
"""
    fix = "Run backward on the scaled loss: `scaler.scale(loss).backward()`."

    known_problems = 'Two scalers used for two losses under different names are tracked by name; an unscaled backward of an auxiliary loss that never reaches the scaled optimizer is still reported.'
    fix_safety = "Safe: `loss.backward()` becomes `scaler.scale(loss).backward()` with the scaler's name from the file."
    references = ('https://pytorch.org/docs/stable/notes/amp_examples.html (Typical mixed precision training)',)

    def apply_fix(self, fixer, hit) -> bool:
        call = fixer.node(hit, ast.Call)
        scaler = hit.data.get("scaler")
        if call is None or not scaler or not isinstance(call.func, ast.Attribute) or call.func.attr != "backward":
            return False
        target = call.func.value
        start, end = fixer.src.span(target)
        return fixer.add(start, end, f"{scaler}.scale({fixer.src.text[start:end]})")

    def check(self, m):
        for s in m.event_scopes:
            steps = [e for e in s.of(SCALER_STEP) if not e.via_call and m.scaler_enabled(e.recv)]
            if not steps:
                continue
            for b in s.of(BACKWARD):
                if b.scaled or b.managed or s.sibling_has(b, {BACKWARD}):
                    continue
                st = next((e for e in steps if e.order > b.order and compatible(b, e)), None)
                if st is None or s.sibling_has(st, {"opt_step"}):
                    continue
                if any(e.kind == "opt_step" and b.order < e.order < st.order for e in s.events):
                    continue  # this backward feeds an optimizer stepped directly (e.g. a GAN's other net)
                scaler = text(st.node.func.value)
                yield Hit.at(b.node, f"backward on the unscaled loss, but `{scaler}.step()` on line {st.line} "
                                     "divides the gradients by the loss scale",
                             f"use `{scaler}.scale({text(b.arg) or 'loss'}).backward()`",
                             scaler=scaler)
