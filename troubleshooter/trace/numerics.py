"""Where a traced run goes non-finite: the nanhunt hooks of the engine, attached to the model
the optimizer trains.

With `--nan` the hooks are on from the first forward and analyse every step (device-side
min/max, one host sync per step); the root call's inputs are kept, so a non-finite value made
by a module's own code under fp16 gets the same float32 check as in plain mode. Without it only
the model's outermost call is watched (its inputs kept, one hook capturing the gradient of its
output): when a step without GradScaler has a non-finite loss or gradient, that step's forward
(and backward from the captured output gradient) is re-run with the hooks on before the
optimizer writes anything, with RNG state and buffers restored afterwards; when GradScaler skips
a step (its parameters stay untouched), the hooks are attached for the next few steps instead.
`--headroom` measures how many gradient elements the loss scale leaves below float16's range.
"""
from __future__ import annotations

import gc
import inspect
import math
import sys
from contextlib import contextmanager
from functools import partial
from time import perf_counter

import torch
from torch import nn

from ..engine.hook_registry import ours, remove
from ..engine.nanhooks import HOOK_ENTRY_POINTS, HookSet, _tensors, number
from ..engine.nonfinite_findings import blamed_module, made_by
from .locate import is_user_file
from .nonfinite_event import is_real
from .outside import OutsideOps
from .recorder import Recorder, _autocast_now

RECHECK_STEPS = 3  # plain mode: steps hooked after a non-finite or skipped one
MAX_EVENTS = 50
MAX_SKIP_RERUNS = 3  # plain mode: skipped steps re-run with hooks
MAX_KEPT_OUTPUT_ELEMENTS = 64 * 2**20  # plain mode: output gradients kept for a backward re-run
MAX_ARMS = 3  # plain mode: times the hooks are attached after a non-finite or skipped step
FP16_TINY = 2.0 ** -24  # smallest float16 subnormal: scaled gradients below it become 0


@contextmanager
def _state_restored(model: nn.Module):
    """A re-run of the script's step must leave no trace: RNG streams (dropout) and buffers
    (BatchNorm running statistics) are put back as they were."""
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    try:
        yield
    finally:
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)


making_module = made_by  # the engine's reading: one place decides which module made a value


def _call_kwargs(module: nn.Module) -> dict | None:
    """The keyword arguments of the module call being made: global forward pre-hooks get only
    the positional ones (`model(x, labels=y)` - the HF style - computes its loss from `labels`),
    so read them from `Module._call_impl`'s frame; None when it cannot be found."""
    frame = sys._getframe(2)
    for _ in range(8):
        if frame is None:
            break
        if frame.f_code.co_name == "_call_impl" and frame.f_locals.get("self") is module:
            kwargs = frame.f_locals.get("kwargs")
            return dict(kwargs) if isinstance(kwargs, dict) else None
        frame = frame.f_back
    return None


class _TimedHookSet(HookSet):
    """The engine's NaN-hunt hooks, each hook call's time added to the recorder's own time (the
    report's "tracing added about X ms per step")."""

    def __init__(self, model: nn.Module, meter: Recorder):
        super().__init__(model)
        self._meter = meter


def _timed(method):
    def timed(self, *args):
        started = perf_counter()
        try:
            return method(self, *args)
        finally:
            self._meter.own_s += perf_counter() - started
    timed.__name__ = timed.__qualname__ = method.__name__
    return timed


for _name in HOOK_ENTRY_POINTS:  # the hooks registered
    setattr(_TimedHookSet, _name, _timed(getattr(HookSet, _name)))


def _keep_grad(kept: dict, index: int, output_nr: int, grad_outputs: tuple) -> None:
    """A node pre-hook: keep the gradient of the node's output `output_nr` as kept[index]."""
    if output_nr < len(grad_outputs) and grad_outputs[output_nr] is not None:  # as a tensor hook: only a real gradient
        kept[index] = grad_outputs[output_nr]


def _precision(autocast: str | None, dtype: str | None) -> str:
    d = autocast or dtype or "float32"
    return {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}.get(d, d)


