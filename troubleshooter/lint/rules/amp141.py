"""AMP141 framework-backward-bypassed."""
from ..analysis import BACKWARD, OPT_STEP, compatible, text
from .. import frameworks
from ..frameworks import hf_trainer, lightning
from ._frameworks import framework_name, precision_note, severity
from .base import Hit, Rule

_USE = {"accelerate": "accelerator.backward(loss)", "fabric": "fabric.backward(loss)",
        "lightning": "self.manual_backward(loss)", "hf_trainer": "self.accelerator.backward(loss)"}


class FrameworkBackwardBypassed(Rule):
    id = "AMP141"
    name = "framework-backward-bypassed"
    severity = "error"
    summary = ("`loss.backward()` called directly where the framework's optimizer expects its own scaled backward: "
               "an optimizer from `accelerator.prepare` / `fabric.setup`, a Lightning manual-optimization step, a "
               "Hugging Face Trainer `training_step` override.")
    why = ("Under float16 the framework's optimizer step is `scaler.step(optimizer)`, which first divides every "
           "gradient by the loss scale (65536 at the start). Gradients from a plain `loss.backward()` were never "
           "multiplied by it: each update is shrunk 65536-fold and training silently stalls; small gradients also "
           "flush to zero in the float16 backward.")
    example_bad = """
accelerator = Accelerator(mixed_precision="fp16")
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
"""
    example_good = """
accelerator = Accelerator(mixed_precision="fp16")
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    loss = model(**batch).loss
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
"""
    fix = "Call the framework's backward: `accelerator.backward(loss)`, `fabric.backward(loss)`, `self.manual_backward(loss)`."
    known_problems = ("Only a backward in the same function as the prepared optimizer's step (or in a Lightning manual "
                      "step / Trainer override) is judged. An error needs float16 written in the file.")
    references = ("https://huggingface.co/docs/accelerate/package_reference/accelerator#accelerate.Accelerator.backward",
                  "https://lightning.ai/docs/pytorch/stable/model/manual_optimization.html")

    def check(self, m):
        for s in m.event_scopes:
            raw = [e for e in s.of(BACKWARD) if not e.managed and not e.scaled and not e.via_call
                   and frameworks.owner(m, e.recv, s) is None]
            for e in raw:
                setup = self._expecting(m, s, e)
                if setup is None:
                    continue
                sev = severity(setup)
                if sev is None:
                    continue
                yield Hit(e.line, e.col + 1,
                          f"`{text(e.node)}` bypasses {framework_name(setup)}'s scaled backward, but the optimizer step "
                          "goes through its GradScaler, which divides these unscaled gradients by the loss scale "
                          f"({precision_note(setup)})",
                          f"call `{_USE[setup.framework]}`", {"framework": setup.framework},
                          None if sev == self.severity else sev)
                break

    def _expecting(self, m, s, b):
        """The setup whose wrapped optimizer steps the gradients of backward `b` (or whose hook this is)."""
        if s.cls in lightning.module_classes(m) and lightning.manual_optimization(m, s.cls):
            setups = lightning.setups(m)
            return setups[0] if setups else None
        if s.cls in hf_trainer.trainer_subclasses(m) and s.name == "training_step":
            setups = hf_trainer.setups(m)
            return setups[0] if setups else None
        step = next((e for e in s.of(OPT_STEP) if e.order > b.order and e.loops == b.loops and compatible(b, e)), None)
        if step is None:
            return None
        for fw in ("accelerate", "fabric"):
            setups = frameworks.of(m, fw)
            if setups and step.recv in frameworks.prepared_in(m, fw, s):
                return frameworks.owner(m, next(iter(setups[0].keys)), s) or setups[0]
        return None
