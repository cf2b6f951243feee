"""Install the observers: global optimizer and module hooks (public PyTorch APIs) and thin
wrappers around GradScaler, autocast, gradient clipping, LR schedulers, backward and torch.save.
Each per-step wrapper adds the time its own bookkeeping took to `rec.own_s` (two clock reads):
the report's "tracing added about X ms per step"; while `rec.timing` is off (steady steps between
two samples, see Recorder.overhead) only the step's close is timed.

Wrappers patch the base classes in place (`torch.amp.GradScaler`, `torch.amp.autocast`), so every
alias a script may use (`torch.cuda.amp.GradScaler`, `torch.autocast`, `from torch.cuda.amp import
autocast`) reports through them. Each wrapper records first and then calls the original, so the
script's behaviour is unchanged (apart from the stop after N steps).
"""
from __future__ import annotations

import functools
import inspect
from sys import _getframe
from time import perf_counter

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch import nn

from .recorder import _IS_ENABLED, Recorder, _any_autocast


_undo: list = []  # (owner, name, original value) in installation order


def _set(owner, name: str, value) -> None:
    _undo.append((owner, name, owner.__dict__[name] if name in vars(owner) else getattr(owner, name)))
    setattr(owner, name, value)


def _wrap(owner, name: str, make):
    original = getattr(owner, name)
    wrapped = make(original)
    functools.update_wrapper(wrapped, original)
    _set(owner, name, wrapped)


class Installed:
    """The observers in place; `remove()` restores every patched attribute and removes the hooks
    (the child never needs it; the overhead benchmark does, to compare in one process)."""

    def __init__(self, handles: list, undo: list):
        self.handles = handles
        self.undo = undo

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        for owner, name, original in reversed(self.undo):
            setattr(owner, name, original)
        self.handles, self.undo = [], []


def install(rec: Recorder) -> Installed:
    """Install every observer (hooks and wrappers) reporting to `rec`."""
    start = len(_undo)
    def optimizer_pre(opt, args, kwargs):
        started = perf_counter() if rec.timing else 0.0
        rec.on_optimizer_pre(opt)
        if started:
            rec.own_s += perf_counter() - started

    def optimizer_post(opt, args, kwargs):  # the step's close: timed on every step (rec.timing)
        started = perf_counter()
        frame = rec.in_scaler_step[-1] if rec.in_scaler_step else None  # inside an enabled scaler.step(): via it
        if frame is not None and frame["enabled"]:
            rec.complete_step(False, True, frame["scaler"], opt)
        else:
            rec.complete_step(False, False)
        rec.close_s = perf_counter() - started
        rec.own_s += rec.close_s

    handles = [register_optimizer_step_pre_hook(optimizer_pre), register_optimizer_step_post_hook(optimizer_post)]
    _patch_optimizer_init(rec)
    _patch_scaler(rec, torch.amp.grad_scaler.GradScaler)
    _patch_autocast(rec)
    _patch_backward(rec)
    _patch_clip(rec)
    _patch_schedulers(rec)
    _patch_save(rec)
    _patch_half(rec)
    undo = _undo[start:]
    del _undo[start:]
    return Installed(handles, undo)


def _patch_optimizer_init(rec: Recorder) -> None:
    def make(orig):
        def __init__(self, *args, **kwargs):
            rec.on_optimizer_init(self)
            return orig(self, *args, **kwargs)
        return __init__
    _wrap(torch.optim.Optimizer, "__init__", make)


