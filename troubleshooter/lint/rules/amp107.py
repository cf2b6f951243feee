"""AMP107 scheduler-steps-on-skipped-step."""
import re

from ..analysis import GET_SCALE, SCALER_STEP, SCHED_STEP, compatible, text
from ..lazy_re import lazy
from .base import Hit, Rule

_CHECK_RE = lazy(r"skip|scale|found_inf|was_run|step_count|overflow|isfinite|isnan|nan|inf", re.I)


_PRESENCE = lazy(r"^(not\s+)?([\w.]+)(\s+is(\s+not)?\s+None)?$")


def _skip_check(m, condition: str | None) -> bool:
    """Can this branch condition tell a skipped step? `if scaler:` / `if scaler is not None:` only asks
    whether a scaler exists (fp16 path or not); a scale comparison or an overflow flag can tell."""
    if not condition or not _CHECK_RE.search(condition):
        return False
    bare = _PRESENCE.match(condition.strip())
    return not (bare and m.is_scaler(bare.group(2).split(".")[-1]))


class SchedulerStepsOnSkippedStep(Rule):
    id = "AMP107"
    name = "scheduler-steps-on-skipped-step"
    severity = "warning"
    summary = "A per-iteration `scheduler.step()` after `scaler.step()` with no check that the optimizer step was skipped."
    why = ("GradScaler skips `optimizer.step()` when the gradients overflowed (often in the first iterations while "
           "it calibrates the scale). Stepping the LR scheduler anyway advances warm-up/decay without an update and "
           "PyTorch warns 'Detected call of lr_scheduler.step() before optimizer.step()'.")
    example_bad = """
scaler.step(optimizer)
scaler.update()
scheduler.step()
"""
    example_good = """
scale_before = scaler.get_scale()
scaler.step(optimizer)
scaler.update()
if scaler.get_scale() >= scale_before:  # the step was not skipped
    scheduler.step()
"""
    fix = ("Compare `scaler.get_scale()` before and after `scaler.update()` and step the scheduler only when the "
           "scale did not drop, or set the LR from the step index instead.")

    known_problems = 'Schedulers that only read the step count (warm-up by iteration) drift by the number of skipped steps, which is small once the scale settles; the warning matters most early in training and for per-iteration schedules. A branch on the scale or an overflow flag counts as the check; `if scaler:` / `if scaler is not None:` only asks whether the fp16 path is on and does not.'
    references = ('https://pytorch.org/docs/stable/notes/amp_examples.html (Typical mixed precision training)',)

    def check(self, m):
        for s in m.event_scopes:
            if s.of(GET_SCALE):
                continue
            steps = [e for e in s.of(SCALER_STEP) if not e.via_call]
            for t in s.of(SCHED_STEP):
                if t.arg is not None:  # ReduceLROnPlateau(metric) / epoch-indexed: not per iteration
                    continue
                if any(_skip_check(m, b[2]) for b in t.branches):
                    continue
                if any(st.line < t.line and st.innermost_loop == t.innermost_loop and compatible(st, t) for st in steps):
                    yield Hit.at(t.node, f"`{text(t.node.func)}()` runs every iteration even when GradScaler skipped "
                                         "the optimizer step (inf/NaN gradients)")
