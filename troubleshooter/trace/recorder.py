"""The run-time state machine of a traced script: events per optimizer step and the AMP
protocol checks that need live objects (which optimizer a parameter belongs to, whether the
loss being backpropagated came out of `scaler.scale`).

Everything here runs inside the child process that runs the user's script. The wrappers in
`patches` call the `on_*` methods; each protocol mistake is recorded as a violation at the
user's file and line where the offending call ran. `analysis` turns them into Findings.
"""
from __future__ import annotations

import math
import statistics
import sys
import time
import weakref
from functools import partial
from time import perf_counter
from typing import Any, Callable

import torch

from .frameworks import entered_by_framework
from .locate import _cache as _user_files, _lines, is_user_file, line_of, user_frame

MAX_EVENTS_PER_STEP = 100
MAX_VIOLATIONS = 500
MAX_STEP_MARKS = 10_000  # steps whose end time is kept for the report's "tracing added X ms per step"
HALF = (torch.float16, torch.bfloat16)
# calls that finish a step rather than start the next one
TRAILING = {"scaler.update", "scheduler.step", "torch.save", "scaler.state_dict", "clip_grad_norm_",
            "clip_grad_value_", "clip_grad_norm"}
# Steady state: after this many consecutive clean steps with the same recorded pattern, the costly
# instruments (the loss watch, the output-gradient keeper) stand down until a step deviates.
# Three: the first step differs from the rest anyway (no previous step's update/scheduler in its
# window, first-time checks), so three equal windows are two comparisons that agree, and a
# warm-up effect that lasts two steps (a scale still settling, a lazy init) re-arms before it.
STEADY_AFTER = 3
# The tracer's own time on steady steps that follow the template is sampled: one in this many is
# timed call by call (every wrapper's two clock reads); the others time only the step's close
# and are given the last sample's time for the rest (Recorder.overhead, docs/trace.md)
SAMPLE_EVERY = 8
SCALE_KEYS = ("scale_before", "scale_after")  # values, not pattern: a grown scale is still the same step
# the steady fast path's template ends with this record: no call matches it
_TEMPLATE_END = (None, None, -1, None, None, False)


class _Gone:
    pass


_DEAD = weakref.ref(_Gone())  # a weakref whose object is gone: no call is the window's scaler or optimizer


class TraceStop(BaseException):
    """Raised into the user's script after N optimizer steps; BaseException so `except Exception`
    in the script does not swallow it."""


class TraceTimeout(BaseException):
    """Raised into the user's script when the parent's time limit asks it to stop."""


def _autocast_now() -> str | None:
    """The autocast dtype active on cpu or cuda right now, or None."""
    if not _any_autocast():  # one call into torch instead of two or three: the usual answer
        return None
    for dev in ("cuda", "cpu"):
        try:
            if torch.is_autocast_enabled(dev):
                return str(torch.get_autocast_dtype(dev)).replace("torch.", "")
        except (RuntimeError, TypeError, AttributeError):
            continue
    return None


_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", lambda: True)


