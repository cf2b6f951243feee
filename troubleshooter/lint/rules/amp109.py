"""AMP109 scaler-update-per-microbatch."""
from ..analysis import SCALER_STEP, UPDATE
from ._steps import accumulations, always_calls
from .base import Hit, Rule


class ScalerUpdatePerMicrobatch(Rule):
    id = "AMP109"
    name = "scaler-update-per-microbatch"
    severity = "error"
    summary = "`scaler.update()` or `scaler.step()` called on every micro-batch of a gradient-accumulation loop."
    why = ("With accumulation the scale must stay fixed until the accumulated gradients are used: updating it per "
           "micro-batch mixes gradients scaled by different factors (so unscale_ divides them wrongly), and a "
           "per-micro-batch `scaler.step` steps the optimizer on partial gradients.")
    example_bad = """
for i, batch in enumerate(loader):
    scaler.scale(loss / accum).backward()
    if (i + 1) % accum == 0:
        scaler.step(optimizer)
        optimizer.zero_grad()
    scaler.update()
"""
    example_good = """
for i, batch in enumerate(loader):
    scaler.scale(loss / accum).backward()
    if (i + 1) % accum == 0:
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
"""
    fix = "Call `scaler.step(optimizer)` and `scaler.update()` only in the branch that steps the optimizer."

    known_problems = 'A configuration branch (`if accum_steps > 1: ... else: ...`) is not an accumulation guard; each branch is judged on its own.'
    references = ('https://pytorch.org/docs/stable/notes/amp_examples.html (Gradient accumulation)',)

    def check(self, m):
        for s in m.event_scopes:
            seen = set()
            for acc in accumulations(s):
                for e in s.of(UPDATE, SCALER_STEP):
                    if e.line in seen or not acc.per_micro(e):
                        continue
                    what = "scaler.update()" if e.kind == UPDATE else "scaler.step()"
                    if e.via_call:  # `self.train_step(batch)` per micro-batch, and the helper always updates
                        if not always_calls(m, e.via_call, "update" if e.kind == UPDATE else "step"):
                            continue
                        what = f"{e.via_call}()` calls `{what}"
                    seen.add(e.line)
                    yield Hit.at(e.node, f"`{what}` runs on every micro-batch of the accumulation loop on line "
                                         f"{acc.node.lineno}")
