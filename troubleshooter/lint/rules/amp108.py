"""AMP108 accumulation-loss-not-normalized."""
from ..analysis import text
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

    known_problems = "A loss summed over the batch by design (YOLOv5's `loss * bs`), or one normalised in another file, is not flagged when the accumulation count has no literal value; a normalisation done inside the model is not seen."
    references = ('https://pytorch.org/docs/stable/notes/amp_examples.html (Gradient accumulation)',)

    def check(self, m):
        for s in m.scopes:
            for acc in accumulations(s):
                if acc.count is None or divides_by(m, acc.count):
                    continue
                bw = next((b for b in acc.backwards if not b.managed), None)
                if bw is None:
                    continue
                n = text(acc.count)
                yield Hit.at(bw.node, f"gradients are accumulated over `{n}` micro-batches but the loss is never "
                                      f"divided by `{n}`", f"use `loss = loss / {n}` before backward")
