"""The ops a script runs on the model's output outside the model (its loss function, often in a
helper file), watched so a non-finite loss is pinned to the line that made it.

Module hooks see only what modules return; `-torch.log(p)` or `x / mask.sum()` in `losses.py`
runs after the model's forward has returned. A `TorchFunctionMode` is pushed while the watched
model's output is being turned into a loss: from the moment its forward returns until the
step's `backward()`, its next call or the optimizer step. Per op with a floating output it keeps
only references to its inputs and outputs, their version counters and the innermost user frame
(`locate.user_frame`): no kernel, no host sync. Nothing is read unless the step's loss (or its
gradients) turn out non-finite; then the kept tensors are checked in call order, and the first op
whose inputs were all finite and whose output is not is the op that made it. For a float16 output
that op is re-run in float32 on its kept inputs: finite there means a float16 overflow (AMP202),
not a bug of the code.
"""
from __future__ import annotations

import os
import sys
from time import perf_counter
from types import SimpleNamespace

import torch
from torch.overrides import TorchFunctionMode

from ..engine.collapse import op_name as _op_name
from .locate import _cache as _user_files
from .locate import is_user_file, line_of

MAX_OPS = 256  # per optimizer step: a frozen perceptual-loss network must not grow the list forever
MAX_KEPT_ELEMENTS = 16 * 2**20  # per step: tensor elements kept alive until the optimizer step
_TORCH = os.path.dirname(os.path.realpath(torch.__file__))
# callers whose ops are not the script's loss: GradScaler's scale() (its overflow is calibration),
# tensor printing, and this package's own bookkeeping
_SKIP_PREFIXES = tuple(os.path.join(_TORCH, d) for d in ("amp", os.path.join("cuda", "amp"), "_tensor_str.py")) + (
    os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep,)
_INPLACE_DUNDERS = {"__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__ipow__",
                    "__imod__", "__idiv__", "__setitem__"}


_skip_cache: dict[str, bool] = {}


def _skipped_caller(filename: str) -> bool:
    hit = _skip_cache.get(filename)
    if hit is None:
        hit = _skip_cache[filename] = os.path.realpath(filename).startswith(_SKIP_PREFIXES)
    return hit


def _top_mode():
    """The innermost TorchFunctionMode on this thread's stack, or None."""
    n = _stack_len()
    return _stack_at(n - 1) if n else None


_STRIDED = torch.strided
_stack_len = torch._C._len_torch_function_stack
_stack_at = torch._C._get_function_stack_at
_push_mode = torch._C._push_on_torch_function_stack
_pop_mode = torch._C._pop_torch_function_stack


def _floating(obj, depth: int = 0) -> list[torch.Tensor]:
    """Dense floating tensors among an op's arguments or results (one level of lists/tuples);
    a plain loop, not a generator: it runs for every op while the watch is armed."""
    out = []
    for x in (obj if isinstance(obj, (list, tuple)) else (obj,)):
        if isinstance(x, torch.Tensor):
            if x.is_floating_point() and x.layout == _STRIDED and not x.is_meta and x.numel():
                out.append(x)
        elif depth < 1 and isinstance(x, (list, tuple)):
            out += _floating(x, depth + 1)
    return out


def _nonfinite_scalar(obj, depth: int = 0) -> bool:
    """A non-finite Python number among the arguments: the script asks for inf/NaN on purpose."""
    if isinstance(obj, float):
        return obj != obj or obj in (float("inf"), float("-inf"))
    if depth < 2 and isinstance(obj, (list, tuple)):
        return any(_nonfinite_scalar(x, depth + 1) for x in obj)
    return False


def _all_finite(tensors: list[torch.Tensor]) -> torch.Tensor | None:
    """One 0-d bool on the device: every element of every tensor is finite (no host sync)."""
    flags = [torch.isfinite(t.detach()).all() for t in tensors]
    if not flags:
        return None
    if len(flags) == 1:
        return flags[0]
    device = flags[0].device
    return torch.stack([f.to(device) for f in flags]).all()