class Recorder:
    """Step counting, the timeline, and the per-step protocol state."""

    def __init__(self, steps: int, on_step: Callable[["Recorder", dict], None] | None = None,
                 steady_after: int = STEADY_AFTER):
        self.target = steps
        # steady state (see STEADY_AFTER; 0: every instrument armed every step, `--no-steady`)
        self.steady_after = steady_after
        self.steady = False  # the step being recorded runs with the costly instruments standing down
        self.steady_steps = 0  # steps recorded in steady state
        self._steady_run = 0  # consecutive clean steps with the same pattern
        self._windows: list[list] = []  # the last few steps' patterns (events since the previous step)
        self._trailing_from = 0  # where the previous step's trailing events (update, scheduler) start
        self._autocast_enters = 0  # this window's autocast entries (a model may enter it per layer)
        # the steady fast path (docs/trace.md, "Steady state"): on a steady step each wrapped call
        # that is the template step's next one, from the same code object and instruction, takes
        # its event from the template instead of walking the stack and building it
        self._calls: list[tuple] = []  # this window's events as (kind, caller code, instruction, event)
        self._tpl: list[tuple] = [_TEMPLATE_END]  # the template window's records, then _TEMPLATE_END
        self._tpl_window: list | None = None  # the template window's pattern (as in self._windows)
        # its events split where the step's record opens: the previous step's trailing calls
        # (update, scheduler) first, then the step's own (flush() copies them at the close)
        self._tpl_head: list[dict] = []
        self._tpl_tail: list[dict] = []
        self._pos = 0  # the template record the next call must match
        # the events of the calls matched so far are appended (copied from the template) only at
        # the step's close, or before anything else reads or extends the timeline: see flush()
        self._flushed = 0  # the first template record whose event is not in the timeline yet
        self._fast_vals: dict[int, tuple] = {}  # template index -> scaler.update's (scale_before, scale_after, explicit)
        # induction: the GradScaler and optimizer of the step that closed the last window (weakly: the
        # tracer must not keep them alive), and their ids for the deferred state changes (flush())
        self._win_s = self._win_o = _DEAD
        self._win_key: tuple[int, int] = (0, 0)
        self.fast = False  # this window has matched the template so far: wrappers may take the fast path
        self.fast_steps = 0  # windows whose every event was the template's
        self.on_step = on_step  # numerics: called after every completed step
        self.steps = 0  # optimizer steps completed (scaler-skipped ones included), all optimizers
        self.stop_pending = False
        self._timeline: list[dict] = [self._new_step(0)]
        self.violations: list[dict] = []
        self.scalers: "weakref.WeakSet" = weakref.WeakSet()
        self.scaled_outputs: dict[int, tuple] = {}  # id(scaler.scale() output) -> (its weakref, scaler weakref)
        self.optimizers: "weakref.WeakSet" = weakref.WeakSet()
        self._known_optimizers: dict[int, weakref.ref] = {}  # id -> weakref: WeakSet.add makes a weakref per call
        self._scale_read: tuple | None = None  # (scale tensor, its version, value): one host read per value
        self._loss_read: tuple | None = None  # (loss tensor, its version, value): the same for the loss
        self.device_seen: dict | None = None  # the device of the first trained parameter
        self.param_dtype: str | None = None  # and its dtype
        self.created_at: dict[int, tuple] = {}  # id(optimizer) -> where it was constructed
        self.half_at: dict[int, tuple] = {}  # id(param) -> where .half()/.to(float16) made it half
        self.checked_optimizers: set[int] = set()
        self.autocast_stack: list[tuple[str, str, bool, bool]] = []  # (device, dtype, enabled, a framework's)
        # what mixed precision the script asked for and got, for the report's "precision"
        self.autocast_sites: dict[tuple[str, str, bool], dict] = {}  # (device, dtype, enabled) -> first site, count
        self.scaler_sites: list[dict] = []  # per GradScaler made: where, device, enabled asked / in effect
        self.in_scaler_step: list[dict] = []  # frames of scaler.step calls in progress
        self.in_scheduler_init = 0
        self.in_tensor_backward = False
        self.open_next = False  # a step just completed; update/scheduler/save still belong to it
        self.scheduler_where: dict | None = None
        self.before_step: Callable[["Recorder", Any], None] | None = None  # numerics, steps without a scaler
        self.after_skip: Callable[["Recorder"], None] | None = None  # numerics: a step GradScaler skipped
        self.before_backward: Callable[["Recorder"], None] | None = None  # numerics: the loss is done
        self.before_update: Callable[["Recorder", Any], None] | None = None  # numerics: before any optimizer writes
        self.before_scale: Callable[[], None] | None = None  # numerics: the loss is made, stop its watch
        self.muted = False  # numerics re-runs a forward: its autocast/backward calls are not the script's
        # the tracer's own time: every wrapper and hook adds what its bookkeeping took (perf_counter)
        self.own_s = 0.0
        self.step_marks: list[tuple[float, float]] = []  # (perf_counter, own_s) as each step completed
        self.timing = True  # the wrappers and hooks time their own code (off between samples: SAMPLE_EVERY)
        self.close_s = 0.0  # the last step close's own time (the optimizer post-hook's, timed on every step)
        self.sampled_steps = 0  # step intervals whose wrappers were not timed and were given the sample's time
        self._sample_s: float | None = None  # the last fully timed template-following window's time, its close aside
        self._interval_untimed = False  # the step being recorded is one of those
        self._own_at_mark = 0.0  # own_s at the last step's close
        self.on_stop_pending: Callable[[], None] | None = None
        self._reset_iteration()
        self.scaler_stage: dict[tuple[int, int], str] = {}  # (scaler, optimizer) -> unscaled|stepped
        self.scaler_stepped_since_update: dict[int, bool] = {}
        self.update_mark: dict[int, int] = {}  # id(scaler) -> steps completed at its last update()
        self.scaler_step_where: dict | None = None
        self.last_step_skipped = False
        self.last_step_via_scaler = False
        self.scheduler_after_scaler_steps = 0
        self.manual_flagged: set[str] = set()
        self.steps_at_scheduler: dict[int, int] = {}  # id(scheduler) -> optimizer steps at its last step()
        self.scaler_steps = 0
        self.step_unit = "optimizer"  # "backward": no torch.optim optimizer, each backward() is a step
        self.model_param_dtypes: dict[str, int] | None = None  # the forward's model, elements per dtype
        self.loss_multiplier: float | None = None  # a constant the loss was multiplied by before backward()
        self.manual_fp16_backwards = 0
        self.losses: list[torch.Tensor] = []
        self.series: list[dict] = []  # per completed step: skipped, scale, loss
        self._fused_pending: dict[int, list] = {}  # scaler id -> [(series record, its found_inf tensor)] until update()
        self.started = time.monotonic()

    @property
    def timeline(self) -> list[dict]:
        """The steps' records with their events: those of the calls the steady fast path matched
        are appended here (or at the step's close) rather than one by one."""
        if self._flushed != self._pos:
            self.flush()
        return self._timeline

    # -- bookkeeping ---------------------------------------------------------------------
    def _new_step(self, index: int) -> dict:
        if self.steady:
            return {"step": index, "events": [], "dropped_events": 0, "instruments": "steady"}
        return {"step": index, "events": [], "dropped_events": 0}

    def _reset_iteration(self) -> None:
        self.backwards: list[dict] = []  # backward calls since the last optimizer step
        self.fp16_autocast_since_step = False
        self.scaled_pending = False  # a scaled backward whose grads no unscale_ has touched
        self.unscaled_optimizers: list = []  # unscale_(optimizer) calls since the last scaled backward
        self.step_flagged: set[str] = set()

    def event(self, kind: str, where: tuple | None = None, **data: Any) -> dict:
        if where is None:  # user_frame(3), inlined: it runs for every wrapped call
            frame = sys._getframe(2)
            while frame is not None:
                code = frame.f_code
                known = _user_files.get(code.co_filename)
                if known or (known is None and is_user_file(code.co_filename)):
                    break
                frame = frame.f_back
            if frame is None:
                where = (None, None, None)
                caller = (None, -1)
            else:  # line_of(frame), its remembered case inlined: a Python call less per event
                lasti = frame.f_lasti
                hit = _lines.get((id(code), lasti))
                line = hit[1] if hit is not None and hit[0] is code and frame.f_trace is None else line_of(frame)
                where = (code.co_filename, line, code.co_name)
                caller = (code, lasti)
        else:
            caller = (None, -1)
        path, line, func = where
        ev = {"kind": kind, "path": path, "line": line, "function": func, **data}
        if self._flushed != self._pos:
            self.flush()
        if self.open_next and kind not in TRAILING:  # the first call of the next step opens it
            self.open_next = False
            self._timeline.append(self._new_step(self.steps))
        cur = self._timeline[-1]
        if len(cur["events"]) < MAX_EVENTS_PER_STEP:
            cur["events"].append(ev)
            if self.fast:  # a call without a fast path: the window stays on template if its event is the template's
                if self._tpl[self._pos][3] == ev:
                    self._pos = self._flushed = self._pos + 1
                    self._win_s = self._win_o = _DEAD  # its objects were not checked: no induction from here
                else:
                    self.fast = False
                    self.timing = True
        else:
            cur["dropped_events"] += 1
            self.fast = False
            self.timing = True
        if self.steady_after and len(self._calls) < 2 * MAX_EVENTS_PER_STEP:  # bounded: a step that never ends
            self._calls.append((kind, caller[0], caller[1], ev))
        return ev

    def overhead(self) -> dict:
        """What tracing added per step: the median over steps of the time spent in the tracer's own
        code (wrappers, hooks, step analysis, result snapshots) between two step ends, beside
        the median step (wall time from one step's end to the next, tracing included). Not timed:
        the interpreter's calls into our code and torch's dispatch to it; timed: a garbage
        collection or a wait for the CPU that falls inside our code (docs/trace.md). Sampled: on
        steady steps that follow the template only one in SAMPLE_EVERY is timed call by call;
        the others time their close and are given the last such sample's time for the rest
        (`steps_sampled` of them)."""
        marks = self.step_marks
        walls = [b[0] - a[0] for a, b in zip(marks, marks[1:])]
        owns = [b[1] - a[1] for a, b in zip(marks, marks[1:])]
        out: dict[str, Any] = {"steps_timed": len(walls), "total_s": round(self.own_s, 4),
                               "per_step_ms": None, "step_ms": None, "share": None,
                               "steps_sampled": self.sampled_steps}
        if walls:
            own, wall = statistics.median(owns), statistics.median(walls)
            out.update(per_step_ms=round(own * 1e3, 4), step_ms=round(wall * 1e3, 4),
                       share=round(own / (wall - own), 4) if wall > own else None)
        return out

    def violation(self, rule: str, ev: dict, message: str, **data: Any) -> None:
        if len(self.violations) >= MAX_VIOLATIONS:
            return
        if self._flushed != self._pos:  # its step is the timeline's last entry
            self.flush()
        self.violations.append({"rule": rule, "path": ev.get("path"), "line": ev.get("line"),
                                "function": ev.get("function"), "step": self._timeline[-1]["step"],
                                "message": message, "data": data})

    def maybe_stop(self) -> None:
        """Stop at the first call that starts a new step once N steps are done."""
        if self.stop_pending:
            self.stop_pending = False
            raise TraceStop()

    def enabled_scalers(self) -> list:
        return [s for s in list(self.scalers) if _scaler_enabled(s)]

    # -- autocast ------------------------------------------------------------------------
    def on_autocast_enter(self, ac) -> None:
        if self.muted:
            return
        if self._flushed != self._pos:  # it counts the step's events
            self.flush()
        dtype = str(getattr(ac, "fast_dtype", None)).replace("torch.", "")
        enabled = bool(getattr(ac, "_enabled", True))
        dev = getattr(ac, "device", "?")
        self.autocast_stack.append((dev, dtype, enabled, entered_by_framework(3)))
        self._autocast_enters += 1
        self._count_autocast(dev, dtype, enabled)
        if enabled and dtype == "float16":
            self.fp16_autocast_since_step = True
        if len(self._timeline[-1]["events"]) < 8:  # the first few per step; a model may enter it per layer
            self.event("autocast", device=dev, dtype=dtype, enabled=enabled)

    def _count_autocast(self, dev: str, dtype: str, enabled: bool) -> None:
        key = (dev, dtype, enabled)
        site = self.autocast_sites.get(key)
        if site is None:  # the frame walk only for a kind not seen yet (a model may enter it per layer)
            path, line, _ = user_frame(4)
            site = self.autocast_sites[key] = {"device": dev, "dtype": dtype, "enabled": enabled,
                                               "path": path, "line": line, "count": 0, "steps": set()}
        site["count"] += 1
        site["steps"].add(self._timeline[-1]["step"] if not self.open_next else self.steps)

    def precision_seen(self) -> dict:
        """The autocast regions entered (per device, dtype and whether enabled) and the
        GradScalers made: what the report's "precision" section is built from."""
        autocast = [{**{k: v for k, v in site.items() if k != "steps"}, "steps": len(site["steps"])}
                    for site in self.autocast_sites.values()]
        return {"autocast": autocast, "scalers": [dict(site) for site in self.scaler_sites],
                "param_dtype": self.param_dtype, "model_param_dtypes": self.model_param_dtypes,
                "loss_multiplier": self.loss_multiplier}

    def note_model(self, model) -> None:
        """The parameters of the model that ran the forward, by dtype: a hand-written fp16 loop
        (half weights, float32 master copies in the optimizer, as improved-diffusion's
        --use_fp16) computes in float16 although the optimizer's parameters are float32, and a
        loop without an optimizer has only these."""
        counts: dict[str, int] = {}
        first = None
        for p in model.parameters():
            if p.is_floating_point():
                first = p if first is None else first
                key = str(p.dtype).replace("torch.", "")
                counts[key] = counts.get(key, 0) + p.numel()
        self.model_param_dtypes = counts
        if self.device_seen is None and first is not None:
            self.device_seen = device_of(first)
            self.param_dtype = str(first.dtype).replace("torch.", "")

    def _frameworks_autocast(self) -> bool:
        """The innermost enabled autocast region was opened by a framework around the user's code
        (Lightning's around `training_step`): a backward or step in it is the framework's design."""
        enabled = [entry for entry in self.autocast_stack if entry[2]]
        return bool(enabled) and enabled[-1][3]

    def on_autocast_exit(self) -> None:
        if self.autocast_stack and not self.muted:
            self.autocast_stack.pop()

    # -- backward ------------------------------------------------------------------------
    def on_backward(self, tensor) -> None:
        if self.muted:
            return
        if self.before_backward is not None:
            self.before_backward(self)
        if self.stop_pending:
            self.maybe_stop()
        entry = self.scaled_outputs.get(id(tensor)) if isinstance(tensor, torch.Tensor) else None
        scaled_by = entry[1] if entry is not None and entry[0]() is tensor else None
        ev = self.event("backward", scaled=scaled_by is not None)
        ac = _autocast_now()
        if ac is not None and not self._frameworks_autocast():
            self.violation("AMP104", ev, f"backward() runs inside an enabled autocast region ({ac})",
                           autocast=ac)
        scaler = scaled_by() if scaled_by is not None else None
        record = {"ev": ev, "scaled": scaler is not None and _scaler_enabled(scaler),
                  "fp16": self.fp16_autocast_since_step}
        self.backwards.append(record)
        self._check_manual_update_fp16(record)
        if not self.created_at and len(self.backwards) > 64:  # no optimizer ever closes the iteration
            del self.backwards[:-2]
            del self.losses[:-2]
        if record["scaled"]:
            self.scaled_pending = True
            self.unscaled_optimizers = []
        if isinstance(tensor, torch.Tensor) and tensor.numel() == 1 and not record["scaled"]:
            scale = loss_scale_of(tensor)
            if scale is not None and self.loss_multiplier is None:
                self.loss_multiplier = scale
            self.losses.append(tensor.detach() / scale if scale else tensor.detach())

    def _check_manual_update_fp16(self, record: dict) -> None:
        """AMP103 for loops with no optimizer at all (word_language_model's `p.data.add_(p.grad)`):
        no optimizer step closes an iteration, so the second unscaled float16 backward confirms it."""
        if (self.steps and self.step_unit != "backward") or self.created_at or record["scaled"] \
                or not record["fp16"] or self.enabled_scalers():
            return
        self.manual_fp16_backwards += 1
        if "AMP103" in self.manual_flagged or self.manual_fp16_backwards < 2:
            return
        self.manual_flagged.add("AMP103")
        self.violation("AMP103", record["ev"], "backward() of a loss computed under float16 autocast, "
                       "without GradScaler, in a loop that updates the weights without an optimizer: small "
                       "gradients flush to zero in float16", manual_update=True)

    def after_backward(self) -> None:
        """A loop with no torch.optim optimizer (hand-written SGD, `p.data.add_(...)`) never makes
        an optimizer step, so it would never reach --steps: there each backward pass is the step
        (the weight update after it still runs; the next forward or backward stops the script)."""
        if self.muted or self.created_at or self.step_unit == "optimizer" and self.steps:
            return
        self.step_unit = "backward"
        self.complete_step(skipped=False, via_scaler=False)

    # -- GradScaler ------------------------------------------------------------------------
    def on_scaler_init(self, scaler, asked_enabled: bool | None = None) -> None:
        self.scalers.add(scaler)
        if len(self.scaler_sites) < 8:
            path, line, _ = user_frame(3)
            self.scaler_sites.append({"path": path, "line": line, "device": str(getattr(scaler, "_device", "cuda")),
                                      "enabled_asked": asked_enabled, "enabled": _scaler_enabled(scaler)})

    def on_scale(self, scaler, loss, out) -> None:
        if isinstance(out, torch.Tensor) and (getattr(scaler, "_enabled", None) is True and type(scaler).is_enabled
                                              is _IS_ENABLED or _scaler_enabled(scaler)):  # its usual answer, no call
            # kept beside the tensor, not on it: an attribute would travel with it into pickle
            key, table = id(out), self.scaled_outputs
            try:
                # the callback is table.pop(key, the dead ref) in C: no Python call when the output goes
                table[key] = (weakref.ref(out, partial(table.pop, key)), weakref.ref(scaler))
            except TypeError:
                pass
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            self.losses.append(loss.detach())

    def on_unscale(self, scaler, optimizer) -> None:
        ev = self.event("scaler.unscale_")
        self._note_optimizer(optimizer)
        key = (id(scaler), id(optimizer))
        if _scaler_enabled(scaler):
            stage = self.scaler_stage.get(key)
            if stage == "unscaled":
                self.violation("AMP112", ev, "scaler.unscale_(optimizer) is called a second time before "
                               "scaler.update() for the same optimizer")
            elif stage == "stepped":
                self.violation("AMP113", ev, "scaler.unscale_() follows a scaler.step() that was never "
                               "followed by scaler.update()")
            self._check_unscaled_backward(ev)
        self.scaler_stage[key] = "unscaled"
        self.unscaled_optimizers.append(optimizer)  # its parameters are read if a clip asks

    def on_scaler_step_enter(self, scaler, optimizer) -> dict:
        """The frame kept while the step runs says whether the scaler is enabled: the optimizer's
        hooks and the exit read it there rather than asking the scaler three more times a step."""
        if self.stop_pending:
            self.maybe_stop()
        if self.before_update is not None:
            self.before_update(self, optimizer)
        ev = self.event("scaler.step")
        self._note_optimizer(optimizer)
        enabled = _scaler_enabled(scaler)
        if self.scaler_step_where is None and enabled:
            self.scaler_step_where = {"path": ev["path"], "line": ev["line"]}
        key = (id(scaler), id(optimizer))
        if enabled:
            if self.scaler_stage.get(key) == "stepped":
                self.violation("AMP113", ev, "scaler.step(optimizer) is called again before scaler.update(): "
                               "the previous step was never followed by update()")
            self._check_unscaled_backward(ev)
        self._check_autocast_at_step(ev)
        frame = {"scaler": scaler, "optimizer": optimizer, "ran": False, "ev": ev, "enabled": enabled}
        self.in_scaler_step.append(frame)
        return frame

    def on_scaler_step_exit(self, frame: dict) -> None:
        if self._flushed != self._pos:  # the fast path's deferred state before this call's (a skipped step)
            self.flush()
        self.in_scaler_step.pop()
        scaler = frame["scaler"]
        self.scaler_stage[(id(scaler), id(frame["optimizer"]))] = "stepped"
        self.scaler_stepped_since_update[id(scaler)] = True
        if not frame["enabled"]:
            return
        self.scaler_steps += 1
        if not frame["ran"]:  # GradScaler found inf/NaN gradients and skipped optimizer.step()
            if self.after_skip is not None:
                self.after_skip(self)
            self.complete_step(skipped=True, via_scaler=True, scaler=scaler, optimizer=frame["optimizer"])
        elif getattr(frame["optimizer"], "_step_supports_amp_scaling", False) and self.series:
            # a fused optimizer: GradScaler calls its step() even on inf/NaN (the kernel skips the
            # update); its found_inf (or, without one, the scale's backoff) is read at update()
            self.series[-1]["fused_step"] = True
            self._fused_pending.setdefault(id(scaler), []).append((self.series[-1], frame.get("found_inf")))

    def _check_unscaled_backward(self, ev: dict) -> None:
        """AMP115: the scaler unscales gradients that no scaled backward produced."""
        if self.backwards and not _any_scaled(self.backwards) and "AMP115" not in self.step_flagged:
            self.step_flagged.add("AMP115")
            self.violation("AMP115", self.backwards[0]["ev"], "backward() ran on an unscaled loss, then the "
                           f"GradScaler ({ev['kind']}) unscaled (divided) those gradients by the loss scale",
                           scaler_call={"path": ev["path"], "line": ev["line"], "kind": ev["kind"]})

    def on_scaler_update_pre(self, scaler) -> None:
        """AMP109 before torch's own assertion can stop the script."""
        if self.scaler_stepped_since_update.get(id(scaler), False) or not _scaler_enabled(scaler):
            return  # the usual case first: a scaler.step() since the last update
        if self.update_mark.get(id(scaler), 0) != self.steps:
            return  # an optimizer step happened since the last update (directly: AMP116's business)
        ev = self.event("scaler.update")
        self.violation("AMP109", ev, "scaler.update() is called without a scaler.step() since the "
                       "previous update() (once per micro-batch instead of once per optimizer step)")

    def on_scaler_update(self, scaler, before: float | None, after: float | None, explicit: bool = False) -> None:
        self.event("scaler.update", scale_before=before, scale_after=after)
        self._updated(id(scaler), before, after, explicit)

    def _updated(self, sid: int, before: float | None, after: float | None, explicit: bool) -> None:
        """What scaler.update() changes in the protocol state (the full path, and the fast path's
        catch-up: see flush()), for the scaler whose id is `sid`."""
        self._update_marks(sid, after)
        self.scaler_stepped_since_update[sid] = False
        self._clear_stages(sid)
        pending = self._fused_pending.pop(sid, None)
        if pending:
            backed_off = not explicit and before is not None and after is not None and after < before
            for rec, found in pending:
                # the scale is read already (a host sync): found_inf's value costs no further wait
                skipped = bool(found.item()) if found is not None else backed_off and len(pending) == 1
                if skipped and not rec["skipped"]:
                    self._skipped_inside_step(rec)

    def _update_marks(self, sid: int, after: float | None) -> None:
        """What of scaler.update()'s changes outlasts the next scaler.step()'s exit: the step count
        at the update, and the scale after it on the step it follows."""
        self.update_mark[sid] = self.steps
        if self.series and self.series[-1].get("scaler") == sid and after is not None:
            self.series[-1]["scale_after"] = after

    def _clear_stages(self, sid: int) -> None:
        """scaler.update() ends the unscale_/step stages of its scaler's optimizers."""
        stage = self.scaler_stage
        if len(stage) == 1:  # one optimizer's stage, the usual case: no comprehension (a call) to find it
            if next(iter(stage))[0] == sid:
                stage.clear()
        else:
            for key in [k for k in stage if k[0] == sid]:
                del stage[key]

    def _skipped_inside_step(self, rec: dict) -> None:
        """The fused optimizer's step ran but its kernel skipped the update: the step is a skipped
        one, as if GradScaler had not called it."""
        rec["skipped"] = True
        self.rearm()  # judged clean at the step's end; the skip shows only now, at update()
        for entry in reversed(self._timeline):
            if entry.get("step") == rec["step"]:
                entry["skipped"] = True
                break
        if rec is self.series[-1]:
            self.last_step_skipped = True
        if self.after_skip is not None:
            self.after_skip(self)

    # -- optimizer -----------------------------------------------------------------------
    def _note_optimizer(self, optimizer) -> None:
        """Keep the optimizer (weakly) and, the first time, the device and dtype of what it
        trains: read now, since a script stopped after N steps frees its optimizer with the
        frames of its main() before the report is written."""
        known = self._known_optimizers.get(id(optimizer))
        if known is not None and known() is optimizer and self.device_seen is not None:
            return  # seen already: the usual call, every step
        self._known_optimizers[id(optimizer)] = weakref.ref(optimizer)
        self.optimizers.add(optimizer)
        if self.device_seen is None:
            param = first_param(optimizer)
            if param is not None:
                self.device_seen = device_of(param)
                self.param_dtype = str(param.dtype).replace("torch.", "")

    def on_optimizer_init(self, optimizer) -> None:
        self.created_at.setdefault(id(optimizer), user_frame(3))
        self.step_unit = "optimizer"

    def on_optimizer_pre(self, optimizer) -> None:
        frames = self.in_scaler_step
        if frames:  # scaler.step() runs the optimizer (else GradScaler skipped it)
            frame = frames[-1]
            frame["ran"] = True
            found = getattr(optimizer, "found_inf", None)  # set by GradScaler for a fused optimizer's step
            if found is not None:
                frame["found_inf"] = found
            if frame["enabled"] and optimizer is self._win_o() and self.device_seen is not None:
                return  # the last step's optimizer (induction: _bind): known, its parameters checked
        known = self._known_optimizers.get(id(optimizer))
        if known is None or known() is not optimizer or self.device_seen is None:  # _note_optimizer's early return
            self._note_optimizer(optimizer)
        if frames:
            ev = frames[-1]["ev"]
        else:
            if self.stop_pending:
                self.maybe_stop()
            if self.before_update is not None:
                self.before_update(self, optimizer)
            ev = self.event("optimizer.step", optimizer=type(optimizer).__name__)
            self._check_autocast_at_step(ev)
            if self.scaled_pending or _any_scaled(self.backwards):
                self.violation("AMP116", ev, "optimizer.step() is called directly after a scaled backward: "
                               "it applies gradients still multiplied by the loss scale and ignores inf/NaN")
        if id(optimizer) not in self.checked_optimizers:
            self.checked_optimizers.add(id(optimizer))
            self._check_half_params(optimizer, ev)
        if self.before_step is not None and not (self.in_scaler_step and self.in_scaler_step[-1]["enabled"]):
            self.before_step(self, optimizer)  # no GradScaler checked these gradients

    def _check_autocast_at_step(self, ev: dict) -> None:
        ac = _autocast_now()
        if ac is not None and "AMP105" not in self.step_flagged and not self._frameworks_autocast():
            self.step_flagged.add("AMP105")
            self.violation("AMP105", ev, f"the optimizer step runs inside an enabled autocast region ({ac})",
                           autocast=ac)

    def _check_half_params(self, optimizer, ev: dict) -> None:
        half = [p for p in _params_of(optimizer) if p.dtype in HALF]
        if not half:
            return
        total = sum(1 for _ in _params_of(optimizer))
        dtype = str(half[0].dtype).replace("torch.", "")
        where = next((self.half_at[id(p)] for p in half if id(p) in self.half_at), None)
        how = "converted by this call"
        if where is None:
            where, how = self.created_at.get(id(optimizer)) or (ev["path"], ev["line"], ev["function"]), \
                "optimizer created here"
        loc = {"path": where[0], "line": where[1], "function": where[2]}
        self.violation("AMP111", loc, f"{type(optimizer).__name__} updates {len(half)} of {total} parameters "
                       f"stored in {dtype}: no float32 master weights, small updates round away",
                       dtype=dtype, half_params=len(half), params=total, located=how,
                       optimizer_step={"path": ev["path"], "line": ev["line"]})

    # -- step boundaries --------------------------------------------------------------------
    def complete_step(self, skipped: bool, via_scaler: bool, scaler=None, optimizer=None) -> None:
        """One optimizer step finished (or was skipped by GradScaler), or one backward pass of a
        loop without an optimizer: close the step's record. `scaler` and `optimizer`: an enabled
        GradScaler's step's (the next window's fast path expects them again: induction)."""
        if self._flushed != self._pos:
            self.flush()
        if not via_scaler and self.step_unit == "optimizer":  # manual loops: above
            for b in self.backwards:
                if not b["scaled"] and b["fp16"]:
                    self.violation("AMP103", b["ev"], "backward() of a loss computed under float16 autocast, "
                                   "without GradScaler: small gradients flush to zero in float16")
                    break
        scale = self.scale_of(scaler) if scaler is not None else None
        loss = self._step_loss()
        rec = {"step": self.steps, "skipped": skipped, "via_scaler": via_scaler, "scale": scale,
               "scale_after": None, "loss": loss, "scaler": id(scaler) if scaler is not None else None}
        entry = self._timeline[-1]
        if entry.get("instruments") == "steady":
            rec["steady"] = True
            self.steady_steps += 1
        untimed = self._interval_untimed
        # a window that followed the template throughout, with one optimizer: judged without comparing
        # (while fast no event was dropped: the template's count of them is 0 too)
        on_template = self.fast and self._tpl[self._pos] is _TEMPLATE_END and len(self._known_optimizers) <= 1 \
            and self._autocast_enters == self._tpl_window[-1][1]
        if on_template:  # _judge_steady's outcome for the template's window, without comparing
            self.fast_steps += 1
            if self._calls:  # the events of calls matched on the full path
                self._calls = []
            self._trailing_from = len(entry["events"])
            self._autocast_enters = 0
            self._close_window(self._tpl_window, _clean_step(rec, self.series[-1]), True)
            self.fast = self.steady and len(entry["events"]) + len(self._tpl) <= MAX_EVENTS_PER_STEP
            if not untimed:  # the sample: this window's own time, its close aside
                self._sample_s = max(0.0, self.own_s - self._own_at_mark - self.close_s)
        elif self.steady_after:
            self._judge_steady(rec)
        if untimed:  # its wrappers' time is the sample's (a deviation mid-way is timed from there on, and added)
            self.own_s += self._sample_s
            self.sampled_steps += 1
        if self.fast and (self._win_s() is not scaler or self._win_o() is not optimizer):
            self._bind(scaler, optimizer)
        self.timing = not (self.fast and self._sample_s is not None and self.fast_steps % SAMPLE_EVERY)
        self._interval_untimed = not self.timing
        self.series.append(rec)
        self._own_at_mark = self.own_s
        if len(self.step_marks) < MAX_STEP_MARKS:
            self.step_marks.append((perf_counter(), self.own_s))
        self._timeline[-1].update({"skipped": skipped, "scale": scale, "loss": loss})
        self.last_step_skipped = skipped
        self.last_step_via_scaler = via_scaler
        self.steps += 1
        self._reset_iteration()
        if self.on_step is not None:
            self.on_step(self, rec)
        self.open_next = True
        if self.steps >= self.target and not self.stop_pending:
            self.stop_pending = True
            if self.on_stop_pending is not None:
                self.on_stop_pending()

    def _judge_steady(self, rec: dict) -> None:
        """Whether the next step may run in steady state: this step was clean (finite loss, not
        skipped, scale not lower) and its pattern (the events since the previous step: kinds,
        places, dtypes, autocast state, counts) equals the one a period back (one step, or one
        per optimizer when several take turns) for STEADY_AFTER steps in a row. A window that
        followed the template throughout is judged in complete_step, without comparing."""
        entry = self._timeline[-1]
        counts = (entry["dropped_events"], self._autocast_enters)
        calls, self._calls = self._calls, []
        period = max(1, min(len(self._known_optimizers), 4))
        prev = self._timeline[-2] if len(self._timeline) > 1 else None
        window = prev["events"][self._trailing_from:] + entry["events"] if prev is not None else list(entry["events"])
        window.append(counts)
        self._trailing_from = len(entry["events"])
        self._autocast_enters = 0
        windows = self._windows
        same = len(windows) >= period and _same_pattern(windows[-period], window)
        self._close_window(window, _clean_step(rec, self.series[-1] if self.series else None), same)
        # the next window may follow this one (its template) when steady with one optimizer, every
        # event of this one is in `calls` (none dropped, none taken from a template), and the
        # timeline has room for all of the next window's events (its first ones join this step's)
        if self.steady and period == 1 and len(calls) == len(window) - 1 and not counts[0]:
            self._tpl, self._tpl_window = _template(calls), window
            split = next((i for i, t in enumerate(calls) if t[0] not in TRAILING), len(calls))
            self._tpl_head, self._tpl_tail = [t[3] for t in calls[:split]], [t[3] for t in calls[split:]]
            self.fast = len(entry["events"]) + len(self._tpl) <= MAX_EVENTS_PER_STEP
        else:
            self.fast = False

    def _close_window(self, window: list, clean: bool, same: bool) -> None:
        """What both judgements end with: the window kept (the last four), the run of clean equal
        steps counted, and the template rewound for the next window."""
        windows = self._windows
        windows.append(window)
        if len(windows) > 4:
            del windows[0]
        self._steady_run = 0 if not clean else self._steady_run + 1 if same else 1
        self.steady = self._steady_run >= self.steady_after
        self._pos = self._flushed = 0
        if self._fast_vals:
            self._fast_vals = {}

    def recording_steady(self) -> bool:
        """The step being recorded began in steady state (between steps: the next one will)."""
        return self.steady if self.open_next else self._timeline[-1].get("instruments") == "steady"

    def rearm(self) -> None:
        """A deviation: every instrument is armed again from the next step (or now, mid-step, for
        what is armed later in it); steady state needs STEADY_AFTER clean equal steps again."""
        if self._flushed != self._pos:
            self.flush()
        self.steady = False
        self._steady_run = 0
        self.fast = False
        self.timing = True

    def peek_loss(self) -> float | None:
        """The latest (unscaled) loss of this step as a float, without closing the step."""
        if not self.losses:
            return None
        loss = self.losses[-1]
        read = self._loss_read
        if read is not None and read[0] is loss and loss._version == read[1]:  # kept only with a version
            return read[2]  # read already this step (before the optimizer wrote): no second sync
        try:
            key = loss._version
        except RuntimeError:  # an inference tensor keeps no version counter: read it each time
            key = None
        try:
            value = float(loss.item() if loss.dtype is torch.float32 else loss.float().item())
        except Exception:  # noqa: BLE001 - a loss tensor in an odd state must not break the trace
            return None
        if key is not None:
            self._loss_read = (loss, key, value)
        return value

    def scale_of(self, scaler) -> float | None:
        """A GradScaler's current scale as a float (None when disabled): read from the device once
        per value (the scale tensor's version counter tells when update() changed it)."""
        read = self._scale_read
        if read is not None:
            try:  # the value read last, the usual case (~3 a step): attributes read directly, no getattr
                if scaler._scale is read[0] and read[0]._version == read[1] and scaler._enabled is True \
                        and type(scaler).is_enabled is _IS_ENABLED:
                    return read[2]
            except AttributeError:  # a GradScaler-like object of another shape: below
                pass
        if not (getattr(scaler, "_enabled", None) is True and type(scaler).is_enabled is _IS_ENABLED
                or _scaler_enabled(scaler)):  # _scaler_enabled's usual answer without its call (~3 a step)
            return None
        try:
            t = scaler._scale
            key = t._version if isinstance(t, torch.Tensor) else None
        except Exception:  # noqa: BLE001 - a GradScaler-like object of another shape
            t = key = None
        read = self._scale_read
        if key is not None and read is not None and read[0] is t and read[1] == key:
            return read[2]
        try:  # what the stock GradScaler.get_scale() returns, without its two calls
            value = float(t.item() if key is not None and type(scaler).get_scale is _GET_SCALE
                          and scaler._enabled is True else scaler.get_scale())
        except Exception:  # noqa: BLE001 - before the first scale() the scale may not exist yet
            return None
        if key is not None:
            self._scale_read = (t, key, value)
        return value

    def _step_loss(self) -> float | str | None:
        """The (unscaled) loss of the step as a number; one host sync, once per step."""
        value = self.peek_loss()  # its remembered read when numerics asked before the optimizer wrote
        self.losses = []
        self._loss_read = None
        if value is None:
            return None
        if value != value:
            return "nan"
        if value - value:  # infinite (inf - inf is nan); finite values give 0.0
            return "inf" if value > 0 else "-inf"
        return value

    # -- other calls -------------------------------------------------------------------------
    def on_clip(self, kind: str, params: list) -> None:
        ev = self.event(kind)
        still = self._still_scaled(params)
        if still:
            with_grad = [p for p in params if isinstance(p, torch.Tensor) and p.grad is not None]
            self.violation("AMP101", ev, f"{kind} runs on gradients still multiplied by the loss scale "
                           f"({len(still)} of {len(with_grad)} parameters not unscaled): the clip threshold "
                           "is effectively divided by the scale", scaled_params=len(still))

    def _still_scaled(self, params: list) -> list:
        """The clipped parameters whose gradients a scaled backward made and no unscale_ reached."""
        if not self.scaled_pending:
            return []
        # every step, so per parameter only in C (map, set): usually unscale_ reached them all
        unscaled: set[int] = set()
        for opt in self.unscaled_optimizers:
            for group in getattr(opt, "param_groups", ()):
                unscaled.update(map(id, group.get("params", ())))
        if unscaled.issuperset(map(id, params)):
            return []
        return [p for p in params if id(p) not in unscaled and isinstance(p, torch.Tensor) and p.grad is not None]

    def on_scheduler_step(self, scheduler) -> None:
        if self.in_scheduler_init:
            return
        self._scheduler_stepped(scheduler, self.event("scheduler.step", scheduler=type(scheduler).__name__))

    def _scheduler_stepped(self, scheduler, ev: dict) -> None:
        """The scheduler's step in the protocol state, and AMP107 (both paths)."""
        # AMP107 is about a per-iteration schedule; a per-epoch one (many steps between its calls)
        # barely moves when one step of the epoch was skipped
        sid, steps, at = id(scheduler), self.steps, self.steps_at_scheduler
        since = steps - at.get(sid, 0)
        at[sid] = steps
        if not self.last_step_via_scaler:
            return
        self.last_step_via_scaler = False
        if steps and since <= max(1, len(self.created_at)):  # per iteration
            self.scheduler_after_scaler_steps += 1
            if self.scheduler_where is None:
                self.scheduler_where = {"path": ev["path"], "line": ev["line"]}
            if self.last_step_skipped:
                self.violation("AMP107", ev, f"the LR scheduler stepped right after step {steps - 1}, "
                               "which GradScaler skipped (inf/NaN gradients): the schedule runs ahead of "
                               "the optimizer", skipped_step=steps - 1)

    def on_save(self, obj) -> None:
        ev = self.event("torch.save")
        has_opt, has_scaler = _inspect_saved(obj)
        if has_opt and not has_scaler and self.enabled_scalers():
            self.violation("AMP110", ev, "torch.save() writes optimizer state but no GradScaler state while "
                           "an enabled GradScaler is in use: a resumed run restarts the loss scale")

    def on_module_to_half(self, module, dtype) -> None:
        where = user_frame(3)
        for p in module.parameters():
            if p.dtype in HALF:
                self.half_at[id(p)] = where

    # -- the steady fast path ----------------------------------------------------------------
    # On a steady step whose calls so far were the template step's, a wrapper (patches) whose
    # call is the template's next record `t` (self._tpl[self._pos]: the same kind, made from the
    # same code object and instruction, so the same file, line and function the full event()
    # would find) makes the protocol state changes of its `on_*` method itself, after checking
    # that the method would record no violation and change nothing else (else the method runs,
    # and the window leaves the fast path when its event is not the template's); it walks no
    # stack and builds no event: the template's events are appended by flush(), at the step's
    # close or before anything reads or extends the timeline. scaler.update, unscale_ and
    # scaler.step check by induction (_bind, _template) and the first two leave their state
    # changes to flush() too. Exact by construction: tests/test_trace_fastpath.py plants a
    # deviation at every call of a steady step and compares the violations, the timeline, the
    # step series and the protocol state with --no-steady's.
    def flush(self) -> None:
        """Catch up with the calls matched since the last flush, in order, as their full paths would
        have: append their events (copies of the template's, scaler.update's with its own scale
        values) and make the state changes the fast path defers (scaler.update's, and the stage
        scaler.unscale_ sets). For a whole window, at its close, only what outlasts the closing
        scaler.step()'s exit is set (it runs next, also when the step fails): the update's step
        mark and scale, and, when other stages are kept, the update's clearing of its scaler's."""
        tpl, vals, timeline = self._tpl, self._fast_vals, self._timeline
        head = self._tpl_head
        if not self._flushed and self._pos == len(tpl) - 1 and self.open_next:  # the whole window, at its close
            events = timeline[-1]["events"]
            start = len(events)
            events.extend(map(dict, head))
            if self._tpl_tail:
                self.open_next = False
                timeline.append(self._new_step(self.steps))
                timeline[-1]["events"].extend(map(dict, self._tpl_tail))
            for i, (before, after, explicit) in vals.items():
                ev = events[start + i] if i < len(head) else timeline[-1]["events"][i - len(head)]
                ev["scale_before"], ev["scale_after"] = before, after
                if explicit is not None:  # deferred (None: made in the wrapper)
                    self._update_marks(self._win_key[0], after)
                    if len(self.scaler_stage) != 1:  # the one left is this step's, which its exit sets
                        self._clear_stages(self._win_key[0])
            self._flushed = self._pos
            return
        for i in range(self._flushed, self._pos):
            t = tpl[i]
            ev = dict(t[3])
            if i in vals:
                before, after, explicit = vals[i]
                ev["scale_before"], ev["scale_after"] = before, after
                if explicit is not None:
                    self._updated(self._win_key[0], before, after, explicit)
            elif t[0] == "scaler.unscale_":
                self.scaler_stage[self._win_key] = "unscaled"
            if self.open_next and t[0] not in TRAILING:
                self.open_next = False
                timeline.append(self._new_step(self.steps))
            timeline[-1]["events"].append(ev)
        self._flushed = self._pos

    def _bind(self, scaler, optimizer) -> None:
        """The next window's fast path expects this step's GradScaler (a stock one) and optimizer
        again: with them, every earlier call of the window having matched the template, the
        protocol state is the template's (induction: docs/trace.md, "Steady state")."""
        if scaler is None or optimizer is None or type(scaler).is_enabled is not _IS_ENABLED:
            self._win_s = self._win_o = _DEAD
            return
        self._win_s, self._win_o = weakref.ref(scaler), weakref.ref(optimizer)
        self._win_key = (id(scaler), id(optimizer))



