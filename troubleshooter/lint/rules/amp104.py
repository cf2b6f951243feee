"""AMP104 backward-inside-autocast."""
from ..analysis import BACKWARD
from .base import Hit, Rule


class BackwardInsideAutocast(Rule):
    id = "AMP104"
    name = "backward-inside-autocast"
    severity = "warning"
    summary = "`.backward()` called lexically inside an autocast block."
    why = ("Autocast should wrap only the forward pass and the loss. Backward ops already run in the dtype "
           "autocast chose for the matching forward op; running backward under autocast is not recommended by "
           "PyTorch and can cast ops in custom/backward code unexpectedly.")
    example_bad = """
with torch.autocast("cuda", dtype=torch.bfloat16):
    loss = model(x).loss
    loss.backward()
"""
    example_good = """
with torch.autocast("cuda", dtype=torch.bfloat16):
    loss = model(x).loss
loss.backward()
"""
    fix = "Dedent the backward call (and the optimizer step) out of the `with autocast(...)` block."

    known_problems = "Calling backward inside autocast is allowed by PyTorch and usually harmless; the warning is about ops of the backward's surroundings that run in half precision unintentionally."
    references = ('https://pytorch.org/docs/stable/amp.html (autocast: backward passes under autocast are not recommended)',)

    def check(self, m):
        for s in m.event_scopes:
            for e in s.of(BACKWARD):
                if e.under_autocast is not None and not e.via_call:
                    yield Hit.at(e.node, f"backward runs inside the autocast block opened on line {e.under_autocast.line}")
