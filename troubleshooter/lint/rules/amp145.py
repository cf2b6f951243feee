"""AMP145 fused-optimizer-skip-unseen."""
import ast

from ..analysis import kwarg
from .. import frameworks
from ..frameworks import hf_trainer
from ..frameworks.values import resolve
from ._frameworks import fused_optimizers, precision_note, severity
from .base import Hit, Rule

ISSUE = "huggingface/accelerate#4242"
_SKIP_FLAGS = ("step_was_skipped", "optimizer_step_was_skipped")


class FusedOptimizerSkipUnseen(Rule):
    id = "AMP145"
    name = "fused-optimizer-skip-unseen"
    severity = "warning"
    summary = ("Accelerate under float16 with a fused optimizer (`AdamW(fused=True)`, or the Hugging Face Trainer's "
               "`optim=\"adamw_torch_fused\"`) while the loop counts on Accelerate to tell a skipped step: a "
               "prepared LR scheduler, or `optimizer_step_was_skipped`.")
    why = ("`AcceleratedOptimizer.step` decides a step was skipped when GradScaler did not call the optimizer's "
           "`step()`. GradScaler calls a fused optimizer's `step()` every time and lets the fused kernel skip the "
           "update on inf/NaN gradients, so Accelerate (1.15.0 and earlier) reports every skipped step as taken: "
           "`optimizer_step_was_skipped` stays False and the prepared scheduler (the Trainer's too) advances on "
           f"skipped steps, eating the warm-up while the loss scale calibrates ({ISSUE}, open on 2026-11-28; "
           "reproduced with accelerate 1.15.0 and torch 2.13). The Trainer's default optimizer is the fused AdamW "
           "on torch >= 2.8 (huggingface/transformers#37358).")
    example_bad = """
accelerator = Accelerator(mixed_precision="fp16")
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
scheduler = get_cosine_schedule_with_warmup(optimizer, 500, 10000)
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
"""
    example_good = """
accelerator = Accelerator(mixed_precision="fp16")
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)  # GradScaler skips its step(): Accelerate sees it
scheduler = get_cosine_schedule_with_warmup(optimizer, 500, 10000)
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
"""
    fix = ("Build the optimizer unfused (GradScaler then skips its `step()` and Accelerate sees it; the Trainer: "
           "`optim=\"adamw_torch\"`), or step the scheduler yourself only when `accelerator.scaler.get_scale()` did "
           "not drop, or train in bf16 (no GradScaler, no skipped steps).")
    known_problems = ("Only optimizers built in the file with `fused=True` (or a Trainer given "
                      "`optim=\"adamw_torch_fused\"`) are judged; the Trainer's default optimizer depends on the "
                      "installed torch, so `fp16=True` without `optim=` is told as information. Fixed upstream, this "
                      "rule will need a version bound.")
    references = (f"https://github.com/{ISSUE.replace('#', '/issues/')}",
                  "https://github.com/huggingface/accelerate/blob/v1.15.0/src/accelerate/optimizer.py",
                  "https://github.com/huggingface/transformers/pull/37358")

    def check(self, m):
        yield from self._accelerate(m)
        yield from self._trainer(m)

    def _accelerate(self, m):
        setups = frameworks.of(m, "accelerate")
        if not setups or not (fused := fused_optimizers(m)):  # no Accelerate setup: no optimizer is asked for
            return
        for call in fused:
            scope = m.scope_of(call)
            setup = _setup_of(setups, scope)
            sev = severity(setup, "warning", "info")
            if sev is None:
                continue
            prepared = frameworks.prepared_in(m, "accelerate", scope)
            names = {k for k, vs in m.assigns.items() if any(v is call for v in vs)}
            if not (names & prepared or "*" in prepared or _handed_to_prepare(m, call)):
                continue
            reliance = _reliance(m, prepared, scope)
            if not reliance:
                continue
            hit = Hit.at(call, f"this optimizer is fused (`fused=True`) and Accelerate prepares it under float16: "
                               f"GradScaler calls a fused optimizer's step() even when it skips the update, so "
                               f"Accelerate reports skipped steps as taken and {reliance} ({ISSUE}; "
                               f"{precision_note(setup)})",
                         "drop `fused=True`, or step the scheduler only when `accelerator.scaler.get_scale()` did "
                         "not drop", framework="accelerate")
            yield hit if sev == self.severity else hit.lowered(sev)

    def _trainer(self, m):
        for call in hf_trainer.args_calls(m):
            if hf_trainer.precision_of(m, call).options != (frameworks.FP16,):
                continue  # only a literal fp16=True: the optimizer choice below is the question
            kw = kwarg(call, "optim")
            if kw is None:
                yield Hit.at(call, "`fp16=True` with the Trainer's default optimizer, the fused AdamW on torch >= 2.8: "
                                   "Accelerate does not see its skipped steps, so the Trainer's LR scheduler advances "
                                   f"on them while the loss scale calibrates ({ISSUE})",
                             "`optim=\"adamw_torch\"` keeps the schedule exact (at some speed), or bf16=True where "
                             "the GPU has it", framework="hf_trainer").lowered("info")
                continue
            value = resolve(m, kw)
            if value.known and value.options == ("adamw_torch_fused",):
                yield Hit.at(kw, "`optim=\"adamw_torch_fused\"` with `fp16=True`: Accelerate does not see the fused "
                                 "optimizer's skipped steps, so the Trainer's LR scheduler advances on them while the "
                                 f"loss scale calibrates ({ISSUE})",
                             "`optim=\"adamw_torch\"`, or bf16=True where the GPU has it", framework="hf_trainer")


def _setup_of(setups: list, scope):
    """The Accelerator made in the optimizer's own function, else the file's first."""
    lo, hi = getattr(scope.node, "lineno", 1), getattr(scope.node, "end_lineno", 10 ** 9)
    here = [s for s in setups if s.node is not None and lo <= s.node.lineno <= hi]
    return (here or setups)[0]


def _reliance(m, prepared: set[str], scope) -> str | None:
    """How the optimizer's function counts on Accelerate's skipped-step flag, in words (None: it does not)."""
    schedulers = sorted(k for k in prepared if m.is_scheduler(k))
    if schedulers:
        return f"the prepared scheduler `{schedulers[0]}` advances on them"
    if any(isinstance(n, ast.Attribute) and n.attr in _SKIP_FLAGS for n in m.subtree(scope.node)):
        return "`optimizer_step_was_skipped` stays False on them"
    return None


def _handed_to_prepare(m, call: ast.Call) -> bool:
    """`accelerator.prepare(model, AdamW(..., fused=True))`: the constructor itself is an argument."""
    return any(call in c.args for c in m.calls_named("prepare") if c is not call)
