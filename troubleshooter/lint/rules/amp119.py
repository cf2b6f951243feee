"""AMP119 scaler-with-bf16."""
from .base import Hit, Rule


class ScalerWithBf16(Rule):
    id = "AMP119"
    name = "scaler-with-bf16"
    severity = "info"
    summary = "GradScaler used with bfloat16 autocast only: not needed."
    why = ("bfloat16 has float32's exponent range, so gradients do not underflow and loss scaling buys nothing; "
           "the scaler adds an inf check and a host sync every step.")
    example_bad = """
scaler = torch.amp.GradScaler("cuda")
with torch.autocast("cuda", dtype=torch.bfloat16):
    loss = model(x)
"""
    example_good = """
with torch.autocast("cuda", dtype=torch.bfloat16):
    loss = model(x)
loss.backward()
optimizer.step()
"""
    fix = 'Drop the scaler for bf16, or enable it only for float16: `GradScaler("cuda", enabled=(dtype == torch.float16))`.'

    known_problems = 'A scaler enabled by a runtime flag is not reported: the flag may select float16.'
    references = ('https://pytorch.org/docs/stable/amp.html (Gradient scaling)',)

    def check(self, m):
        regions = [ac for s in m.scopes for ac, _, nograd in s.regions if ac.active and not nograd]
        if not regions or any(ac.dtype != "bf16" for ac in regions):
            return
        for key, ctors in m.scaler_ctor.items():
            if m.scaler_enabled_state(key) == "yes":
                yield Hit.at(ctors[0], "GradScaler with bfloat16 autocast: loss scaling is not needed for bf16")
