"""AMP123 no-nonfinite-guard."""
from ..analysis import BACKWARD
from .base import Hit, Rule


class NoNonfiniteGuard(Rule):
    id = "AMP123"
    name = "no-nonfinite-guard"
    severity = "info"
    summary = "A bf16 or fp16-without-scaler training loop that never checks `torch.isfinite(loss)`."
    why = ("Without GradScaler nothing skips a step whose loss or gradients are inf/NaN: one bad batch writes NaN "
           "into the weights and every later step is wasted. A cheap check stops (or skips) at the first bad step.")
    example_bad = """
with torch.autocast("cuda", dtype=torch.bfloat16):
    loss = model(x)
loss.backward()
optimizer.step()
"""
    example_good = """
with torch.autocast("cuda", dtype=torch.bfloat16):
    loss = model(x)
if not torch.isfinite(loss):
    raise RuntimeError(f"non-finite loss at step {step}")
loss.backward()
optimizer.step()
"""
    fix = "Check `torch.isfinite(loss)` each step (or every N steps) and stop or skip the step when it fails."

    known_problems = 'A check done in a helper of another file, or by a framework, is not seen.'
    references = ('https://pytorch.org/docs/stable/notes/amp_examples.html',)

    def check(self, m):
        if m.has_isfinite:
            return
        for s in m.event_scopes:
            if s.is_eval:
                continue
            bws = [e for e in s.of(BACKWARD) if not e.managed and not e.scaled]
            if not bws:
                continue
            regions = list(s.regions)
            for name in s.calls:  # autocast inside a compute_loss() helper the loop calls
                for callee in m.by_name.get(name, []):
                    if not callee.is_eval:
                        regions += callee.regions
            kinds = {ac.dtype for ac, _, nograd in regions if ac.active and not nograd}
            if "bf16" in kinds or ("fp16" in kinds and not m.any_scaler):
                yield Hit.at(bws[0].node, "half-precision training step without a non-finite check on the loss")
