"""AMP144 fused-optimizer-with-framework-clipping."""
import ast

from ..analysis import FW_CLIP, func_tail, kwarg, text
from .. import frameworks
from ..frameworks import lightning
from ..frameworks.values import resolve
from ._frameworks import framework_name, fused_optimizers, precision_note, severity
from .base import Hit, Rule


class FusedOptimizerWithFrameworkClipping(Rule):
    id = "AMP144"
    name = "fused-optimizer-with-framework-clipping"
    severity = "error"
    summary = ("Gradient clipping through Lightning (`Trainer(gradient_clip_val=...)`, `self.clip_gradients`) or "
               "Fabric (`fabric.clip_gradients`) under 16-mixed with a fused optimizer (`AdamW(fused=True)`).")
    why = ("A fused optimizer unscales the gradients inside its own `step()` (`_step_supports_amp_scaling`), so "
           "Lightning cannot unscale them before clipping: the Trainer raises \"The current optimizer, AdamW, does "
           "not allow for gradient clipping because it performs unscaling of gradients internally. HINT: Are you "
           "using a 'fused' optimizer?\" and Fabric \"Gradient clipping is not implemented for optimizers handling "
           "the unscaling.\" (lightning 2.6.6, plugins/precision/amp.py; litgpt issue #2042).")
    example_bad = """
class LitModel(pl.LightningModule):
    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-4, fused=True)

trainer = pl.Trainer(precision="16-mixed", gradient_clip_val=1.0)
"""
    example_good = """
class LitModel(pl.LightningModule):
    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-4)

trainer = pl.Trainer(precision="16-mixed", gradient_clip_val=1.0)
"""
    fix = "Drop `fused=True` (or clipping), or train in `bf16-mixed` (no GradScaler, nothing to unscale)."
    known_problems = ("An error needs `precision=\"16-mixed\"` written in the file; otherwise a warning. A fused "
                      "optimizer built from a variable flag (`fused=args.fused`) counts when its default is True.")
    references = ("https://github.com/Lightning-AI/litgpt/issues/2042",
                  "https://github.com/Lightning-AI/pytorch-lightning/blob/2.6.6/src/lightning/pytorch/plugins/precision/amp.py")

    def check(self, m):
        setups = frameworks.of(m, "lightning", "fabric")
        fused = fused_optimizers(m) if setups else None  # most files set no framework up: no optimizer is asked for
        if not fused:
            return
        for setup in setups:
            sev = severity(setup)
            if sev is None:
                continue
            site = self._clip_site(m, setup, fused)
            if site is None:
                continue
            node, how, opt = site
            yield Hit.at(node, f"{how} clips under {framework_name(setup)}'s GradScaler while the optimizer built on line "
                               f"{opt.lineno} is fused (`fused=True`: it unscales inside its own step), so "
                               f"{framework_name(setup)} refuses to clip ({precision_note(setup)})",
                         "drop `fused=True`, or clipping, or use bf16-mixed", framework=setup.framework).lowered(
                "error" if sev == "error" else "warning")

    def _clip_site(self, m, setup, fused):
        """(where, how, the fused optimizer) when this setup clips with a fused optimizer it trains."""
        if setup.framework == "lightning" and setup.node is not None:
            kw = kwarg(setup.node, "gradient_clip_val")
            v = resolve(m, kw) if kw is not None else None
            if v is not None and (not v.known or any(isinstance(o, (int, float)) and o > 0 for o in v.options)):
                mine = _trained_by(m, setup.node, fused)
                if mine:
                    return setup.node, "`Trainer(gradient_clip_val=...)`", mine[0]
        for s in m.event_scopes:
            for e in s.of(FW_CLIP):
                if func_tail(e.node) != "clip_gradients":
                    continue
                if (setup.framework == "fabric" and e.recv in setup.keys) or \
                        (setup.framework == "lightning" and e.recv == "self" and s.cls in lightning.module_classes(m)):
                    return e.node, f"`{text(e.node.func)}(...)`", fused[0]
        return None


def _trained_by(m, trainer: ast.Call, fused: list[ast.Call]) -> list[ast.Call]:
    """The fused optimizers of the LightningModule this Trainer fits (all of them when it cannot be told)."""
    keys = {k for k, vs in m.assigns.items() if any(v is trainer for v in vs)}
    classes = set()
    for c in m.calls:
        if func_tail(c) != "fit" or not c.args or not isinstance(c.func, ast.Attribute):
            continue
        target = c.func.value
        if target is trainer or (isinstance(target, ast.Name) and target.id in keys):
            arg = c.args[0]
            if isinstance(arg, ast.Call) and func_tail(arg) in m.classes:
                classes.add(func_tail(arg))
            elif isinstance(arg, ast.Name) and arg.id in m.instances:
                classes.add(m.instances[arg.id])
    if not classes:
        return fused
    spans = [(m.classes[c].lineno, m.classes[c].end_lineno) for c in classes]
    return [f for f in fused if any(lo <= f.lineno <= hi for lo, hi in spans)]

