"""Hook machinery of the NaN hunt: reduce on the device, synchronise once per step.

Why this shape: `torch.autograd.detect_anomaly` checks every op and syncs every time, which
makes it too slow to leave on. Here every module call records the min and max of each
floating tensor it takes and returns (`torch.aminmax`: one kernel, NaN-propagating, no
temporary copy), and gradient hooks record the same for the gradient of every module output
and every parameter. The results are written into 0-d views of a small buffer on the device
that the hook set keeps from step to step (`_result_views`), and stay there until `collect()`,
which copies them to the host in one transfer: the only synchronisation of a step. Each hook
claims its slots and records its events before it runs its reductions (`_claim`): on a CPU a
hook runs right after a large kernel has swept the caches, and Python run after a reduction
would run colder still. The analysis then walks the calls in execution order for the first
non-finite value.

Choices that keep it robust in real training code:
- inputs are reduced in a forward PRE-hook, so an in-place module (ReLU(inplace=True)) is
  seen with its true inputs; a tensor already reduced (same object, same `_version`) is not
  reduced twice, which also tells us which module consumed which module's output;
- backward uses hooks on the autograd node of each module output (what `Tensor.register_hook`
  does, without its Python overhead) plus parameter hooks, not `register_full_backward_hook`,
  which breaks on in-place ops after a hooked module and changes the user's autograd graph;
  a module called twice gets hooks per call; a hook set before an in-place op sees the
  gradient of the value before it, as tensor hooks do;
- activations that cannot create NaN/Inf (ReLU, GELU, Tanh, ...) are not reduced: their
  output shares their input's values, and backward blame passes through them.

Which modules get no hooks at all (issue 11.8: on small many-module models the cost is Python
per hook call, not arithmetic), and why no localisation that matters is lost:
- parameter-free maps that cannot be the FIRST to make a non-finite value, forward or backward:
  ReLU, ReLU6, Hardtanh (finite bounds), LeakyReLU (|slope| <= 1), ELU (0 <= alpha <= 1),
  GELU, SiLU, Mish, Sigmoid, Tanh, Hardsigmoid, Hardswish, Identity, Flatten, Unflatten (exact
  types: a subclass may override forward). Forward: |f(x)| <= |x| + 1, so finite in, finite
  out in every dtype. Backward: grad * f'(x) with f' bounded; where f' can exceed 1 (GELU 1.13,
  SiLU 1.1, Mish 1.09, Hardswish 1.5) a gradient within that factor of fp16's 65504 can
  overflow there, and the blame lands on the module that consumed the activation, the one
  that produced that near-overflow gradient. NOT skipped: Dropout (1/(1-p) can push a fp16
  value past 65504; p == 0 is skipped), Softmax/LogSoftmax, pools (MaxPool's backward SUMS the
  gradients of overlapping windows, a fp16 sum can overflow), anything with parameters.
  Their output is recognised where it is next used, by its autograd node (`_PASSIVE_NODES`,
  e.g. ReluBackward0 over the node of a tensor already reduced): it gets an alias slot of that
  tensor's values instead of a reduction, and the consumer is found through the alias in
  backward. Where the map's backward masks gradients (ReLU where x <= 0) its output gradient
  is still hooked, on its autograd node (`_MASKING_NODES`): a non-finite gradient the next
  module makes where the ReLU was off would otherwise vanish before any other hook;
- `nn.Sequential` containers other than the model itself whose children are all hooked (or
  are such containers): a Sequential runs no code of its own between its children, its input
  is its first child's input and its output its last child's output, so its hooks only
  re-find tensors already reduced. Modules with children that are not plain containers keep
  their hooks: their forward() runs its own code (the "forward code" blame needs their call).
Built-in torch.nn leaf modules that never write their inputs (`_keeps_inputs`) get one
post-hook that reads the inputs after the call; a user's module or an `inplace=True` one
keeps its pre-hook, since it may change its inputs before the post-hook could read them.
"""
from __future__ import annotations

import dataclasses

import fnmatch
import math
import threading
import weakref
from functools import partial
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import nn

from ..jsonsafe import number  # torch-free there: the findings the trace parent builds use it too
from .hook_registry import ours, remove

_MAX_NEST = 4  # how deep we look into tuples/lists/dicts of a module's inputs and outputs
_ZEROS: dict[torch.device, torch.Tensor] = {}  # placeholder min/max per device: never non-finite


def _zero(device: torch.device) -> torch.Tensor:
    """A 0-d zero on `device`, made once, so placeholders stack with the real values."""
    z = _ZEROS.get(device)
    if z is None:
        z = _ZEROS[device] = torch.zeros((), device=device)
    return z


_NATIVE = {torch.float32, torch.float16, torch.bfloat16, torch.float64}  # aminmax works as is
# On a CPU, torch's fused `aminmax` over a large float32/float64 tensor is slower than `amin` and
# `amax` one after the other (torch 2.13, AVX-512 host, 1 thread: 256 K floats 38 us against
# 12 + 12 us; even at 64 K, 10.3 against 8.4); below about 32 K elements the second dispatch costs
# more than it saves, and for float16/bfloat16 the pair is 2.5-4x slower. Same values: both
# propagate NaN and return the exact extremes. On a GPU the fused kernel is one launch, kept.
_SPLIT_MIN_MAX = {torch.float32, torch.float64}
_SPLIT_FROM = 32768  # elements


# floating and complex dtypes: a set lookup is cheaper than two dtype attributes, and this is
# asked for every tensor of every hooked call (a dtype not listed is still asked directly)
_FLOATING = frozenset(d for d in vars(torch).values()
                      if isinstance(d, torch.dtype) and (d.is_floating_point or d.is_complex))
_STRIDED = torch.strided  # layouts are singletons


def _measurable(t: torch.Tensor) -> bool:
    """Dense, floating or complex, not empty, with data: the tensors that can hold NaN/Inf."""
    dtype = t.dtype
    return ((dtype in _FLOATING or dtype.is_floating_point or dtype.is_complex) and t.layout is _STRIDED
            and t.numel() > 0 and not t.is_meta)