def _template(calls: list[tuple]) -> list[tuple]:
    """The template's records, each with what its fast path compares precomputed (_with_fast_key)
    and whether the protocol state at it is known clean by induction: for scaler.unscale_ and
    scaler.step, a scaler.update earlier in the window cleared the stage and no unscale_ (for
    unscale_) or step (for both) set it again (scaler.update's own check reads live state, caught
    up first). Then _TEMPLATE_END."""
    out, updated, unscaled, stepped = [], False, False, False
    for t in calls:
        kind = t[0]
        if kind == "scaler.update":
            clean, updated, unscaled, stepped = True, True, False, False
        else:
            clean = updated and not stepped and not (kind == "scaler.unscale_" and unscaled)
            unscaled = unscaled or kind == "scaler.unscale_"
            stepped = stepped or kind == "scaler.step"
        out.append((*_with_fast_key(t), clean))
    out.append(_TEMPLATE_END)
    return out


def _with_fast_key(t: tuple) -> tuple:
    """A template record with what its fast path compares precomputed: for an autocast entry
    the device, the dtype object, enabled, its autocast_stack entry, its site key, and whether it
    is float16 (as on_autocast_enter computes them from the object)."""
    kind, ev = t[0], t[3]
    if kind != "autocast":
        return (*t, None)
    dev, dtype, enabled = ev["device"], ev["dtype"], ev["enabled"]
    obj = getattr(torch, dtype, None) if isinstance(dtype, str) else None
    if not isinstance(obj, torch.dtype) or str(obj).replace("torch.", "") != dtype:
        obj = object()  # matches no autocast: its calls take the full path
    return (*t, (dev, obj, enabled, (dev, dtype, enabled, False), (dev, dtype, enabled),
                 enabled and dtype == "float16"))


