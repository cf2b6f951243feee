"""AMP102 grads-read-before-unscale."""
from ..analysis import BACKWARD, CLIP, GRAD, SCALER_STEP, UNSCALE, compatible
from ._steps import scaler_key_for
from .base import Hit, Rule


class GradsReadBeforeUnscale(Rule):
    id = "AMP102"
    name = "grads-read-before-unscale"
    severity = "warning"
    summary = "`.grad` read or modified (norm logging, manual weight decay) while the gradients are still scaled."
    why = ("Between `scaler.scale(loss).backward()` and `scaler.unscale_()`/`scaler.step()` every `.grad` is "
           "multiplied by the loss scale. Logged gradient norms are off by that factor (and jump when the scale "
           "changes); manual updates such as weight decay or noise added to `.grad` are scaled away.")
    example_bad = """
scaler.scale(loss).backward()
grad_norm = sum(p.grad.norm() ** 2 for p in model.parameters()) ** 0.5
scaler.step(optimizer)
"""
    example_good = """
scaler.scale(loss).backward()
scaler.unscale_(optimizer)
grad_norm = sum(p.grad.norm() ** 2 for p in model.parameters()) ** 0.5
scaler.step(optimizer)
"""
    fix = "Call `scaler.unscale_(optimizer)` before touching `.grad` (or read the grads after `scaler.step`)."

    known_problems = 'A `.grad` read that divides by `scaler.get_scale()` itself is correct; the rule recognises that only in the same expression. Reads in another file are not seen.'
    references = ('https://pytorch.org/docs/stable/notes/amp_examples.html (Working with unscaled gradients)',)

    def check(self, m):
        for s in m.event_scopes:
            bws = [e for e in s.events if e.kind == BACKWARD and e.scaled and not e.managed
                   and m.scaler_enabled(e.recv)]
            if not bws:
                continue
            clip_lines = {c.line for c in s.of(CLIP)}
            seen = set()
            for g in s.of(GRAD):
                if g.line in seen or g.line in clip_lines:
                    continue
                prior = [b for b in bws if b.order < g.order and compatible(b, g)]
                if not prior:
                    continue
                b = prior[-1]
                if any(e.kind in (UNSCALE, SCALER_STEP) and b.order < e.order < g.order for e in s.events):
                    continue
                seen.add(g.line)
                what = f"`{g.via_call}()` reads `.grad`" if g.via_call else "`.grad` is used"
                yield Hit.at(g.node, f"{what} while gradients are still multiplied by the loss scale "
                                     f"(scaled backward on line {b.line})",
                             f"call `{scaler_key_for(s, m)}.unscale_(optimizer)` before reading gradients")
