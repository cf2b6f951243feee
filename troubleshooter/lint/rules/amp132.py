"""AMP132 framework-unprepared-optimizer."""
from ..analysis import OPT_STEP, compatible
from .. import frameworks
from ._frameworks import framework_backwards, framework_name, precision_note, severity
from .base import Hit, Rule

_HOW = {"accelerate": "accelerator.prepare", "fabric": "fabric.setup", "hf_trainer": "accelerator.prepare"}


class FrameworkUnpreparedOptimizer(Rule):
    id = "AMP132"
    name = "framework-unprepared-optimizer"
    severity = "error"
    summary = ("An optimizer stepped after a framework's backward (`accelerator.backward`, `fabric.backward`) that "
               "never went through `accelerator.prepare` / `fabric.setup`.")
    why = ("Under float16 the framework's backward scales the loss; its wrapped optimizer's `step()` is "
           "`scaler.step(optimizer)` + `scaler.update()`. A raw optimizer steps on gradients still multiplied by "
           "the loss scale (65536 at the start), never skips an inf/NaN step, and the scale never adapts. Inside "
           "`accelerator.accumulate` it also steps on every micro-batch.")
    example_bad = """
accelerator = Accelerator(mixed_precision="fp16")
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
model, loader = accelerator.prepare(model, loader)
for batch in loader:
    accelerator.backward(model(**batch).loss)
    optimizer.step()
    optimizer.zero_grad()
"""
    example_good = """
accelerator = Accelerator(mixed_precision="fp16")
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    accelerator.backward(model(**batch).loss)
    optimizer.step()
    optimizer.zero_grad()
"""
    fix = "Pass the optimizer through `accelerator.prepare(...)` / `fabric.setup(model, optimizer)` and step what it returns."
    known_problems = ("Only optimizers built in this file and stepped where the framework's backward runs are judged; "
                      "one prepared in another file, or handed to a helper that prepares it, is assumed prepared when "
                      "its name is passed to any prepare/setup call. An error needs float16 written in the file.")
    references = ("https://huggingface.co/docs/accelerate/basic_tutorials/migration",
                  "https://lightning.ai/docs/fabric/stable/api/fabric_methods.html#setup")

    def check(self, m):
        for s in m.event_scopes:
            bws = framework_backwards(m, s)
            if not bws:
                continue
            for e in s.of(OPT_STEP):
                if not e.recv or e.recv not in m.optimizer_ctor:
                    continue
                prior = [(b, st) for b, st in bws if b.order < e.order and st.framework in _HOW
                         and b.loops == e.loops and compatible(b, e)]
                if not prior:
                    continue
                b, setup = prior[-1]
                prepared = frameworks.prepared_in(m, setup.framework, s)
                if setup.framework == "hf_trainer" or frameworks.is_prepared(prepared, e.recv) or not prepared:
                    continue  # no prepare call seen here at all: the objects are prepared elsewhere
                sev = severity(setup)
                if sev is None:
                    continue
                ctor = m.optimizer_ctor[e.recv][0]
                yield Hit(e.line, e.col + 1,
                          f"`{e.recv}.step()` steps an optimizer (built on line {ctor.lineno}) that never went through "
                          f"`{_HOW[setup.framework]}`, after {framework_name(setup)}'s backward on line {b.line}: its "
                          "gradients are still multiplied by the loss scale and an inf/NaN step is not skipped "
                          f"({precision_note(setup)})",
                          f"pass `{e.recv}` to `{_HOW[setup.framework]}(...)` and step the optimizer it returns",
                          {"framework": setup.framework, "optimizer": e.recv}, None if sev == self.severity else sev)