def _clean_step(rec: dict, last: dict | None) -> bool:
    """A step steady state may follow: not skipped, a finite loss, the scale not lower than the
    last step's."""
    scale, loss = rec["scale"], rec["loss"]
    return (not rec["skipped"] and type(loss) is float and math.isfinite(loss)
            and (last is None or scale == last["scale"]
                 or scale is not None and last["scale"] is not None and scale > last["scale"]))


def _same_pattern(a: list, b: list) -> bool:
    """Two steps' windows record the same calls: equal events (the loss scale's values aside: a
    scale that grew is the same step) and the same counts."""
    if a == b:  # the usual case, compared in C
        return True
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x == y:
            continue
        if not (type(x) is dict and type(y) is dict and x.get("kind") == y.get("kind") == "scaler.update"):
            return False
        if {k: v for k, v in x.items() if k not in SCALE_KEYS} != {k: v for k, v in y.items() if k not in SCALE_KEYS}:
            return False
    return True


def _any_scaled(backwards: list[dict]) -> bool:
    """A backward of this iteration ran on a GradScaler's output (a loop: runs every step)."""
    for b in backwards:
        if b["scaled"]:
            return True
    return False


def _scaler_enabled(scaler) -> bool:
    enabled = getattr(scaler, "_enabled", None)  # what GradScaler.is_enabled() returns: ~10 calls a step
    if type(enabled) is bool and type(scaler).is_enabled is _IS_ENABLED:
        return enabled
    try:
        return bool(scaler.is_enabled())
    except Exception:  # noqa: BLE001
        return False


