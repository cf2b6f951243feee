"""AMP133 framework-scheduler-on-skipped-step."""
from ..analysis import OPT_STEP, SCHED_STEP, text
from .. import frameworks
from ..frameworks import deepspeed
from ._frameworks import framework_name, precision_note, severity
from .base import Hit, Rule

_CHECK = {"accelerate": "if not accelerator.optimizer_step_was_skipped: lr_scheduler.step()`, or pass the "
                        "scheduler to `accelerator.prepare` (its AcceleratedScheduler skips with the optimizer; "
                        "not with a fused one: AMP145)",
          "fabric": "step the scheduler only when the scale did not drop: `scale = "
                    "fabric.strategy.precision.scaler.get_scale()` before `optimizer.step()`, and skip "
                    "`scheduler.step()` if `get_scale()` is lower after it",
          "deepspeed": "pass the scheduler to `deepspeed.initialize(lr_scheduler=...)` (the engine skips it with the "
                       "step), or guard it with `if model_engine.was_step_applied():`"}
_GUARD_WORDS = ("step_was_skipped", "was_step_applied", "get_scale", "skip")


def _guarded(e) -> bool:
    return any(w in k for _, _, k, _ in e.branches for w in _GUARD_WORDS) or \
        any(any(w in text(g.node.test) for w in _GUARD_WORDS) for g in e.guards)


class FrameworkSchedulerOnSkippedStep(Rule):
    id = "AMP133"
    needs_events = True
    name = "framework-scheduler-on-skipped-step"
    severity = "warning"
    summary = ("A per-step LR scheduler stepped after a framework optimizer step that float16 loss scaling may have "
               "skipped: a scheduler not passed to `accelerator.prepare`, any scheduler under Fabric 16-mixed, a "
               "scheduler kept outside a DeepSpeed engine.")
    why = ("When the loss scaler finds inf/NaN gradients the framework skips `optimizer.step()` silently (several "
           "times while the scale calibrates). Accelerate's prepared scheduler and the DeepSpeed engine's own "
           "scheduler skip with it; a scheduler they do not manage, and every scheduler under Fabric, steps anyway, "
           "so warm-up and decay run ahead of the updates.")
    example_bad = """
accelerator = Accelerator(mixed_precision="fp16")
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
scheduler = get_linear_schedule_with_warmup(optimizer, 100, 1000)
for batch in loader:
    accelerator.backward(model(**batch).loss)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
"""
    example_good = """
accelerator = Accelerator(mixed_precision="fp16")
scheduler = get_linear_schedule_with_warmup(optimizer, 100, 1000)
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
for batch in loader:
    accelerator.backward(model(**batch).loss)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
"""
    fix = ("Let the framework skip the scheduler with the step (`accelerator.prepare(..., scheduler)`, "
           "`deepspeed.initialize(lr_scheduler=...)`) or check for a skipped step before `scheduler.step()`.")
    known_problems = ("Per-epoch schedulers (stepped outside the batch loop) are not reported. A warning needs float16 "
                      "in the file, an argument default or a config beside it (Fabric: `precision=\"16-mixed\"` written "
                      "in the file); a precision chosen only at launch gives info. Lightning's own Trainer steps "
                      "schedulers itself and is not judged.")
    references = ("https://github.com/huggingface/accelerate/blob/v1.15.0/src/accelerate/scheduler.py",
                  "https://www.deepspeed.ai/docs/config-json/#fp16-training-options")

    def check(self, m):
        yield from self._prepared_optimizers(m)
        yield from self._deepspeed(m)

    def _prepared_optimizers(self, m):
        for fw in ("accelerate", "fabric"):
            setups = frameworks.of(m, fw)
            if not setups:
                continue
            for s in m.event_scopes:
                prepared = frameworks.prepared_in(m, fw, s)
                if not prepared:
                    continue
                steps = [e for e in s.of(OPT_STEP) if frameworks.is_prepared(prepared, e.recv)]
                for e in s.of(SCHED_STEP):
                    if (fw == "accelerate" and frameworks.is_prepared(prepared, e.recv)) or _guarded(e) or not e.recv:
                        continue
                    before = [o for o in steps if o.order < e.order and o.loops and o.loops == e.loops]
                    if not before:
                        continue
                    setup = frameworks.owner(m, next(iter(setups[0].keys)), s) or setups[0]
                    sev = severity(setup, "warning", "warning" if fw == "accelerate" and setup.precision.known else "info")
                    if sev is None:
                        continue
                    why = (f"`{e.recv}` was not passed to `accelerator.prepare`, so it steps even when "
                           "the prepared optimizer skipped its step" if fw == "accelerate" else
                           "Fabric does not wrap schedulers and keeps no skipped-step flag")
                    yield Hit(e.line, e.col + 1,
                              f"`{e.recv}.step()` after `{before[-1].recv}.step()` (line {before[-1].line}) every "
                              f"iteration: {why}; under float16 the GradScaler skips steps with inf/NaN gradients "
                              f"({framework_name(setup)}; {precision_note(setup)})",
                              _CHECK[fw], {"framework": fw}, None if sev == self.severity else sev)

    def _deepspeed(self, m):
        setups = frameworks.of(m, "deepspeed")
        if not setups or not deepspeed.initialize_calls(m):
            return
        setup = setups[0]
        engines, _, managed = deepspeed.engine_keys(m)
        sev = severity(setup, "warning", "warning" if setup.precision.may(frameworks.FP16) else "info")
        if sev is None:
            return
        step_calls = deepspeed.engine_step_calls(m, engines)
        for s in m.event_scopes:
            for e in s.of(SCHED_STEP):
                if not e.recv or e.recv in managed or _guarded(e):
                    continue
                loop = e.loops[-1].node if e.loops else None
                if loop is None:
                    continue
                before = [c for c in step_calls if loop.lineno <= c.lineno < e.line and c in m.subtree(loop)]
                if not before:
                    continue
                yield Hit(e.line, e.col + 1,
                          f"`{e.recv}.step()` after `{text(before[-1].func)}()` (line {before[-1].lineno}) every "
                          "iteration, but the scheduler is not the engine's: DeepSpeed skips overflowing fp16 steps and "
                          f"this scheduler steps anyway ({precision_note(setup)})",
                          _CHECK["deepspeed"], {"framework": "deepspeed"}, None if sev == self.severity else sev)

