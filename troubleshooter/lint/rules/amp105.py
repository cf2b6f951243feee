"""AMP105 optimizer-step-inside-autocast."""
from ..analysis import OPT_STEP, SCALER_STEP
from .base import Hit, Rule


class OptimizerStepInsideAutocast(Rule):
    id = "AMP105"
    name = "optimizer-step-inside-autocast"
    severity = "warning"
    summary = "`optimizer.step()` / `scaler.step()` inside an autocast block."
    why = ("The parameter update should run outside autocast: optimizers with math of their own (fused kernels, "
           "foreach ops, second-moment estimates) may otherwise see ops autocast to half precision.")
    example_bad = """
with torch.autocast("cuda", dtype=torch.float16):
    loss = model(x).loss
    scaler.scale(loss).backward()
    scaler.step(optimizer)
"""
    example_good = """
with torch.autocast("cuda", dtype=torch.float16):
    loss = model(x).loss
scaler.scale(loss).backward()
scaler.step(optimizer)
scaler.update()
"""
    fix = "Move the backward and the optimizer/scaler step out of the `with autocast(...)` block."

    known_problems = 'An optimizer whose `step()` does its own low-precision math on purpose is still reported.'
    references = ('https://pytorch.org/docs/stable/amp.html (autocast)',)

    def check(self, m):
        for s in m.event_scopes:
            for e in s.of(OPT_STEP, SCALER_STEP):
                if e.under_autocast is not None and not e.via_call:
                    yield Hit.at(e.node, f"optimizer step inside the autocast block opened on line {e.under_autocast.line}")