_IS_ENABLED = torch.amp.GradScaler.is_enabled
_GET_SCALE = torch.amp.GradScaler.get_scale


def first_param(optimizer) -> torch.Tensor | None:
    return next(iter(_params_of(optimizer)), None)


def device_of(param: torch.Tensor) -> dict:
    """{"type", "index", "name"} of the device a parameter lives on (a GPU by its name)."""
    dev = param.device
    name = dev.type
    if dev.type == "cuda":
        try:
            name = torch.cuda.get_device_name(dev)
        except Exception:  # noqa: BLE001
            pass
    return {"type": dev.type, "index": dev.index, "name": name}


def _params_of(optimizer):
    for group in getattr(optimizer, "param_groups", ()):
        for p in group.get("params", ()):
            yield p


def _inspect_saved(obj, depth: int = 0) -> tuple[bool, bool]:
    """(holds optimizer state, holds GradScaler state) for what torch.save is given."""
    if isinstance(obj, torch.optim.Optimizer):
        return True, False
    if isinstance(obj, torch.amp.GradScaler):
        return False, True
    if depth > 3:
        return False, False
    if isinstance(obj, dict):
        keys = set(k for k in obj.keys() if isinstance(k, str))
        opt = {"state", "param_groups"} <= keys
        scaler = "growth_factor" in keys and "scale" in keys or any("scaler" in k.lower() for k in keys)
        for v in obj.values():
            o, s = _inspect_saved(v, depth + 1)
            opt, scaler = opt or o, scaler or s
        return opt, scaler
    if isinstance(obj, (list, tuple)):
        opt = scaler = False
        for v in obj:
            o, s = _inspect_saved(v, depth + 1)
            opt, scaler = opt or o, scaler or s
        return opt, scaler
    return False, False


MIN_LOSS_SCALE = 128.0  # a constant factor this large on the loss is loss scaling, not a loss weight


def loss_scale_of(tensor) -> float | None:
    """The loss scale of `(loss * 2 ** k).backward()`, hand-written loss scaling (improved-
    diffusion's `2 ** lg_loss_scale`, lg growing by 1e-3 a step): a constant factor of at least
    MIN_LOSS_SCALE on the tensor backpropagated (a loss weight of 0.5 or 10 is not one)."""
    node = getattr(tensor, "grad_fn", None)
    if type(node).__name__ != "MulBackward0":
        return None
    try:
        other = node._saved_other
        if not (isinstance(other, torch.Tensor) and other.numel() == 1 and not other.requires_grad):
            return None
        value = float(other)
    except (RuntimeError, AttributeError, TypeError, ValueError):
        return None
    return value if math.isfinite(value) and value >= MIN_LOSS_SCALE else None
