"""AMP103 fp16-without-scaler."""
import ast

from ._steps import training_regions
from .base import Hit, Rule


class Fp16WithoutScaler(Rule):
    id = "AMP103"
    needs_events = True
    name = "fp16-without-scaler"
    severity = "error"
    summary = ("float16 autocast (explicit `dtype=torch.float16`, or CUDA autocast with no dtype) in a training "
               "step that calls backward with no GradScaler.")
    why = ("float16 cannot represent values below ~6e-8: without loss scaling many small gradients underflow to "
           "zero and training silently stalls or diverges. GradScaler multiplies the loss so gradients stay "
           "representable, and skips steps whose gradients overflowed.")
    example_bad = """
with torch.autocast("cuda", dtype=torch.float16):
    loss = model(x).loss
loss.backward()
optimizer.step()
"""
    example_good = """
scaler = torch.amp.GradScaler("cuda")
with torch.autocast("cuda", dtype=torch.float16):
    loss = model(x).loss
scaler.scale(loss).backward()
scaler.step(optimizer)
scaler.update()
"""
    fix = ("Use `torch.amp.GradScaler(\"cuda\")`: `scaler.scale(loss).backward()`, `scaler.step(optimizer)`, "
           "`scaler.update()`; or switch to `dtype=torch.bfloat16` if the GPU supports it (no scaler needed).")

    known_problems = 'A scaler built in another file and never named here (`engine.fit(..., amp=True)`) hides the loss scaling from a single-file check, so files with any scaler-like name are skipped. When the autocast device comes from a variable that may be the CPU, the finding is a warning: only the CUDA path runs float16.'
    references = ('https://pytorch.org/docs/stable/notes/amp_examples.html (Typical mixed precision training)', 'https://pytorch.org/docs/stable/amp.html (Gradient scaling)')

    def check(self, m):
        if m.any_scaler and not _only_dead_scaler(m):
            return
        if any(e.managed for s in m.event_scopes for e in s.events if e.kind == "backward"):
            return
        for s, ac, node in training_regions(m, ("fp16",), unmanaged=True):
            how = "dtype=torch.float16" if ac.device != "cuda" else "float16 (explicit or CUDA's default dtype)"
            hit = Hit(ac.line, ac.col + 1, f"autocast runs in {how} and this training step has no GradScaler: "
                                           "small gradients underflow to zero")
            if ac.conditional:  # device_type from a variable that is CUDA only on a GPU machine
                hit.message = ("autocast's device comes from a variable that is CUDA when a GPU is present, and "
                               "CUDA autocast runs in float16 by default; this training step has no GradScaler: "
                               "on a GPU small gradients underflow to zero")
                hit.lowered()
            yield hit


def _only_dead_scaler(m) -> bool:
    """A GradScaler is built into a plain name that is never read again (its use left commented out)."""
    if m.scaler_method_keys or not m.scaler_ctor or not all(k.isidentifier() for k in m.scaler_ctor):
        return False
    if any(("scaler" in i and i not in m.scaler_ctor and i != "gradscaler" and not i.endswith("gradscaler"))
           or "scale_loss" in i or "loss_scale" in i for i in m.identifiers):
        return False
    def read(n) -> bool:
        name = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else None
        return name in m.scaler_ctor and not isinstance(n.ctx, ast.Store)
    return not any(read(n) for n in m.nodes)