def _minmax(d: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, split: bool) -> None:
    """d's min into lo and max into hi (0-d views of a result buffer); d needs no gradient;
    `split`: `amin` then `amax` (`_splits`), else the fused `aminmax`."""
    if split:
        torch.amin(d, out=lo)
        torch.amax(d, out=hi)
    else:
        torch.aminmax(d, out=(lo, hi))


def _splits(dtype: torch.dtype, cpu: bool, numel: int) -> bool:
    return cpu and dtype in _SPLIT_MIN_MAX and numel >= _SPLIT_FROM


_CPU = torch.device("cpu")


def _tensors(obj: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    """Tensors inside a module's inputs/outputs: tensors, tuples, lists, dicts (ModelOutput), dataclasses."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth < _MAX_NEST:
        if isinstance(obj, (tuple, list)):
            for item in obj:
                yield from _tensors(item, depth + 1)
        elif isinstance(obj, dict):
            for item in obj.values():
                yield from _tensors(item, depth + 1)
        elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):  # output objects with .loss/.logits
            for field in dataclasses.fields(obj):
                yield from _tensors(getattr(obj, field.name, None), depth + 1)


def _dtype_name(dtype: torch.dtype | None) -> str | None:
    return str(dtype).replace("torch.", "") if dtype is not None else None


def nonfinite_value(lo: float, hi: float) -> str:
    """What a non-finite tensor holds, from its min and max: "nan", "inf", "-inf" or both infs
    (`kind` says only nan/inf; this keeps the sign a user needs: a -inf is a log of zero or a
    mask, a +inf an overflow)."""
    if math.isnan(lo) or math.isnan(hi):
        return "nan"
    if lo == -math.inf and hi == math.inf:
        return "inf and -inf"
    return "-inf" if lo == -math.inf else "inf"


def combined_value(values) -> str:
    """One word for several non-finite tensors: nan wins, then the infinities seen."""
    seen = {v for v in values if v}
    if "nan" in seen:
        return "nan"
    pos = bool(seen & {"inf", "inf and -inf"})
    neg = bool(seen & {"-inf", "inf and -inf"})
    return "inf and -inf" if pos and neg else ("-inf" if neg else "inf")



def _version(t: torch.Tensor) -> Any:
    """t's version counter; an inference tensor (`torch.inference_mode()`) keeps none, so it gets a
    fresh token that matches nothing: reduced again rather than trusted unchanged."""
    try:
        return t._version
    except RuntimeError:  # "Inference tensors do not track version counter"
        return object()

class _Call:
    """One module call of one step: slots of its inputs and outputs, its parent call."""

    __slots__ = ("module", "ins", "outs", "dtype", "parent", "order")

    def __init__(self, module: int, ins: tuple[int, ...], parent: "_Call | None"):
        self.module = module
        self.ins = ins
        self.outs: tuple[int, ...] = ()
        self.dtype: torch.dtype | None = None
        self.parent = parent
        self.order = -1  # completion order within the step, set by the forward hook


class _Values(list):
    """A step's 0-d min/max tensors, in slot order (min of slot i at 2i, max at 2i+1), and where
    they live: when every measured one is a view of the same buffer at its own index
    (`HookSet._result_views`, the usual step), `_to_host` copies that buffer's first len()
    values in one slice instead of stacking ~150 tensors (120 us after a CNN's backward, 2 us)."""

    def __init__(self) -> None:
        super().__init__()
        self.buffer: torch.Tensor | None = None  # the one buffer, None when none or several
        self.host: memoryview | None = None  # the buffer's memory, when on the CPU (`_host_view`)
        self.mixed = False  # views of several buffers (devices, dtypes, a buffer that grew)
        self.zeros: list[int] = []  # indices holding the `_zero` placeholder instead

    def in_buffer(self, buffer: torch.Tensor, host: memoryview | None) -> None:
        if self.buffer is None and not self.mixed:
            self.buffer, self.host = buffer, host
        elif self.buffer is not buffer:
            self.buffer, self.host, self.mixed = None, None, True


class _Step:
    """Everything recorded between two `collect()`s; values stay on the device until then."""

    __slots__ = ("vals", "calls", "stack", "seen", "consumers", "grads", "autocast", "pending", "alias",
                 "hooks_todo", "nodes", "passive", "producer", "masked", "hooked", "kernels")

    def __init__(self) -> None:
        self.vals = _Values()  # 0-d device tensors: min, max of slot i at 2i, 2i+1
        self.calls: list[_Call] = []  # completed calls, in completion order
        self.stack: list[_Call] = []  # calls still running (nested modules)
        self.seen: dict[int, tuple[Any, int, int]] = {}  # id(tensor) -> (weakref, _version, slot)
        self.consumers: dict[int, list[_Call]] = {}  # slot -> calls that took it as input
        self.grads: list[tuple[str, Any, int]] = []  # backward events: ("out", call, slot) | ("param", idx, slot)
        self.autocast: str | None = None  # autocast dtype seen at the root call, if any
        self.pending = False  # anything recorded since the last collect
        self.alias: dict[int, int] = {}  # slot -> slot whose values it shares (transparent modules)
        self.hooks_todo: list[tuple[Any, int, "_Call", int]] = []  # (node, output_nr, call, slot) to hook
        self.nodes: dict[int, tuple[Any, int, Any, int]] = {}  # id(grad_fn) -> (grad_fn, slot, weakref, _version)
        self.passive: set[int] = set()  # alias slots made by unhooked passive modules (no call of their own)
        self.producer: dict[int, "_Call"] = {}  # output slot -> the call that returned it
        self.masked: set[int] = set()  # slots read by a masking passive op whose output gradient is hooked
        self.hooked: set[int] = set()  # alias slots whose gradient hook `_slot` already set
        # `_minmax` arguments of the forward hook running now, run as its last work (`_run_kernels`)
        self.kernels: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]] = []


# Result buffers of detached hook sets, for the next hook set on that device and dtype: making a
# buffer's 512 views costs ~0.7 ms, paid once per process rather than per `nanhunt(...)` or check.
# (buffer, its 0-d views, its memory when on the CPU: `_host_view`)
_Kept = tuple[torch.Tensor, list[torch.Tensor], "memoryview | None"]
_RESULT_POOL: dict[tuple[torch.device, torch.dtype], list[_Kept]] = {}
_POOL_LOCK = threading.Lock()
_POOL_MAX = 4  # buffers kept per device and dtype (hook sets alive at once, nested)