class OutsideOps(TorchFunctionMode):
    """Records the ops run on the model's output outside it; `scan()` names the op that made a
    non-finite value. Armed and disarmed by `numerics.Numerics` around the watched model."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self._pushed = 0  # pushes by arm() not popped by disarm() since
        self.records: list[dict] = []
        self.dropped = 0
        self.kept_elements = 0
        self.scanned_steps = 0
        self.autocast: str | None = None  # the autocast dtype when the window opened
        self.meter = SimpleNamespace(own_s=0.0)  # its time is added to `meter.own_s` (numerics: the Recorder)

    # -- arming --------------------------------------------------------------------------
    def disarm(self) -> None:
        """Pop the mode if it is on top; under a mode the script pushed since, only stop recording
        (popping would take the script's mode away) and pop it at a later disarm. Called several
        times a step: without a push of ours pending it asks torch nothing."""
        self.armed = False
        if self._pushed and _top_mode() is self:
            _pop_mode()
            self._pushed -= 1

    def arm(self, autocast: str | None = None) -> None:
        self.autocast = autocast
        if not (self._pushed and _top_mode() is self):
            _push_mode(self)  # what TorchFunctionMode.__enter__ does, without its two Python frames
            self._pushed += 1
        self.armed = True

    def clear(self) -> None:
        self.records = []
        self.dropped = 0
        self.kept_elements = 0

    # -- recording: references and version counters only, no kernel, no sync --------------------
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        if not self.armed:
            return func(*args, **kwargs)
        # this runs for every op (and tensor attribute read) while armed: inlined, no generators
        started = perf_counter()
        name = getattr(func, "__name__", "")
        if name == "__get__":  # a tensor attribute read (`out.shape`), not an op
            self.meter.own_s += perf_counter() - started
            return func(*args, **kwargs)
        caller = sys._getframe(1)
        filename = caller.f_code.co_filename
        skipped = _skip_cache.get(filename)
        if skipped is None:
            skipped = _skipped_caller(filename)
        if skipped or len(self.records) >= MAX_OPS:
            if not skipped:
                self.dropped += 1
            self.meter.own_s += perf_counter() - started
            return func(*args, **kwargs)
        try:
            inputs = []  # _floating() of the arguments, its usual flat case inline (every op)
            for x in (*args, *kwargs.values()) if kwargs else args:
                if isinstance(x, torch.Tensor):
                    if x.is_floating_point() and x.layout == _STRIDED and not x.is_meta and x.numel():
                        inputs.append(x)
                elif isinstance(x, (list, tuple)):
                    inputs += _floating(x, 1)
            inplace = (name[-1:] == "_" and name[:2] != "__") or name in _INPLACE_DUNDERS
            # an in-place op overwrites its input: judge that one now (rare in loss code)
            in_flag = _all_finite(inputs) if inplace and inputs else None
        except Exception:  # noqa: BLE001 - an odd tensor (nested, subclass): watch nothing, change nothing
            self.meter.own_s += perf_counter() - started
            return func(*args, **kwargs)
        own = perf_counter() - started
        out = func(*args, **kwargs)
        started = perf_counter()
        try:
            self._record(func, args, kwargs, inputs, in_flag, inplace, out, caller)
        except Exception:  # noqa: BLE001 - the script's result stands whatever our bookkeeping meets
            self.dropped += 1
        self.meter.own_s += own + perf_counter() - started
        return out

    def _record(self, func, args, kwargs, inputs, in_flag, inplace, out, caller) -> None:
        """Only what must be taken now (references, version counters, the user's line); names and
        dtypes are worked out if the step is ever scanned."""
        if type(out) is torch.Tensor:
            if not out.is_floating_point() or out.layout != _STRIDED or out.is_meta:
                return
            size = out.numel()
            if not size:
                return
            outputs = [(out, out._version)]
        else:
            outputs = [(t, t._version) for t in _floating(out)]
            if not outputs:
                return
            size = 0
            for t, _ in outputs:
                size += t.numel()
        kept = []
        if not inplace:
            for t in inputs:
                size += t.numel()
                kept.append((t, t._version))
        if self.kept_elements + size > MAX_KEPT_ELEMENTS:
            self.dropped += 1
            return
        self.kept_elements += size
        code = caller.f_code
        known = _user_files.get(code.co_filename)
        where = ((code.co_filename, line_of(caller), getattr(code, "co_qualname", code.co_name))
                 if known or (known is None and is_user_file(code.co_filename)) else _user_frame_from(caller.f_back))
        self.records.append({
            "func": func, "args": args, "kwargs": kwargs, "inputs": kept, "outputs": outputs,
            "in_finite": in_flag, "where": where, "inplace": inplace, "autocast": self.autocast})

    @staticmethod
    def _intended(r: dict) -> bool:
        return _nonfinite_scalar(r["args"]) or _nonfinite_scalar(list(r["kwargs"].values()))

    # -- reading (only on a step that went non-finite) ------------------------------------
    def scan(self, step: int) -> dict | None:
        """The first recorded op whose inputs were finite and whose output is not. None when every
        recorded output is finite or a non-finite value came in from outside (the model's output:
        the module hooks' business; or the batch). Tensors changed in place since are skipped."""
        self.scanned_steps += 1
        intended = False
        for i, r in enumerate(self.records):
            out_ok = _finite_now(r["outputs"])
            if out_ok is not False:
                continue  # finite, or changed since (unknown)
            if self._intended(r):  # masked_fill(mask, -inf), torch.full(..., -inf): written on purpose
                intended = True
                continue
            in_ok = bool(r["in_finite"]) if r["inplace"] else _finite_now(r["inputs"])
            if in_ok is None:
                continue  # an input changed since: cannot tell
            if not in_ok:
                if intended:
                    continue  # the intended -inf flowing on (a masked logit times a temperature)
                return None  # it came in non-finite: not made outside the model
            return self._found(r, i, step, "forward", reference=_float32_rerun(r))
        return None

    def scan_backward(self, step: int) -> dict | None:
        """The gradient went non-finite while the loss is finite: the last recorded op (backward
        runs last to first) whose derivative, re-computed on its kept inputs, is not finite
        (`sqrt` at 0: finite forward, infinite derivative)."""
        self.scanned_steps += 1
        for i in range(len(self.records) - 1, -1, -1):
            r = self.records[i]
            if r["inplace"] or self._intended(r) or not any(t.requires_grad for t, _ in r["outputs"]):
                continue
            if _local_grad_finite(r) is False:
                return self._found(r, i, step, "backward", reference=None)
        return None

    def _found(self, r: dict, index: int, step: int, phase: str, reference) -> dict:
        path, line, function = r["where"]
        dtype = str(r["outputs"][0][0].dtype).replace("torch.", "")
        return {"op": _op_name(r["func"]), "path": path, "line": line, "function": function, "step": step,
                "dtype": dtype, "inplace": r["inplace"], "ops_recorded": len(self.records),
                "index": index, "autocast": r["autocast"], "phase": phase, "reference": reference}


def _finite_now(kept: list) -> bool | None:
    """Are these kept tensors finite? None when one was changed in place since it was kept."""
    try:
        if any(t._version != v for t, v in kept):
            return None
    except RuntimeError:  # inference tensors keep no version counter
        return None
    with torch.no_grad():
        return all(bool(torch.isfinite(t).all()) for t, _ in kept)


def _replace_inputs(obj, swap: dict, depth: int = 0):
    if isinstance(obj, torch.Tensor):
        return swap.get(id(obj), obj)
    if depth < 2 and isinstance(obj, (list, tuple)):
        return type(obj)(_replace_inputs(x, swap, depth + 1) for x in obj)
    return obj


def _local_grad_finite(r: dict) -> bool | None:
    """Re-run the op on detached copies of its kept inputs (under the autocast it ran in) and
    backpropagate ones: is the gradient it produces finite? None when it cannot be told."""
    kept = [(t, v) for t, v in r["inputs"] if t.requires_grad]
    if not kept:
        return None
    try:
        if any(t._version != v for t, v in kept):
            return None
        swap = {id(t): t.detach().requires_grad_() for t, _ in kept}
        device = kept[0][0].device.type
        dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(r["autocast"] or "")
        with torch.enable_grad(), torch.autocast(device, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            out = r["func"](*_replace_inputs(r["args"], swap),
                            **{k: _replace_inputs(v, swap) for k, v in r["kwargs"].items()})
        outs = [t for t in _floating(out) if t.requires_grad]
        if not outs:
            return None
        grads = torch.autograd.grad(outs, list(swap.values()), grad_outputs=[torch.ones_like(t) for t in outs],
                                    allow_unused=True)
    except Exception:  # noqa: BLE001 - an op that cannot be re-run alone: no verdict
        return None
    return all(bool(torch.isfinite(g).all()) for g in grads if g is not None)


def _user_frame(depth: int) -> tuple[str | None, int | None, str | None]:
    """The innermost user frame from `depth` frames above this call outwards."""
    return _user_frame_from(sys._getframe(depth))


def _user_frame_from(frame) -> tuple[str | None, int | None, str | None]:
    """The innermost user frame from `frame` outwards (an op called from torch's own Python, e.g.
    `F.cross_entropy` through `handle_torch_function`, is the user's line that called it)."""
    while frame is not None:
        code = frame.f_code
        if is_user_file(code.co_filename):  # co_qualname: "FocalLoss.forward", not "forward"
            return code.co_filename, line_of(frame), getattr(code, "co_qualname", code.co_name)
        frame = frame.f_back
    return None, None, None


def _float32_rerun(r: dict) -> dict | None:
    """A float16 op re-run on its inputs cast to float32 (autocast off): its output finite there
    means float16's range was the problem. None when the inputs changed since."""
    if r["outputs"][0][0].dtype != torch.float16 or r["inplace"]:
        return None
    func, args, kwargs, kept = r["func"], r["args"], r["kwargs"], r["inputs"]
    try:
        if any(t._version != v for t, v in kept):
            return None
    except RuntimeError:  # inference tensors keep no version counter
        return None

    def up(x, depth=0):
        if isinstance(x, torch.Tensor) and x.dtype in (torch.float16, torch.bfloat16):
            return x.detach().float()
        if depth < 2 and isinstance(x, (list, tuple)):
            return type(x)(up(i, depth + 1) for i in x)
        return x

    device = kept[0][0].device.type if kept else "cpu"
    try:
        with torch.no_grad(), torch.autocast(device, enabled=False):
            out = func(*up(args), **{k: up(v) for k, v in kwargs.items()})
    except Exception:  # noqa: BLE001 - an op that needs float16 inputs: no reference
        return None
    outs = list(_floating(out))
    if not outs:
        return None
    finite = all(bool(torch.isfinite(t).all()) for t in outs)
    max_abs = max(float(t.abs().max()) for t in outs)
    return {"precision": "fp32", "finite": finite, "max_abs": max_abs}