def _asked_enabled(signature, scaler, args: tuple, kwargs: dict) -> bool | None:
    """The `enabled` the script passed to GradScaler (its default when not passed): torch turns a
    scaler off on its own when its device is missing, and the report says when that happened."""
    if signature is None:
        return None
    try:
        bound = signature.bind(scaler, *args, **kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    value = bound.arguments.get("enabled")
    return bool(value) if isinstance(value, bool) else None


def _patch_scaler(rec: Recorder, cls, only: tuple[str, ...] | None = None) -> None:
    """Wrap GradScaler's methods; `only`: just these names (a subclass's own overrides, e.g.
    ShardedGradScaler's scale/unscale_/update, which never call the wrapped base methods)."""
    def make_init(orig):
        try:
            signature = inspect.signature(orig)
        except (TypeError, ValueError):
            signature = None

        def __init__(self, *args, **kwargs):
            orig(self, *args, **kwargs)
            rec.on_scaler_init(self, _asked_enabled(signature, self, args, kwargs))
        return __init__

    def make_scale(orig):
        def scale(self, outputs):
            started = perf_counter() if rec.timing else 0.0
            if rec.before_scale is not None:
                rec.before_scale()  # the loss is made: its ops are recorded up to here
            if started:
                rec.own_s += perf_counter() - started
            out = orig(self, outputs)
            started = perf_counter() if rec.timing else 0.0
            rec.on_scale(self, outputs, out)
            if started:
                rec.own_s += perf_counter() - started
            return out
        return scale

    def make_unscale(orig):
        def unscale_(self, optimizer):
            started = perf_counter() if rec.timing else 0.0
            if rec.fast:  # the steady fast path (recorder): the template's next call, from the same place
                t, caller = rec._tpl[rec._pos], _getframe(1)
                # induction: every earlier call of the window matched, with this scaler and optimizer
                # (the last step's, known already), so a scaler.update cleared the stage (t[5]:
                # AMP112/113) and every backward was scaled (AMP115); the stage is set by flush()
                if t[1] is caller.f_code and t[2] == caller.f_lasti and t[0] == "scaler.unscale_" and t[5] \
                        and self is rec._win_s() and optimizer is rec._win_o() and rec.device_seen is not None:
                    rec.unscaled_optimizers.append(optimizer)
                    rec._pos += 1
                    if started:
                        rec.own_s += perf_counter() - started
                    return orig(self, optimizer)
            rec.on_unscale(self, optimizer)
            if started:
                rec.own_s += perf_counter() - started
            return orig(self, optimizer)
        return unscale_

    def make_step(orig):
        def step(self, optimizer, *args, **kwargs):
            started = perf_counter() if rec.timing else 0.0
            frame = None
            if rec.fast:
                t, caller = rec._tpl[rec._pos], _getframe(1)
                # induction as in unscale_ (AMP113/115; a stock GradScaler: _bind), autocast live (AMP105)
                if t[1] is caller.f_code and t[2] == caller.f_lasti and t[0] == "scaler.step" and t[5] \
                        and self is rec._win_s() and optimizer is rec._win_o() and rec.device_seen is not None \
                        and self._enabled is True and not rec.stop_pending and rec.scaler_step_where is not None \
                        and not _any_autocast():
                    if rec.before_update is not None:
                        rec.before_update(rec, optimizer)
                    rec._pos += 1
                    frame = {"scaler": self, "optimizer": optimizer, "ran": False, "ev": t[3], "enabled": True}
                    rec.in_scaler_step.append(frame)
            if frame is None:
                frame = rec.on_scaler_step_enter(self, optimizer)
            if started:
                rec.own_s += perf_counter() - started
            try:
                return orig(self, optimizer, *args, **kwargs)
            finally:
                started = perf_counter() if rec.timing else 0.0
                rec.on_scaler_step_exit(frame)
                if started:
                    rec.own_s += perf_counter() - started
        return step

    def make_update(orig):
        def update(self, new_scale=None):
            started = perf_counter() if rec.timing else 0.0
            before = rec.scale_of(self)  # its remembered read, in the usual case: no device read
            if rec._fast_vals and rec._flushed != rec._pos:  # an update deferred in this window: its state first
                rec.flush()
            if not rec.scaler_stepped_since_update.get(id(self), False):  # the usual case (a step since) asks nothing
                rec.on_scaler_update_pre(self)
            if started:
                rec.own_s += perf_counter() - started
            out = orig(self, new_scale)
            started = perf_counter() if rec.timing else 0.0
            after = rec.scale_of(self)
            if rec.fast:
                t, caller = rec._tpl[rec._pos], _getframe(1)
                if t[1] is caller.f_code and t[2] == caller.f_lasti and t[0] == "scaler.update" \
                        and "scale_before" in t[3] and self is rec._win_s():  # AMP109's event, without the values, is another call
                    # the state change is deferred to flush() (induction: the window's scaler); a fused
                    # optimizer's pending skip is read now, as the full path does (None: made here)
                    pending = rec._fused_pending
                    rec._fast_vals[rec._pos] = (before, after, None if pending else new_scale is not None)
                    rec._pos += 1
                    if pending:
                        rec._updated(id(self), before, after, new_scale is not None)
                    if started:
                        rec.own_s += perf_counter() - started
                    return out
            rec.on_scaler_update(self, before, after, explicit=new_scale is not None)
            if started:
                rec.own_s += perf_counter() - started
            return out
        return update

    def make_state_dict(orig):
        def state_dict(self):
            rec.event("scaler.state_dict")
            return orig(self)
        return state_dict

    for name, make in (("__init__", make_init), ("scale", make_scale), ("unscale_", make_unscale),
                       ("step", make_step), ("update", make_update), ("state_dict", make_state_dict)):
        if only is None or name in only:
            _wrap(cls, name, make)


def _patch_autocast(rec: Recorder) -> None:
    cls = torch.amp.autocast_mode.autocast

    def make_enter(orig):
        def __enter__(self):
            out = orig(self)
            started = perf_counter() if rec.timing else 0.0
            if rec.fast:
                t, caller = rec._tpl[rec._pos], _getframe(1)
                if t[1] is caller.f_code and t[2] == caller.f_lasti and t[0] == "autocast" and not rec.muted:
                    # the template's values as autocast holds them (torch's dtypes are singletons)
                    dev, dtype, enabled, entry, site, fp16 = t[4]
                    if getattr(self, "fast_dtype", None) is dtype and getattr(self, "device", "?") == dev \
                            and bool(getattr(self, "_enabled", True)) is enabled:
                        # the user's `with` (a user frame called it): not a framework's region; the
                        # template's record had fewer than 8 events before it, so this step's has too
                        rec.autocast_stack.append(entry)
                        rec._autocast_enters += 1
                        site = rec.autocast_sites[site]  # made by the template's own call
                        site["count"] += 1
                        site["steps"].add(rec.steps if rec.open_next else rec._timeline[-1]["step"])
                        if fp16:
                            rec.fp16_autocast_since_step = True
                        rec._pos += 1
                        if started:
                            rec.own_s += perf_counter() - started
                        return out
            rec.on_autocast_enter(self)
            if started:
                rec.own_s += perf_counter() - started
            return out
        return __enter__

    def make_exit(orig):
        def __exit__(self, *exc):
            started = perf_counter() if rec.timing else 0.0
            rec.on_autocast_exit()
            if started:
                rec.own_s += perf_counter() - started
            return orig(self, *exc)
        return __exit__

    _wrap(cls, "__enter__", make_enter)
    _wrap(cls, "__exit__", make_exit)


def _patch_backward(rec: Recorder) -> None:
    def make_tensor_backward(orig):
        def backward(self, *args, **kwargs):
            started = perf_counter() if rec.timing else 0.0
            fast = False
            if rec.fast:
                t, caller = rec._tpl[rec._pos], _getframe(1)
                if t[1] is caller.f_code and t[2] == caller.f_lasti and t[0] == "backward" and t[3]["scaled"] \
                        and not rec.muted and not rec.stop_pending and rec.created_at and not _any_autocast():  # AMP104
                    # a scaled loss's backward(), outside autocast, in a loop with an optimizer
                    entry = rec.scaled_outputs.get(id(self))
                    scaler = entry[1]() if entry is not None and entry[0]() is self else None
                    if getattr(scaler, "_enabled", None) is True and type(scaler).is_enabled is _IS_ENABLED:
                        fast = True
                        if rec.before_backward is not None:
                            rec.before_backward(rec)
                        rec.backwards.append({"ev": t[3], "scaled": True, "fp16": rec.fp16_autocast_since_step})
                        rec.scaled_pending = True
                        rec.unscaled_optimizers = []
                        rec._pos += 1
            if not fast:
                rec.on_backward(self)
            if started:
                rec.own_s += perf_counter() - started
            rec.in_tensor_backward = True  # Tensor.backward calls torch.autograd.backward: count once
            try:
                out = orig(self, *args, **kwargs)
            finally:
                rec.in_tensor_backward = False
            if not fast:  # the fast path's loop has an optimizer: after_backward() has nothing to do
                started = perf_counter() if rec.timing else 0.0
                rec.after_backward()
                if started:
                    rec.own_s += perf_counter() - started
            return out
        return backward

    _wrap(torch.Tensor, "backward", make_tensor_backward)
    original = torch.autograd.backward

    @functools.wraps(original)
    def autograd_backward(tensors, *args, **kwargs):
        if rec.in_tensor_backward:
            return original(tensors, *args, **kwargs)
        started = perf_counter() if rec.timing else 0.0
        first = tensors[0] if isinstance(tensors, (list, tuple)) and tensors else tensors
        rec.on_backward(first)
        if started:
            rec.own_s += perf_counter() - started
        out = original(tensors, *args, **kwargs)
        started = perf_counter() if rec.timing else 0.0
        rec.after_backward()
        if started:
            rec.own_s += perf_counter() - started
        return out

    _set(torch.autograd, "backward", autograd_backward)


def _patch_clip(rec: Recorder) -> None:
    import torch.nn.utils as nn_utils
    import torch.nn.utils.clip_grad as clip_mod

    for name in ("clip_grad_norm_", "clip_grad_value_", "clip_grad_norm"):
        original = getattr(clip_mod, name, None)
        if original is None:
            continue

        def make(orig, name=name):
            def clip(parameters, *args, **kwargs):
                started = perf_counter() if rec.timing else 0.0
                params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
                if rec.fast:
                    t, caller = rec._tpl[rec._pos], _getframe(1)
                    if t[1] is caller.f_code and t[2] == caller.f_lasti and t[0] == name \
                            and not (rec.scaled_pending and rec._still_scaled(params)):  # AMP101
                        rec._pos += 1
                        if started:
                            rec.own_s += perf_counter() - started
                        return orig(params, *args, **kwargs)
                rec.on_clip(name, params)
                if started:
                    rec.own_s += perf_counter() - started
                return orig(params, *args, **kwargs)
            return functools.wraps(orig)(clip)

        wrapped = make(original)
        if getattr(nn_utils, name, None) is original:
            _set(nn_utils, name, wrapped)
        _set(clip_mod, name, wrapped)


def _patch_schedulers(rec: Recorder) -> None:
    from torch.optim import lr_scheduler

    def make_step(orig):
        def step(self, *args, **kwargs):
            started = perf_counter() if rec.timing else 0.0
            if rec.fast:
                t, caller = rec._tpl[rec._pos], _getframe(1)
                if t[1] is caller.f_code and t[2] == caller.f_lasti and t[0] == "scheduler.step" \
                        and not rec.in_scheduler_init and not rec.last_step_skipped \
                        and t[3]["scheduler"] == type(self).__name__:  # AMP107 is the full path's
                    rec._pos += 1
                    rec._scheduler_stepped(self, t[3])
                    if started:
                        rec.own_s += perf_counter() - started
                    return orig(self, *args, **kwargs)
            rec.on_scheduler_step(self)
            if started:
                rec.own_s += perf_counter() - started
            return orig(self, *args, **kwargs)
        return step

    def make_initial(orig):
        def _initial_step(self, *args, **kwargs):
            rec.in_scheduler_init += 1
            try:
                return orig(self, *args, **kwargs)
            finally:
                rec.in_scheduler_init -= 1
        return _initial_step

    seen = set()
    for cls in (lr_scheduler.LRScheduler, *_subclasses(lr_scheduler.LRScheduler)):
        if "step" in vars(cls) and vars(cls)["step"] not in seen:
            seen.add(vars(cls)["step"])
            _wrap(cls, "step", make_step)
    if hasattr(lr_scheduler.LRScheduler, "_initial_step"):
        _wrap(lr_scheduler.LRScheduler, "_initial_step", make_initial)


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def _patch_save(rec: Recorder) -> None:
    original = torch.save

    @functools.wraps(original)
    def save(obj, *args, **kwargs):
        started = perf_counter() if rec.timing else 0.0
        rec.on_save(obj)
        if started:
            rec.own_s += perf_counter() - started
        return original(obj, *args, **kwargs)

    _set(torch, "save", save)


def _patch_half(rec: Recorder) -> None:
    def make_cast(orig, dtype):
        def cast(self, *args, **kwargs):
            out = orig(self, *args, **kwargs)
            rec.on_module_to_half(self, dtype)
            return out
        return cast

    _wrap(nn.Module, "half", lambda o: make_cast(o, torch.float16))
    _wrap(nn.Module, "bfloat16", lambda o: make_cast(o, torch.bfloat16))

    def make_to(orig):
        def to(self, *args, **kwargs):
            out = orig(self, *args, **kwargs)
            try:
                dtype = torch._C._nn._parse_to(*args, **kwargs)[1]
            except Exception:  # noqa: BLE001 - let torch's own error stand
                dtype = None
            if dtype in (torch.float16, torch.bfloat16):
                rec.on_module_to_half(self, dtype)
            return out
        return to

    _wrap(nn.Module, "to", make_to)