def _take_results(key: tuple[torch.device, torch.dtype]) -> _Kept | None:
    with _POOL_LOCK:
        free = _RESULT_POOL.get(key)
        return free.pop() if free else None


def _give_results(results: dict) -> None:
    """Hand a detached hook set's buffers back (it takes them again if it is re-attached)."""
    with _POOL_LOCK:
        for key, kept in results.items():
            free = _RESULT_POOL.setdefault(key, [])
            if len(free) < _POOL_MAX:
                free.append(kept)
        results.clear()


class StepReport:
    """What `collect()` found; `forward`/`backward` are None when everything was finite.

    `calls` (per call: module, output finite, output max |x|) is built on first use: the NaN
    hunt inside a user's training loop never reads it, and building it for every step was a
    tenth of the hooks' added time on a small CNN (issue 11.8)."""

    def __init__(self, forward: dict | None, backward: dict | None, loss_grad_nonfinite: bool,
                 calls: list[dict] | Callable[[], list[dict]] | None = None, n_calls: int = 0, n_grads: int = 0,
                 autocast: str | None = None) -> None:
        self.forward = forward
        self.backward = backward
        self.loss_grad_nonfinite = loss_grad_nonfinite  # the first non-finite gradient is the loss's own
        self._calls = [] if calls is None else calls
        self.n_calls = n_calls
        self.n_grads = n_grads
        self.autocast = autocast

    @property
    def calls(self) -> list[dict]:
        if callable(self._calls):
            self._calls = self._calls()
        return self._calls

    @property
    def finite(self) -> bool:
        return self.forward is None and self.backward is None

    def __repr__(self) -> str:
        return (f"StepReport(forward={self.forward!r}, backward={self.backward!r}, "
                f"n_calls={self.n_calls}, n_grads={self.n_grads}, autocast={self.autocast!r})")


# The methods torch calls the hooks through: who times the hooks (the trace's stated own cost,
# bench/nan_inhook.py) wraps these, so a new entry point must be listed here or its time goes uncounted.
HOOK_ENTRY_POINTS = ("_pre", "_leaf_post", "_post", "_node_grad", "_param_grad", "_out_grad")