class Numerics:
    """Attaches HookSets, collects one report per step, keeps the non-finite events."""

    def __init__(self, rec: Recorder, nan: bool, headroom: bool):
        self.rec = rec
        self.nan = nan
        self.headroom = headroom
        self.hooks: HookSet | None = None
        self.model: nn.Module | None = None
        self.mode = "nan" if nan else "on-demand"
        self.events: list[dict] = []
        self.rechecks_left = 0
        self.arms_left = MAX_ARMS
        self.rechecked_steps: list[int] = []
        self.checked_steps = 0
        self.params_nonfinite: list[str] = []
        self.headroom_steps: list[dict] = []
        # the root model's one pre-hook (runs first) and one post-hook (runs last): what they do
        self._root_hooks: list = []
        self._root_model: nn.Module | None = None
        self._keeping_inputs = False  # the root call's inputs (plain mode; --nan: the float32 reference)
        self._keeping_grads = False  # plain mode: its output's gradient, for a backward re-run
        self._last_in: tuple | None = None
        self._out_grads: dict[int, torch.Tensor] = {}
        self.reruns = 0
        self.skip_reruns = 0
        self.rerun_error: str | None = None
        self.last_rerun_step: int | None = None
        self.outside = OutsideOps()  # the loss computed from the model's output, outside it
        self.outside_event: dict | None = None
        self.collapse_checked = False
        self.collapse_event: dict | None = None  # --nan: a half-precision forward collapse
        self.outside.meter = rec
        # steady-state steps that went non-finite while an instrument that would have localised
        # it was standing down (docs/trace.md, "Steady state"); the next such step is localised
        self.steady_unlocalised: list[dict] = []
        self.steady_reruns = 0  # forward-only re-runs of steady steps not counted as re-runs
        if nan:  # --nan localises every step: nothing stands down
            rec.steady_after = 0
        rec.before_backward = self._end_outside
        rec.before_scale = self.outside.disarm
        rec.before_update = self._check_outside
        self._discover = nn.modules.module.register_module_forward_pre_hook(self._first_forward)
        if not nan:
            rec.before_step = self.before_step
            rec.after_skip = self.after_skip

    # -- finding the model -----------------------------------------------------------------
    def _first_forward(self, module: nn.Module, args: tuple) -> None:
        """The outermost module of the first forward with trainable parameters: hooked (--nan)
        or watched (plain); its own hooks are added too late for this call, so run them now."""
        if self.hooks is not None or not any(p.requires_grad for p in module.parameters()):
            return None
        self._remove_discovery()
        if self.nan:
            self._attach(module)
            self.hooks._pre(0, module, args, {})
        else:
            self._start_watch(module)
        kwargs = _call_kwargs(module)
        if kwargs is None:  # unknown: a re-run without them would not be the step that failed
            self._last_in = None
        else:
            self._keep_inputs(module, args, kwargs)
        return None

    # -- both modes: the root call's hooks -------------------------------------------------------
    def _watch_root(self, model: nn.Module) -> None:
        """One pre-hook and one post-hook on the model's outermost call, whatever they have to do:
        each hook on a module costs a Python call per forward. The pre-hook goes first so the loss
        watch stops before anything else runs in the call; the post-hook is (re-)registered last,
        after any HookSet's, so the watch starts only once every hook of ours is done (our own
        bookkeeping would otherwise pass through the loss watch's mode, op by op)."""
        self._unwatch_root()
        self._root_model = model
        self._root_hooks = [ours(model.register_forward_pre_hook(self._root_pre, with_kwargs=True, prepend=True)),
                            ours(model.register_forward_hook(self._root_post))]

    def _unwatch_root(self) -> None:
        for handle in self._root_hooks:
            remove(handle)
        self._root_hooks = []
        self._root_model = None

    def _root_pre(self, module, args, kwargs):
        rec, outside = self.rec, self.outside
        started = perf_counter() if rec.timing else 0.0
        if outside.armed or outside._pushed:  # else disarm() has nothing to do
            outside.disarm()
        if self._keeping_inputs:
            self._keep_inputs(module, args, kwargs)
        if not rec.muted:  # a re-run's time is counted by the call that made it
            if rec.steady is (len(self._root_hooks) == 2) and self.hooks is None:
                self._steady_post_hook(module)
            if started:
                rec.own_s += perf_counter() - started
        return None

    def _steady_post_hook(self, module) -> None:
        """Steady state: the post-hook has nothing to do, so it is removed (its call and torch's
        loop over the model's forward hooks are saved); out of it, added back, last again. Run
        from the pre-hook, before torch reads the forward hooks for this call."""
        if self.rec.steady:
            remove(self._root_hooks.pop())
        else:
            self._root_hooks.append(ours(module.register_forward_hook(self._root_post)))

    def _root_post(self, module, args, output) -> None:
        started = perf_counter()
        if self.rec.steady:  # steady state: the output-gradient keeper and the loss watch stand down
            if not self.rec.muted:
                self.rec.own_s += perf_counter() - started
            return None
        if self._keeping_grads:
            self._keep_output_grads(module, args, output)
        # the ops run on this model's output until backward(), its next call or the step
        if not self.rec.muted:
            if self.outside_event is None and torch.is_grad_enabled():
                self.outside.arm(_autocast_now())
            self.rec.own_s += perf_counter() - started
        return None

    def _end_outside(self, rec: Recorder) -> None:
        if self.outside.armed or self.outside._pushed:  # else disarm() has nothing to do (every step)
            self.outside.disarm()
        if not rec.created_at:  # no optimizer (weights updated by hand): no step will read them
            self.outside.clear()

    def _check_outside(self, rec: Recorder, optimizer=None) -> None:
        """Before the optimizer writes: if the step's loss is not finite, which recorded op made it
        (with --nan also: finite loss, non-finite gradients, which op's derivative made them)."""
        if self.outside.armed or self.outside._pushed:  # else disarm() has nothing to do (every step)
            self.outside.disarm()
        if self.outside_event is None and not self.outside.records and rec.recording_steady():
            loss = rec.peek_loss()  # read for the step record anyway: no second sync
            if loss is not None and not math.isfinite(loss):
                self._steady_miss(rec, loss, "loss")
            return
        if self.outside_event is not None or not self.outside.records:
            return
        loss = rec.peek_loss()
        if loss is None:
            return
        if not math.isfinite(loss):
            found = self._outside_scan(self.outside.scan, rec.steps)
            if found is not None:
                found["loss"] = "nan" if loss != loss else ("inf" if loss > 0 else "-inf")
                self._keep_outside(found)
        elif self.nan and optimizer is not None and _grads_nonfinite(optimizer):
            self.outside_backward(rec, loss)

    def outside_backward(self, rec: Recorder, loss: float) -> None:
        """Finite loss, non-finite gradients, no GradScaler scaling them (its calibration overflows
        on purpose): the loss op whose derivative is not finite at the values it got."""
        if self.outside_event is not None or not self.outside.records or any(b["scaled"] for b in rec.backwards):
            return
        found = self._outside_scan(self.outside.scan_backward, rec.steps)
        if found is not None:
            found["loss"] = loss
            self._keep_outside(found)

    def _outside_scan(self, scan, step: int) -> dict | None:
        try:
            return scan(step)
        except Exception as exc:  # noqa: BLE001 - best effort; the module hooks' finding remains
            self.rerun_error = f"{type(exc).__name__}: {exc}"[:300]
            return None

    def _keep_outside(self, found: dict) -> None:
        found["precision"] = _precision(found["autocast"], found["dtype"])
        self.outside_event = found
        self.outside.clear()

    # -- plain mode: watch the root call, re-run a failing step ---------------------------------
    def _start_watch(self, model: nn.Module) -> None:
        self._stop_watch()
        self.model = model
        self._keeping_inputs = self._keeping_grads = True
        if self._root_model is not model:
            self._watch_root(model)

    def _stop_watch(self) -> None:
        self._keeping_inputs = self._keeping_grads = False
        self._last_in = None
        self._out_grads = {}

    def _keep_inputs(self, module, args, kwargs):
        first = args[0] if args else None
        if type(first) is torch.Tensor:
            device = "cpu" if first.is_cpu else first.device.type  # is_cpu: no device object made
        else:
            device = next((t.device.type for t in _tensors(args)), "cpu")
        try:
            ac = (device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
        except (RuntimeError, TypeError):
            ac = (device, False, None)
        self._last_in = (args, kwargs, ac)
        self._out_grads = {}
        return None

    def _keep_output_grads(self, module, args, output) -> None:
        if not torch.is_grad_enabled():
            return None
        if type(output) is torch.Tensor:  # the usual output, without the generic walk (every step)
            outs = [output] if output.requires_grad else []
        else:
            outs = [t for t in _tensors(output) if t.requires_grad]
        size = 0
        for t in outs:
            size += t.numel()
        if size > MAX_KEPT_OUTPUT_ELEMENTS:
            return None  # e.g. a large vocabulary's logits: the re-run then localises the forward only
        for i, t in enumerate(outs):
            node = t.grad_fn
            if node is not None:  # a pre-hook on the node that made t: a fraction of t.register_hook's cost
                node.register_prehook(partial(_keep_grad, self._out_grads, i, t.output_nr))
            else:
                t.register_hook(partial(self._out_grads.__setitem__, i))
        return None

    def before_step(self, rec: Recorder, optimizer) -> None:
        """No GradScaler checked this step: if its loss or gradients are non-finite, localise it
        now, while the parameters are still the ones that produced it."""
        if self.reruns or self.model is None or self._last_in is None or any(is_real(e) for e in self.events):
            return
        loss = rec.peek_loss()
        bad = loss is not None and not math.isfinite(loss)
        if not bad:
            bad = _grads_nonfinite(optimizer)
        if bad and loss is not None and math.isfinite(loss):
            self.outside_backward(rec, loss)
        if bad:
            steady = self._in_steady_state(rec)
            found = len(self.events)
            self.reruns += 1
            try:
                self._rerun(rec, loss)
            except Exception as exc:  # noqa: BLE001 - the re-run is a best effort; fall back to re-checks
                self.rerun_error = f"{type(exc).__name__}: {exc}"[:300]
            if steady and not any(is_real(e) for e in self.events[found:]):
                # no output gradient was kept for a backward re-run: the next such step gets one
                if self._steady_rerun_spared():
                    self.reruns -= 1
                self._steady_miss(rec, loss, "loss" if loss is not None and not math.isfinite(loss) else "gradients")

    def after_skip(self, rec: Recorder) -> None:
        """GradScaler skipped the step, so the parameters are untouched: re-run it with hooks (a few
        times at most: calibration skips are normal and only show a scaled-gradient overflow)."""
        if self.skip_reruns >= MAX_SKIP_RERUNS or self.model is None or self._last_in is None \
                or any(is_real(e) for e in self.events):
            return
        steady = self._in_steady_state(rec)
        found = len(self.events)
        self.skip_reruns += 1
        try:
            self._rerun(rec, rec.peek_loss(), skipped=True)
        except Exception as exc:  # noqa: BLE001 - best effort; the re-check of later steps remains
            self.rerun_error = f"{type(exc).__name__}: {exc}"[:300]
        if steady and not self.events[found:] and self._steady_rerun_spared():
            self.skip_reruns -= 1  # a forward-only re-run: the next skip gets the whole one

    # -- steady state ------------------------------------------------------------------------
    @staticmethod
    def _in_steady_state(rec: Recorder) -> bool:
        """This step runs with the loss watch and the output-gradient keeper standing down; a
        non-finite step re-arms them from the next step (the step's record says it was steady)."""
        steady = rec.recording_steady()
        rec.rearm()
        return steady

    def _steady_rerun_spared(self) -> bool:
        """A steady step's re-run (forward only) does not use up the whole re-runs the next such
        step gets, a few times per run: each is a forward, and a run that skips often would
        otherwise pay one every few steps."""
        if self.steady_reruns >= MAX_SKIP_RERUNS:
            return False
        self.steady_reruns += 1
        return True

    def _unlocalised(self) -> list[dict]:
        """The steady misses that nothing localised later in the same step (a module's forward
        re-run may still name it)."""
        named = {e["step"] for e in self.events if is_real(e)}
        return [m for m in self.steady_unlocalised if m["step"] not in named]

    def _steady_miss(self, rec: Recorder, loss: float | None, what: str) -> None:
        """A non-finite loss or gradient on a steady step that nothing localised: said plainly in
        the report; the instruments are armed again, so the next occurrence is localised."""
        rec.rearm()
        if any(m["step"] == rec.steps for m in self.steady_unlocalised) or len(self.steady_unlocalised) >= MAX_EVENTS:
            return
        self.steady_unlocalised.append({
            "step": rec.steps, "nonfinite": what,
            "loss": None if loss is None else (loss if math.isfinite(loss) else
                                               "nan" if math.isnan(loss) else "inf" if loss > 0 else "-inf"),
            "autocast": _autocast_of_step(rec.timeline[-1]),
            "standing_down": ["loss watch", "output-gradient keeper"]})

    def _rerun(self, rec: Recorder, loss: float | None, skipped: bool = False) -> None:
        model = self.model
        args, kwargs, (device, ac_on, ac_dtype) = self._last_in
        grads_out = dict(self._out_grads)
        params = [p for p in model.parameters() if p.requires_grad]
        self._stop_watch()
        hooks = HookSet(model).attach()
        rec.muted = True
        try:
            with _state_restored(model):
                with torch.enable_grad(), torch.autocast(device, dtype=ac_dtype, enabled=bool(ac_on)):
                    out = model(*args, **kwargs)
                outs = [t for t in _tensors(out) if t.requires_grad]
                if outs and len(grads_out) == len(outs) and params:
                    torch.autograd.grad(outs, params, grad_outputs=[grads_out[i] for i in range(len(outs))],
                                        allow_unused=True)
                report = hooks.collect()
                hooks.detach()
                reference = self._fp32_reference(model, args, kwargs, device, ac_on, ac_dtype, report.forward)
            if report.forward is None and report.backward is not None and not self.collapse_checked:
                # a finite forward with non-finite gradients: a forward that collapsed (an inf
                # swallowed into zeros) is the cause, and the finding to give
                self.collapse_checked = True
                self._collapse_of((args, kwargs, (device, ac_on, ac_dtype)), rec.steps)
        finally:
            rec.muted = False
            hooks.detach()
            self._start_watch(model)
        step = {"step": rec.steps, "skipped": skipped,
                "loss": None if loss is None else (loss if math.isfinite(loss) else ("nan" if loss != loss else "inf"))}
        self.last_rerun_step = rec.steps
        self._record(report, step, "re-run of the failing step")
        if reference is not None and self.events and self.events[-1]["forward"] is report.forward:
            self.events[-1]["reference"] = reference

    @staticmethod
    def _fp32_reference(model, args, kwargs, device, ac_on, ac_dtype, fwd) -> dict | None:
        """fp16 only, when the first non-finite value was made by a module's own code (not a
        submodule): is that module's output finite with autocast off? Then it is an fp16 overflow
        (`q @ k.T` past 65504 turning into NaN in the softmax), not a NaN of the code itself.
        Runs inside the re-run, before buffers and RNG state are restored."""
        maker = making_module(fwd)
        if maker is None or not ac_on or ac_dtype != torch.float16:
            return None
        try:
            sub = model.get_submodule(maker)
        except AttributeError:
            return None
        seen: dict = {}

        def check(module, inputs, output):
            if "finite" not in seen:
                seen["finite"] = all(bool(torch.isfinite(t).all()) for t in _tensors(output) if t.is_floating_point())
                seen["max_abs"] = max((float(t.detach().abs().max()) for t in _tensors(output)
                                       if t.is_floating_point() and t.numel()), default=0.0)

        handle = sub.register_forward_hook(check)
        try:
            with torch.no_grad(), torch.autocast(device, enabled=False):
                model(*args, **kwargs)
        finally:
            handle.remove()
        if "finite" not in seen:
            return None
        return {"precision": "fp32", "module": maker, "finite": seen["finite"], "max_abs": number(seen["max_abs"])}

    def _remove_discovery(self) -> None:
        if self._discover is not None:
            self._discover.remove()
            self._discover = None

    def _attach(self, model: nn.Module) -> None:
        self.model = model
        self.hooks = _TimedHookSet(model, self.rec).attach()
        if self.nan:  # --nan: the root call's inputs, for the float32 reference
            self._keeping_inputs = True
        self._watch_root(model)  # after the HookSet's hooks: see _watch_root

    def _detach(self) -> None:
        if self.hooks is not None:
            self.hooks.detach()
            self.hooks = None
        if self.nan:
            self._stop_watch()

    def trained_model(self) -> nn.Module | None:
        """The module owning most of the parameters the optimizers update (the root on ties)."""
        params = {id(p) for opt in list(self.rec.optimizers) for g in opt.param_groups for p in g["params"]}
        if not params:
            return None
        best, best_key = None, (0, 0)
        for obj in gc.get_objects():
            if issubclass(type(obj), nn.Module):  # type(), not isinstance: no __class__ lookups on odd objects
                try:
                    hit = sum(1 for p in obj.parameters() if id(p) in params)
                except Exception:  # noqa: BLE001 - a half-built module
                    continue
                if hit:
                    key = (hit, sum(1 for _ in obj.modules()))
                    if key > best_key:
                        best, best_key = obj, key
        return best

    # -- per step ----------------------------------------------------------------------------
    def on_step(self, rec: Recorder, step: dict) -> None:
        outside = self.outside
        if outside.records or outside.dropped or outside.kept_elements:
            outside.clear()  # the step is done: let its loss tensors go
        loss = step["loss"]
        if not (self.nan or self.headroom or self.hooks is not None or step["skipped"] or step["step"] == 0) \
                and type(loss) is float and loss - loss == 0.0 and (rec.model_param_dtypes is not None or self.model is None):
            return  # plain mode, a finite step, nothing being re-checked: nothing below applies (every step)
        if rec.model_param_dtypes is None and self.model is not None:
            rec.note_model(self.model)
        if not self.nan and step["step"] == 0 and rec.optimizers:
            self._check_watched_model()
        if self.headroom:
            self._measure_headroom(step)
        if self.hooks is not None:
            self._collect(step)
        if self.nan and not self.collapse_checked and isinstance(step.get("loss"), float) and not step["skipped"]:
            self._check_collapse(step)
        if self.nan and self.hooks is None and rec.optimizers:
            model = self.trained_model()  # the model was not called as a module, or another one was
            if model is not None:
                self._remove_discovery()
                self._attach(model)
        if not self.nan and self.hooks is None and self.arms_left > 0 and _nonfinite_step(step) \
                and not any(is_real(e) for e in self.events) and not self._rerun_covered(step):
            self.arms_left -= 1
            model = self.model or self.trained_model()
            if model is not None:
                self.params_nonfinite = _nonfinite_params(model)
                self._attach(model)
                self.rechecks_left = RECHECK_STEPS
        if self.hooks is not None and not self.nan:  # re-checking steps: everything stays armed
            rec.rearm()

    def _collect(self, step: dict) -> None:
        report = self.hooks.collect()
        self.checked_steps += 1
        if not self.nan:
            self.rechecked_steps.append(step["step"])
            self.rechecks_left -= 1
        if self.nan and step["step"] == 0 and self.rec.optimizers:
            self._check_model_is_trained()
        recorded = len(self.events)
        self._record(report, step, self.mode)
        if self.nan and len(self.events) > recorded:
            self._nan_reference(self.events[-1], report)
        done = not self.nan and (self.rechecks_left <= 0 or any(is_real(e) for e in self.events))
        if done:
            self._detach()

    def _nan_reference(self, event: dict, report) -> None:
        """--nan: the float32 check the plain-mode re-run makes, after the step. A module whose own
        code made the first non-finite value under fp16 autocast runs once more on the step's
        inputs with autocast off; finite there means an fp16 overflow (AMP202), not a bug of the
        code (AMP205). Only while the parameters are still finite (GradScaler skipped the step, so
        they are the ones that made it)."""
        if self._last_in is None or self.model is None or making_module(report.forward) is None:
            return
        args, kwargs, (device, ac_on, ac_dtype) = self._last_in
        if not ac_on or ac_dtype != torch.float16:
            return
        model = self.model
        if _nonfinite_params(model):  # the optimizer already wrote non-finite values: not the step's model
            return
        self.hooks.detach()
        self.rec.muted = True
        try:
            with _state_restored(model):
                reference = self._fp32_reference(model, args, kwargs, device, ac_on, ac_dtype, report.forward)
        except Exception as exc:  # noqa: BLE001 - best effort: the AMP205 finding stands without it
            self.rerun_error = f"{type(exc).__name__}: {exc}"[:300]
            reference = None
        finally:
            self.rec.muted = False
            self._attach(model)
        if reference is not None:
            event["reference"] = reference

    def _check_collapse(self, step: dict) -> None:
        """--nan, once: the first finite step's forward, re-run in its half precision and in
        float32, for a module output that collapsed (AMP212, trace/collapse.py)."""
        if self.model is None or self._last_in is None:
            return
        self.collapse_checked = True
        hooks, self.hooks = self.hooks, None
        if hooks is not None:
            hooks.detach()
        self.rec.muted = True
        try:
            self._collapse_of(self._last_in, step["step"])
        finally:
            self.rec.muted = False
            if hooks is not None:
                self._attach(self.model)

    def _collapse_of(self, last_in: tuple, step: int) -> None:
        """Run the collapse check (trace/collapse.py) on the model and these inputs; keep what it finds."""
        from . import collapse

        try:
            found = collapse.check(self.model, last_in, _state_restored)
        except Exception as exc:  # noqa: BLE001 - best effort: the run's other findings stand
            self.rerun_error = f"{type(exc).__name__}: {exc}"[:300]
            found = None
        if found is not None:
            found.update(step=step, where=module_source(self.model, found["collapse"]["module"]))
            self.collapse_event = found

    def _rerun_covered(self, step: dict) -> bool:
        """A re-run already looked at this step (and found it a calibration skip, or nothing)."""
        return self.last_rerun_step == step["step"] and not self.rerun_error

    def _record(self, report, step: dict, mode: str) -> None:
        if report.finite or len(self.events) >= MAX_EVENTS:
            return
        fwd, bwd = report.forward, report.backward
        dtype = (fwd or bwd or {}).get("dtype")
        self.events.append({
            "step": step["step"], "skipped": step["skipped"], "loss": step["loss"],
            "precision": _precision(report.autocast, dtype), "autocast": report.autocast,
            "forward": fwd, "backward": bwd, "loss_grad_nonfinite": report.loss_grad_nonfinite,
            "mode": mode, "parameters_nonfinite_before": [] if mode.startswith("re-run") else self.params_nonfinite[:10],
            "where": module_source(self.model, blamed_module(fwd) if fwd is not None else (bwd or {}).get("module")),
        })

    def _check_watched_model(self) -> None:
        """Plain mode: the watched model must be the one the optimizers train."""
        params = {id(p) for opt in list(self.rec.optimizers) for g in opt.param_groups for p in g["params"]}
        if self.model is None or not any(id(p) in params for p in self.model.parameters()):
            self._remove_discovery()
            model = self.trained_model()
            if model is not None:
                self._start_watch(model)

    def _check_model_is_trained(self) -> None:
        """--nan: the hooked model must be the one the optimizers train; a model whose optimizer
        updates float32 master copies of its half weights (hand-written fp16) trains no module's
        parameters directly, and keeps its hooks."""
        params = {id(p) for opt in list(self.rec.optimizers) for g in opt.param_groups for p in g["params"]}
        if self.model is not None and not any(id(p) in params for p in self.model.parameters()):
            model = self.trained_model()
            if model is not None and model is not self.model:
                self._detach()
                self._attach(model)

    # -- headroom --------------------------------------------------------------------------
    def _measure_headroom(self, step: dict) -> None:
        """Share of non-zero gradient elements the step's loss scale leaves below float16's range."""
        grads = [p.grad for opt in list(self.rec.optimizers) for g in opt.param_groups for p in g["params"]
                 if p.grad is not None and p.grad.is_floating_point()]
        if not grads or len(self.headroom_steps) >= 1000:
            return
        scale = step["scale"] or 1.0
        tiny = FP16_TINY / scale
        with torch.no_grad():
            counts = torch.stack([torch.stack([(g != 0).sum(), ((g != 0) & (g.abs() < tiny)).sum(),
                                              g.abs().max().float() if g.numel() else torch.zeros(())])
                                  .to(torch.float64).cpu() for g in grads])
        nonzero, under = float(counts[:, 0].sum()), float(counts[:, 1].sum())
        self.headroom_steps.append({
            "step": step["step"], "scale": step["scale"], "nonzero": int(nonzero), "underflow": int(under),
            "underflow_share": under / nonzero if nonzero else 0.0,
            "grad_max_abs": number(float(counts[:, 2].max())), "skipped": step["skipped"],
        })

    def close(self) -> None:
        """Remove every hook this object added."""
        self.outside.disarm()
        self._unwatch_root()
        self._remove_discovery()
        self._stop_watch()
        self._detach()

    def result(self) -> dict:
        self._remove_discovery()
        out = {"mode": self.mode, "model": type(self.model).__name__ if self.model is not None else None,
               "checked_steps": self.checked_steps, "rechecked_steps": self.rechecked_steps,
               "reruns": self.reruns + self.skip_reruns, "rerun_error": self.rerun_error,
               "events": self.events, "parameters_nonfinite": self.params_nonfinite[:10],
               "outside": self.outside_event, "collapse": self.collapse_event,
               "steady_unlocalised": self._unlocalised(), "steady_after": self.rec.steady_after or None}
        if self.headroom:
            out["headroom_steps"] = self.headroom_steps
        return out


def module_source(model: nn.Module | None, name: str | None) -> dict:
    """File and line of the forward() of the named module's class, or of the nearest enclosing
    module whose class the user wrote (an nn.Linear inside their Block points at the Block)."""
    if model is None or name is None:
        return {}
    modules = dict(model.named_modules())
    parts = name.split(".") if name else []
    while True:
        module = modules.get(".".join(parts))
        if module is not None:
            forward = getattr(type(module), "forward", None)
            try:
                path = inspect.getsourcefile(forward)
                line = inspect.getsourcelines(forward)[1]
            except (TypeError, OSError):
                path = line = None
            if path and is_user_file(path):
                return {"path": path, "line": line, "class": type(module).__name__,
                        "module": ".".join(parts)}
        if not parts:
            return {}
        parts.pop()


def _autocast_of_step(entry: dict) -> str | None:
    """The half-precision autocast dtype the step's recorded regions ran in, if any."""
    for ev in entry.get("events", ()):
        if ev.get("kind") == "autocast" and ev.get("enabled") and ev.get("dtype") in ("float16", "bfloat16"):
            return ev["dtype"]
    return None


def _nonfinite_step(step: dict) -> bool:
    loss = step.get("loss")
    return bool(step.get("skipped")) or isinstance(loss, str) or (
        isinstance(loss, float) and not math.isfinite(loss))


def _grads_nonfinite(optimizer) -> bool:
    grads = [p.grad for g in optimizer.param_groups for p in g["params"]
             if p.grad is not None and p.grad.is_floating_point() and p.grad.layout == torch.strided]
    if not grads:
        return False
    norms = torch._foreach_norm(grads)
    return not bool(torch.isfinite(torch.stack([n.float() for n in norms]).sum()))


def _nonfinite_params(model: nn.Module) -> list[str]:
    bad = []
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.is_floating_point() and not bool(torch.isfinite(p).all()):
                bad.append(name)
    return bad