class HookSet:
    """Hooks on a module tree recording cheap on-device min/max; `collect()` analyses a step."""

    # False: output-gradient hooks registered at once, every one (the behaviour before issue 11.8;
    # bench/nan_overhead.py times both side by side)
    defer_grad_hooks = True
    # False: every module hooked, no alias through autograd nodes (the behaviour before the
    # passive-module rule of issue 11.8, timed side by side in bench/nan_overhead.py)
    skip_passive_modules = True

    def __init__(self, model: nn.Module, forward: bool = True, backward: bool = True,
                 ignore: Sequence[str] = ()):
        if not isinstance(model, nn.Module):
            raise TypeError(f"nanhunt needs a torch.nn.Module, got {type(model).__name__}")
        if isinstance(ignore, str):
            ignore = [ignore]
        self.model = model
        self.ignore = tuple(ignore)  # fnmatch patterns of module names left unhooked
        self.forward = forward
        self.backward = backward
        self.active = True  # False: hooks return at once (steps skipped by `every`)
        self.on_root_call = None  # callable(HookSet) run before each top-level forward
        self._live = False
        self._handles: list[Any] = []
        self._names: list[str] = []
        self._classes: list[str] = []
        self._param_names: list[str] = []
        self._param_owner: list[int] = []
        self._transparent: set[int] = set()  # modules that cannot create NaN/Inf (see below)
        self._passes_grads: set[int] = set()  # ... and pass non-finite gradients on unchanged
        self._masks_grads: set[int] = set()  # ... the others (ReLU-like: a mask, not a product)
        self._step = _Step()
        self._results: dict[tuple[torch.device, torch.dtype], _Kept] = {}

    # -- attach / detach ---------------------------------------------------------------
    def attach(self) -> "HookSet":
        if self._live:
            return self
        index_of: dict[int, int] = {}
        self._names, self._classes, self._param_names, self._param_owner = [], [], [], []
        # per parameter: (its dtype, `_splits` on a CPU), for `_param_grad`'s short path
        self._param_facts: list[tuple[torch.dtype | None, bool]] = []
        self._transparent, self._passes_grads = set(), set()
        unhooked = _unhooked_modules(self.model, self.ignore) if self.skip_passive_modules else set()
        self._aliasing = self.skip_passive_modules
        for name, module in self.model.named_modules():
            if name and any(fnmatch.fnmatchcase(name, pat) for pat in self.ignore):
                continue
            idx = len(self._names)  # the model itself is 0
            index_of[id(module)] = idx
            self._names.append(name)
            self._classes.append(type(module).__name__)
            if _is_transparent(module):
                self._transparent.add(idx)
                if type(module) in _PASSES_GRADS:
                    self._passes_grads.add(idx)
            if id(module) in unhooked:
                continue
            if idx and self.skip_passive_modules and _keeps_inputs(module):
                hook = partial(self._leaf_post, idx)
                self._handles.append(ours(module.register_forward_hook(hook, with_kwargs=True)))
                continue
            self._handles.append(ours(module.register_forward_pre_hook(partial(self._pre, idx), with_kwargs=True)))
            self._handles.append(ours(module.register_forward_hook(partial(self._post, idx))))
        self._masks_grads = self._transparent - self._passes_grads  # ReLU-like: their backward masks
        if self.backward:
            for mname, module in self.model.named_modules():
                if id(module) not in index_of:
                    continue
                for pname, param in module.named_parameters(recurse=False):
                    if not param.requires_grad:
                        continue
                    pidx = len(self._param_names)
                    self._param_names.append(f"{mname}.{pname}" if mname else pname)
                    self._param_owner.append(index_of[id(module)])
                    fast = param.dtype in _NATIVE and param.numel() > 0  # else `_param_grad` asks each time
                    self._param_facts.append((param.dtype if fast else None,
                                              _splits(param.dtype, True, param.numel())))
                    self._handles.append(param.register_hook(partial(self._param_grad, pidx)))
        self._live = True
        return self

    def detach(self) -> None:
        for handle in self._handles:
            remove(handle)
        self._handles.clear()
        self._live = False
        if not self._step.vals:  # nothing left to collect: the buffers can serve another hook set
            _give_results(self._results)

    @property
    def pending(self) -> bool:
        return self._step.pending

    # -- recording ---------------------------------------------------------------------
    def _slot(self, step: _Step, t: torch.Tensor) -> tuple[int, bool]:
        """(index of t's min/max in step.vals, True if reduced now); reduced once per version."""
        key = id(t)
        hit = step.seen.get(key)
        version = _version(t)
        if hit is not None and hit[1] == version and hit[0]() is t:
            return hit[2], False
        ref = weakref.ref(t)
        node = t.grad_fn if self._aliasing else None
        slot = self._passive_source(step, t, node) if node is not None else None
        if slot is not None:  # made by a passive op (an unhooked ReLU...) from a reduced tensor
            source, slot = slot, self._alias(step, slot, t.device)
            step.passive.add(slot)
            producer = step.producer.get(source)
            if (producer is not None and type(node).__name__ in _MASKING_NODES and self.backward
                    and t.requires_grad and torch.is_grad_enabled()):
                # its backward zeroes gradients (ReLU where x <= 0): a non-finite gradient the
                # consumer makes there would vanish before the producer's own hook; the old
                # ReLU output hook, now on the node; the producer's output hook is then redundant
                step.masked.add(source)
                step.producer[slot] = producer
                step.hooked.add(slot)
                self._grad_hook(t, step, producer, slot)
        else:
            slot, job = self._claim(step, t, measure=self.forward, no_grad=True)
            if job is not None:
                step.kernels.append(job)  # run at the end of the hook (`_run_kernels`)
        step.seen[key] = (ref, version, slot)
        if node is not None:
            step.nodes[id(node)] = (node, slot, ref, version)
        return slot, True

    @staticmethod
    def _passive_source(step: _Step, t: torch.Tensor, node: Any) -> int | None:
        """The slot whose values `t` shares, when `t` was made by one passive autograd node
        (see `_PASSIVE_NODES`) from a tensor reduced this step and not changed since (its
        version; an in-place ReLU on that very tensor is the one change allowed)."""
        check = _PASSIVE_NODES.get(type(node).__name__)
        if check is None or not check(node):
            return None
        nexts = node.next_functions
        if not nexts or nexts[0][0] is None:
            return None
        src = step.nodes.get(id(nexts[0][0]))
        if src is None:
            return None
        _, slot, ref, version = src
        base = ref()
        # a freed source (the usual case: nothing but the ReLU used it) cannot have changed
        # unseen, short of a no_grad in-place write through another view of its memory; a
        # write under grad replaces its autograd node, so the chain above no longer matches
        if base is None or base._version == version or (base is t and base._version == version + 1):
            return slot
        return None

    _lock = threading.Lock()  # CUDA backward runs hooks on one autograd thread per device

    def _claim(self, step: _Step, t: torch.Tensor, measure: bool = True,
               no_grad: bool = False) -> tuple[int, tuple | None]:
        """A new slot for t's min and max, and the reduction that fills it (`_minmax`'s
        arguments, None when not measured), for the caller to run as the last work of its hook:
        a reduction reads a whole activation or gradient, and Python run after it finds its own
        objects evicted from the caches.
        `no_grad`: the caller runs it with autograd off (`_run_kernels`), so t needs no detach."""
        if not measure:  # forward=False: module inputs/outputs only need a slot (who consumed what)
            zero = _zero(t.device)
            with self._lock:
                vals = step.vals
                slot = len(vals) // 2
                vals.zeros += (2 * slot, 2 * slot + 1)
                vals.append(zero)
                vals.append(zero)
                step.pending = True
            return slot, None
        d = t
        dtype = t.dtype
        if dtype not in _NATIVE:  # complex: magnitude; float8 and the like: widen first
            d = t.detach() if t.requires_grad else t
            d = d.abs() if d.is_complex() else d.float()
            dtype = d.dtype
        elif not no_grad and t.requires_grad:  # gradients in hooks need no detach
            d = t.detach()
        cpu = d.is_cpu  # each tensor attribute read once: cold after a large kernel, they add up
        return self._claim_in(step, d, (_CPU if cpu else d.device, dtype), _splits(dtype, cpu, d.numel()))

    def _claim_in(self, step: _Step, d: torch.Tensor, key: tuple[torch.device, torch.dtype],
                  split: bool) -> tuple[int, tuple]:
        """`_claim` for a tensor whose buffer key (device, dtype) and kernel are known."""
        with self._lock:
            vals = step.vals
            slot = len(vals) // 2
            buffer, views, host = self._result_views(slot, key)
            lo, hi = views[2 * slot], views[2 * slot + 1]
            if vals.buffer is not buffer:
                vals.in_buffer(buffer, host)
            vals.append(lo)
            vals.append(hi)
            step.pending = True
        return slot, (d, lo, hi, split)

    @staticmethod
    def _run_kernels(step: _Step) -> None:
        """The reductions a forward hook claimed (`_slot`), run as its last work."""
        todo, step.kernels = step.kernels, []
        grad_was = torch.is_grad_enabled()
        if grad_was:  # a detach per tensor costs more, and `out=` refuses inputs that need a gradient
            torch._C._set_grad_enabled(False)
        try:
            for job in todo:
                _minmax(*job)
        finally:
            if grad_was:
                torch._C._set_grad_enabled(True)

    def _result_views(self, slot: int, key: tuple[torch.device, torch.dtype]) -> _Kept:
        """Where slot's min and max are written (views[2 * slot], views[2 * slot + 1]): 0-d views of
        a buffer per device and dtype, kept across steps (a step's values are copied out by
        `collect()` before the next writes); returns (buffer, views, host view).

        Why not the 0-d tensors a reduction returns: ~150 of them per step of a small CNN, alive
        from their hook to `collect()`, are small heap blocks among the step's large activation
        and gradient blocks, and on a CPU that alone cost about 0.9 ms per step (issue 28:
        measured with the same reductions whose results were dropped at once)."""
        kept = self._results.get(key)
        if kept is None:
            kept = _take_results(key)
        if kept is None or 2 * slot + 1 >= len(kept[1]):  # grows a few times, in the first steps
            size = max(512, 4 * (slot + 1), 2 * len(kept[1]) if kept else 0)
            with torch.inference_mode(False):  # a buffer made in inference mode could not be written outside it
                buffer = torch.empty(size, dtype=key[1], device=key[0])
                # ~1.4 us a view: made once, then pooled
                kept = (buffer, list(buffer.unbind()), _host_view(buffer))
        self._results[key] = kept
        return kept

    def _pre(self, idx: int, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if idx == 0:
            self._step.stack.clear()  # a top-level call; a previous one may have raised half-way
            if self.on_root_call is not None:
                self.on_root_call(self)
        if not (self.active and self._live):
            return None
        step = self._step
        if idx == 0 and step.autocast is None:
            step.autocast = _autocast_now(args)
        step.stack.append(self._open_call(step, idx, args, kwargs))
        if step.kernels:
            self._run_kernels(step)
        return None

    def _open_call(self, step: _Step, idx: int, args: tuple, kwargs: dict) -> _Call:
        """A call record with its inputs reduced (or found) and their consumer noted."""
        stack = step.stack
        call = _Call(idx, (), stack[-1] if stack else None)
        ins: list[int] = []
        consumers = step.consumers
        plain = not kwargs and (len(args) == 1 and type(args[0]) is torch.Tensor  # the usual call: one tensor
                                or all(type(a) is torch.Tensor for a in args))
        for t in args if plain else _tensors((args, kwargs)):
            if _measurable(t):
                slot = self._slot(step, t)[0]
                ins.append(slot)
                if slot in consumers:
                    consumers[slot].append(call)
                else:
                    consumers[slot] = [call]
        call.ins = tuple(ins)
        return call

    def _leaf_post(self, idx: int, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        """The only hook of a built-in leaf module that never writes its inputs (Linear, Conv,
        norms...): its inputs are read after the call, unchanged, so no pre-hook is needed, one
        Python hook call less per module and step."""
        if not (self.active and self._live):
            return None
        step = self._step
        self._close_call(step, idx, self._open_call(step, idx, args, kwargs), output)
        if step.kernels:
            self._run_kernels(step)
        return None

    def _post(self, idx: int, module: nn.Module, args: tuple, output: Any) -> None:
        if not (self.active and self._live):
            return None
        step = self._step
        stack = step.stack
        if stack and stack[-1].module == idx:
            call = stack.pop()
        else:  # odd nesting (a hook elsewhere raised, re-entrant calls): search down the stack
            i = next((i for i in range(len(stack) - 1, -1, -1) if stack[i].module == idx), None)
            if i is None:
                return None
            call = stack.pop(i)
        self._close_call(step, idx, call, output)
        if step.kernels:
            self._run_kernels(step)
        return None

    def _close_call(self, step: _Step, idx: int, call: _Call, output: Any) -> None:
        grad_on = self.backward and torch.is_grad_enabled()
        if idx in self._transparent and len(call.ins) == 1 and isinstance(output, torch.Tensor):
            # cannot make NaN/Inf from finite input: its output gets a slot that copies its
            # input's values at collect(), so no reduction; a gradient hook only where its
            # backward could hide a non-finite gradient (ReLU's mask turns inf into 0)
            slot = self._alias(step, call.ins[0], output.device)
            step.seen[id(output)] = (weakref.ref(output), _version(output), slot)
            call.outs = (slot,)
            call.dtype = output.dtype
            call.order = len(step.calls)
            step.calls.append(call)
            if grad_on and output.requires_grad and idx not in self._passes_grads:
                self._grad_hook(output, step, call, slot)
            return None
        outs: list[int] = []
        for t in (output,) if isinstance(output, torch.Tensor) else _tensors(output):
            if not _measurable(t):
                continue
            slot, fresh = self._slot(step, t)
            outs.append(slot)
            if fresh and self._aliasing:
                step.producer[slot] = call
            if call.dtype is None:
                call.dtype = t.dtype
            if fresh and grad_on and t.requires_grad and slot not in step.hooked:  # seen: hooked
                self._grad_hook(t, step, call, slot)
        call.outs = tuple(outs)
        call.order = len(step.calls)
        step.calls.append(call)
        if idx == 0:
            # the autograd nodes were only needed to recognise passive outputs in this forward;
            # holding them through backward costs more than the hooks saved (measured: +0.35 ms
            # per step on a 48-module MLP)
            step.nodes.clear()
            if step.hooks_todo:
                self._register_grad_hooks(step)
        return None

    def _register_grad_hooks(self, step: _Step) -> None:
        """At the end of the model's forward, every consumer of every output is known: hook only
        the outputs whose gradient adds something (not those consumed by ReLU-like modules only,
        whose own output gradient is checked; `_out_grad` would drop them anyway). In a model
        of Linear+ReLU blocks this halves the hooks registered per step, the largest per-call
        cost of the hunt (a handle and a partial per hook)."""
        todo, step.hooks_todo = step.hooks_todo, []
        consumers_of, masked, needless = step.consumers.get, step.masked, self._needless
        node_grad = self._node_grad
        for node, nr, call, slot in todo:
            consumers = consumers_of(slot)
            if consumers:
                if needless(consumers):
                    continue
            elif slot in masked:  # read only by an unhooked ReLU-like map,
                continue  # whose output gradient is hooked (`_slot`)
            node.register_prehook(partial(node_grad, step, call, slot, nr, True))

    def _needless(self, consumers: list[_Call]) -> bool:
        """Only ReLU-like modules consumed the output, and their own output gradient is checked:
        they cannot make a finite gradient non-finite, so the output's own adds nothing."""
        masking = self._masks_grads
        for c in consumers:
            if c.module not in masking:
                return False
        return True

    def _out_grad(self, step: _Step, call: _Call, slot: int, grad: torch.Tensor) -> None:
        if not (self._live and grad is not None and _measurable(grad)):
            return
        consumers = step.consumers.get(slot)
        if consumers and self._needless(consumers):
            return
        self._record_out(step, call, slot, grad)

    def _record_out(self, step: _Step, call: _Call, slot: int, grad: torch.Tensor) -> None:
        """The event first, then the reduction: the hook's last work (see `_claim`)."""
        gslot, job = self._claim(step, grad)
        step.grads.append(("out", (call, slot), gslot))
        if job is not None:
            _minmax(*job)

    def _grad_hook(self, t: torch.Tensor, step: _Step, call: _Call, slot: int) -> None:
        node = t.grad_fn
        if node is not None and self.defer_grad_hooks and step.stack and step.stack[0].module == 0:
            step.hooks_todo.append((node, t.output_nr, call, slot))  # hooked when the model's forward ends
        elif node is not None:  # a pre-hook on the node that made t: cheaper than t.register_hook
            node.register_prehook(partial(self._node_grad, step, call, slot, t.output_nr, False))
        else:
            t.register_hook(partial(self._out_grad, step, call, slot))

    def _alias(self, step: _Step, source: int, device: torch.device) -> int:
        """A new slot holding the same values as `source` (filled in at collect)."""
        zero = _zero(device)
        with self._lock:
            slot = len(step.vals) // 2
            step.vals.zeros += (2 * slot, 2 * slot + 1)
            step.vals.append(zero)
            step.vals.append(zero)
            step.alias[slot] = source
        return slot

    def _node_grad(self, step: _Step, call: _Call, slot: int, nr: int, checked: bool,
                   grad_outputs: tuple) -> None:
        """Pre-hook on the autograd node of a module output; `checked`: registered when the
        forward ended, with every consumer known (`_register_grad_hooks`), so the gradient is
        needed and not asked again."""
        if nr < len(grad_outputs):
            grad = grad_outputs[nr]
            if not checked:
                self._out_grad(step, call, slot, grad)
            elif self._live and grad is not None and _measurable(grad):
                self._record_out(step, call, slot, grad)

    def _param_grad(self, pidx: int, grad: torch.Tensor) -> None:
        if not (self._live and self.active) or grad is None:
            return
        step = self._step
        dtype, split = self._param_facts[pidx]
        if grad.dtype is dtype and grad.is_cpu and grad.layout is _STRIDED and not grad.requires_grad:
            # the usual CPU gradient: its parameter's dtype and size, read at attach (autograd
            # hands a parameter a gradient of its own dtype and shape)
            slot, job = self._claim_in(step, grad, (_CPU, dtype), split)
            step.grads.append(("param", pidx, slot))
            if job is not None:
                _minmax(*job)
        elif _measurable(grad):
            slot, job = self._claim(step, grad)
            step.grads.append(("param", pidx, slot))
            if job is not None:
                _minmax(*job)

    # -- analysis ----------------------------------------------------------------------
    def collect(self) -> StepReport:
        """Synchronise once, analyse the step recorded so far, and start a new one."""
        step, self._step = self._step, _Step()
        values = _to_host(step.vals)
        if all(map(math.isfinite, values)):  # the usual step: nothing to localise
            return StepReport(None, None, False, partial(self._finite_call_summary, step, values),
                              len(step.calls), len(step.grads), step.autocast)
        lo = values[0::2]
        hi = values[1::2]
        finite = [math.isfinite(a) and math.isfinite(b) for a, b in zip(lo, hi)]
        max_abs = [max(abs(a), abs(b)) if f else (float("nan") if (math.isnan(a) or math.isnan(b)) else float("inf"))
                   for a, b, f in zip(lo, hi, finite)]
        values = [None if f else nonfinite_value(a, b) for a, b, f in zip(lo, hi, finite)]
        for slot, source in step.alias.items():  # in creation order, so chains resolve
            finite[slot], max_abs[slot], values[slot] = finite[source], max_abs[source], values[source]
            lo[slot], hi[slot] = lo[source], hi[source]
        self._values = values
        fwd = self._first_forward(step, finite, max_abs) if self.forward else None
        bwd, loss_grad = self._first_backward(step, finite, max_abs) if self.backward else (None, False)
        return StepReport(fwd, bwd, loss_grad, partial(self._call_summary, step, finite, max_abs, lo, hi),
                          len(step.calls), len(step.grads), step.autocast)

    def _finite_call_summary(self, step: _Step, values: list[float]) -> list[dict]:
        """`_call_summary` of an all-finite step, from its raw (min, max) pairs."""
        lo, hi = values[0::2], values[1::2]
        for slot, source in step.alias.items():  # in creation order, so chains resolve
            lo[slot], hi[slot] = lo[source], hi[source]
        max_abs = [max(-a, b) + 0.0 for a, b in zip(lo, hi)]  # + 0.0: an all-zero output's -0.0 is 0.0
        return self._call_summary(step, [True] * len(max_abs), max_abs, lo, hi)

    def _call_summary(self, step: _Step, finite: list[bool], max_abs: list[float], lo: list[float],
                      hi: list[float]) -> list[dict]:
        """Per call: module, whether its outputs are finite, their max |x|, and their smallest and
        largest value (a collapse check compares them across precisions: all zeros in float16
        where float32 varies). A zero extreme is reported as 0.0: which signed zero `aminmax` or
        `amin`/`amax` returns depends on the kernel and on where the -0.0s lie (in float16, an
        underflowed negative value), so "-0.0" would be noise in the report (+ 0.0)."""
        return [{"module": self._names[c.module], "finite": all(finite[s] for s in c.outs),
                 "max_abs": max((max_abs[s] for s in c.outs), default=0.0),
                 "min": min((lo[s] for s in c.outs), default=0.0) + 0.0,
                 "max": max((hi[s] for s in c.outs), default=0.0) + 0.0,
                 "constant": bool(c.outs) and all(lo[s] == hi[s] for s in c.outs)} for c in step.calls]

    def _describe(self, call: _Call) -> dict:
        return {"module": self._names[call.module], "class": self._classes[call.module],
                "dtype": _dtype_name(call.dtype)}

    def _first_forward(self, step: _Step, finite: list[bool], max_abs: list[float]) -> dict | None:
        occurrences: dict[int, int] = {}
        for call in step.calls:
            occurrences[call.module] = occurrences.get(call.module, 0) + 1
            bad = [s for s in call.outs if not finite[s]]
            if not bad:
                continue
            inputs_finite = all(finite[s] for s in call.ins)
            out = self._describe(call)
            out.update({
                "phase": "forward",
                "kind": "nan" if any(math.isnan(max_abs[s]) for s in bad) else "inf",
                "value": combined_value(self._values[s] for s in bad),
                "created": inputs_finite,
                "inputs_finite": inputs_finite,
                "input_max_abs": [number(max_abs[s]) for s in call.ins],
                "output_max_abs": [number(max_abs[s]) for s in call.outs],
                "call_index": call.order,
                "occurrence": occurrences[call.module],
                "autocast": step.autocast,
            })
            if not inputs_finite:
                out["source"], maker = self._forward_source(step, call, finite)
                if maker is not None:  # the module whose own forward() code made the value
                    out["made_by"] = {"module": self._names[maker.module], "class": self._classes[maker.module],
                                      "call_index": maker.order,
                                      "input_max_abs": [number(max_abs[s]) for s in maker.ins]}
            return out
        return None

    def _forward_source(self, step: _Step, call: _Call, finite: list[bool]) -> tuple[str, _Call | None]:
        """Where a non-finite input of the first bad call came from, when no module made it:
        the batch, or the code of the innermost enclosing module whose own inputs were finite
        (a value made in a parent's forward() and handed down through its child is the parent's)."""
        bad = [s for s in call.ins if not finite[s]]
        root = step.calls[-1] if step.calls and step.calls[-1].module == 0 else None
        if root is not None and any(s in root.ins for s in bad):
            return "the model's input batch is already non-finite", None
        maker = call.parent
        while maker is not None and not all(finite[s] for s in maker.ins):
            maker = maker.parent
        if maker is not None:
            name = self._names[maker.module] or "<root>"
            return f"code in the forward() of '{name}' ({self._classes[maker.module]}) outside any submodule", maker
        return "outside the hooked model", None

    def _first_backward(self, step: _Step, finite: list[bool], max_abs: list[float]) -> tuple[dict | None, bool]:
        seen_out: dict[int, list[float]] = {}  # call order -> grad max |x| of its outputs so far
        for kind, ref, slot in step.grads:
            if finite[slot]:
                if kind == "out":
                    seen_out.setdefault(ref[0].order, []).append(max_abs[slot])
                continue
            base = {"phase": "backward", "kind": "nan" if math.isnan(max_abs[slot]) else "inf",
                    "value": self._values[slot],
                    "grad_max_abs": number(max_abs[slot])}
            if kind == "param":
                owner = self._param_owner[ref]
                info = {"module": self._names[owner], "class": self._classes[owner],
                        "dtype": None, "grad_of": "parameter", "parameter": self._param_names[ref]}
                calls = [c for c in step.calls if c.module == owner]
                info["dtype"] = _dtype_name(calls[0].dtype) if calls else None
                info["grad_output_max_abs"] = [number(v) for c in calls for v in seen_out.get(c.order, [])]
                info["created"] = True
                return {**info, **base}, False
            call, out_slot = ref
            culprit, grad_of, candidates = self._backward_culprit(step, call, out_slot)
            if culprit is None:  # the loss's own gradient: name the module that made the output
                info = self._describe(call)
                info.update({"grad_of": "loss", "created": True, "grad_output_max_abs": [], "note":
                             "the gradient of the loss with respect to the model's output is already non-finite"})
                return {**info, **base}, True
            info = self._describe(culprit)
            info.update({"grad_of": grad_of, "created": True,
                         "grad_output_max_abs": [number(v) for v in seen_out.get(culprit.order, [])],
                         "grad_input_from": self._names[call.module]})
            if len(candidates) > 1:
                info["candidates"] = [self._names[c.module] for c in candidates]
            return {**info, **base}, False
        return None, False

    @staticmethod
    def _consumers(step: _Step, slot: int) -> list[_Call]:
        """Calls that took `slot` as input, directly or through unhooked passive modules (whose
        outputs are alias slots of their inputs): a ReLU between two Linears passes the blame."""
        found = list(step.consumers.get(slot, []))
        if step.passive:
            todo = [slot]
            while todo:
                source = todo.pop()
                for alias in step.passive:
                    if step.alias.get(alias) == source:
                        found.extend(step.consumers.get(alias, []))
                        todo.append(alias)
        return found

    def _backward_culprit(self, step: _Step, call: _Call, slot: int) -> tuple[_Call | None, str, list[_Call]]:
        """The call whose backward turned finite gradients into the non-finite one at `slot`.

        The gradient w.r.t. a module's output is made by whatever consumed that output: a
        later module (its backward), or code in the enclosing module's forward, or the loss.
        """
        consumers = sorted(self._consumers(step, slot), key=lambda c: -c.order)
        consumers = [c for c in consumers if c.order >= 0]
        if consumers:
            culprit = consumers[0]
            # a transparent module without a gradient hook only passed the gradient through:
            # the blame belongs to whatever consumed its output
            while culprit.module in self._passes_grads and culprit.outs:
                nxt = [c for c in step.consumers.get(culprit.outs[0], []) if c.order >= 0]
                if not nxt:
                    break
                culprit = max(nxt, key=lambda c: c.order)
            return culprit, "input", consumers
        parent = call.parent
        while parent is not None and slot in parent.outs:
            parent = parent.parent
        if parent is None:
            return None, "loss", []
        return parent, "forward code", [parent]


# Modules that cannot turn finite values into NaN/Inf in any dtype, forward or backward:
# |f(x)| <= |x| + 1 and bounded derivatives. Dropout is NOT here: its 1/(1-p) rescaling can
# push a float16 value past 65504; nor are ELU/SELU/CELU (scaling) or Threshold (any value).
_TRANSPARENT_TYPES = (nn.ReLU, nn.ReLU6, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.Hardsigmoid,
                      nn.Hardswish, nn.Mish, nn.Softsign, nn.Tanhshrink, nn.Identity, nn.Flatten,
                      nn.Unflatten)


# ... of which these compute their backward by multiplication (or pass it through), so a
# non-finite gradient stays non-finite through them: no gradient hook needed on their output.
_PASSES_GRADS = (nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.Mish, nn.Softsign, nn.Tanhshrink,
                 nn.Identity, nn.Flatten, nn.Unflatten)


def _bounded_slope(node) -> bool:
    return abs(float(node._saved_negative_slope)) <= 1


def _finite_bounds(node) -> bool:
    return not (math.isnan(float(node._saved_min_val)) or math.isnan(float(node._saved_max_val)))


def _elu_ok(node) -> bool:
    alpha, scale, in_scale = (float(node._saved_alpha), float(node._saved_scale),
                              float(node._saved_input_scale))
    return 0 <= alpha <= 1 and scale == 1 and in_scale == 1  # plain ELU; SELU's scale > 1


def _always(node) -> bool:
    return True


# autograd nodes whose output cannot be the first non-finite value, forward or backward (see
# the module docstring), with a check of their saved arguments where those matter; views and
# copies keep every value. A tensor made by one of them from a tensor already reduced this step
# shares that tensor's finiteness and is not reduced again.
_PASSIVE_NODES = {
    "ReluBackward0": _always, "GeluBackward0": _always, "SiluBackward0": _always,
    "MishBackward0": _always, "TanhBackward0": _always, "SigmoidBackward0": _always,
    "HardsigmoidBackward0": _always, "HardswishBackward0": _always,
    "HardtanhBackward0": _finite_bounds, "LeakyReluBackward0": _bounded_slope, "EluBackward0": _elu_ok,
    "ViewBackward0": _always, "UnsafeViewBackward0": _always, "CloneBackward0": _always,
}


# passive nodes whose backward zeroes part of the gradient (a mask, not a product)
_MASKING_NODES = {"ReluBackward0", "HardtanhBackward0", "HardsigmoidBackward0", "HardswishBackward0",
                  "LeakyReluBackward0"}


def _is_passive(module: nn.Module) -> bool:
    """Needs no hooks: cannot be the first to make a non-finite value, and its output is found
    by its autograd node where it is next used (`_PASSIVE_NODES`)."""
    kind = type(module)
    if kind in (nn.ReLU, nn.ReLU6, nn.GELU, nn.SiLU, nn.Mish, nn.Tanh, nn.Sigmoid, nn.Hardsigmoid,
                nn.Hardswish, nn.Identity, nn.Flatten, nn.Unflatten):
        return True
    if kind is nn.LeakyReLU:
        return math.isfinite(module.negative_slope) and abs(module.negative_slope) <= 1
    if kind is nn.Hardtanh:
        return math.isfinite(module.min_val) and math.isfinite(module.max_val)
    if kind is nn.ELU:
        return 0 <= module.alpha <= 1
    if kind in (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout):
        return module.p == 0  # p > 0 rescales by 1/(1-p): a fp16 value near 65504 overflows
    return False


def _keeps_inputs(module: nn.Module) -> bool:
    """A leaf module of torch.nn itself, not in-place: its forward never writes its inputs, so
    they can be read after the call (a user's module, or an `inplace=True` one, may)."""
    kind = type(module)
    return (kind.__module__.startswith("torch.nn.modules.") and not module._modules
            and not getattr(module, "inplace", False) and kind.forward is not nn.Module.forward)


def _unhooked_modules(model: nn.Module, ignore: Sequence[str]) -> set[int]:
    """ids of the modules that need no hooks (module docstring): passive maps, and Sequential
    containers whose children are all hooked or such containers. The model itself is always
    hooked; a container of an ignored module keeps its hooks."""
    out: set[int] = set()

    def visit(name: str, module: nn.Module) -> bool:  # True: what it hands on is seen by a hook
        if any(fnmatch.fnmatchcase(name, pat) for pat in ignore):
            return False
        kids = list(module.named_children())
        covered = [visit(f"{name}.{k}", m) for k, m in kids]  # all: passive grandchildren too
        if not kids and _is_passive(module):
            out.add(id(module))
            return False
        if type(module) is nn.Sequential and kids and all(covered):
            out.add(id(module))
        return True

    for name, child in model.named_children():
        visit(name, child)
    return out


def _is_transparent(module: nn.Module) -> bool:
    kind = type(module)  # exact type: a subclass may override forward()
    if kind in _TRANSPARENT_TYPES:
        return True
    if kind is nn.LeakyReLU:
        return math.isfinite(module.negative_slope) and abs(module.negative_slope) <= 1
    if kind is nn.Hardtanh:
        return not (math.isnan(module.min_val) or math.isnan(module.max_val))
    return False


def _autocast_now(args: tuple) -> str | None:
    """Autocast dtype active for the device of the first input tensor (None when off)."""
    device_type = "cpu"
    for t in _tensors(args):
        device_type = t.device.type
        break
    try:
        if torch.is_autocast_enabled(device_type):
            return _dtype_name(torch.get_autocast_dtype(device_type))
    except (RuntimeError, TypeError):  # device type without autocast support
        return None
    return None


def _host_view(buffer: torch.Tensor) -> memoryview | None:
    """The memory of a CPU float32 result buffer, read by `collect()` without a torch op: right
    after a training step the first torch op runs from cold caches (a CNN step: the slice and
    `tolist()` of the buffer 45 us, this view's `tolist()` 20 us). Other dtypes keep the torch
    path, which reports them as float32 values."""
    if buffer.device.type != "cpu" or buffer.dtype is not torch.float32:
        return None
    try:
        return memoryview(buffer.numpy())
    except (RuntimeError, TypeError, ValueError):  # no NumPy in this environment
        return None


def _to_host(vals: list[torch.Tensor]) -> list[float]:
    """All recorded 0-d values as floats: one stacked copy per device, the step's only sync."""
    if not vals:
        return []
    buffer = getattr(vals, "buffer", None)
    if buffer is not None:  # one buffer, each value at its own index (`_Values`)
        host = vals.host
        out = host[:len(vals)].tolist() if host is not None else buffer[:len(vals)].float().tolist()
        for i in vals.zeros:
            out[i] = 0.0
        return out
    try:
        return torch.stack(vals).float().tolist()
    except RuntimeError:  # values on several devices (model parallel, or CPU placeholders)
        pass
    out = [0.0] * len(vals)
    by_device: dict[torch.device, list[int]] = {}
    for i, v in enumerate(vals):
        by_device.setdefault(v.device, []).append(i)
    for idxs in by_device.values():
        for i, x in zip(idxs, torch.stack([vals[i] for i in idxs]).float().tolist()):
            out[i] = x
    return out
