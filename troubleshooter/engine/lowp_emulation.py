"""Half-precision matrix products and convolutions on a CPU without the instructions for them,
computed in float32 from the same half-precision inputs and rounded once to half precision.

PyTorch's CPU float16 kernels on a CPU without avx512_fp16/AMX-FP16 (and its bfloat16 ones
without avx512_bf16/AMX) are 40-200x slower than float32 (a transposed fp16 GEMM of the GPT
preset's backward: 0.6-8 s against 35 ms), so one fp16 step of a small GPT took 8 s and the
checks could not fit a 60 s budget. Those kernels accumulate in float32, as GPU tensor cores do,
so the float32 product of the half inputs rounded to half gives the same numbers up to summation
order (and an overflow past 65504 is still inf) in float32's time. The checks measure numerics,
never speed, so `check` runs under this mode on a CPU; `speedup` and `trace` never do.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from . import cpu_features

_aten = torch.ops.aten
# Every op whose CPU half-precision kernel is the slow one; all elementwise ops are fast enough.
EMULATED_OPS = frozenset({
    _aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten.baddbmm.default, _aten.addbmm.default,
    _aten.mv.default, _aten.addmv.default, _aten.convolution.default, _aten.convolution_backward.default,
})
_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
_active: list["HalfOnFloat32"] = []  # the modes entered on this process (innermost last)


def slow_half_dtypes(flags: dict[str, bool | None] | None = None) -> list[torch.dtype]:
    """The half-precision dtypes this CPU has no native instructions for (unknown flags: none)."""
    flags = cpu_features.cpu_features()["flags"] if flags is None else flags
    slow = []
    if not any(flags.get(f) for f in cpu_features.FP16_FLAGS):
        slow.append(torch.float16)
    if not any(flags.get(f) for f in cpu_features.BF16_FLAGS):
        slow.append(torch.bfloat16)
    return slow


class HalfOnFloat32(TorchDispatchMode):
    """Runs the ops in EMULATED_OPS whose floating inputs are all one of `dtypes` (on the CPU) in
    float32 and rounds their results back; every other op runs untouched. Counts what it did."""

    def __init__(self, dtypes: list[torch.dtype]):
        super().__init__()
        self.dtypes = frozenset(dtypes)
        self.calls: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        dtype = self._emulated_dtype(func, args, kwargs) if func in EMULATED_OPS else None
        if dtype is None:
            return func(*args, **kwargs)
        name = _NAMES[dtype]
        self.calls[name] = self.calls.get(name, 0) + 1

        def up(x: Any) -> Any:
            return x.float() if isinstance(x, torch.Tensor) and x.dtype == dtype else x

        def down(x: Any) -> Any:
            return x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x

        return tree_map(down, func(*tree_map(up, args), **tree_map(up, kwargs)))

    def _emulated_dtype(self, func, args, kwargs) -> torch.dtype | None:
        """The one half dtype of all floating tensor inputs, when it is emulated (mixed: None,
        so the kernel raises its own error)."""
        found = set()
        for x in list(args) + list(kwargs.values()):
            if isinstance(x, torch.Tensor) and x.is_floating_point():
                if x.device.type != "cpu":
                    return None
                found.add(x.dtype)
        if len(found) != 1:
            return None
        (dtype,) = found
        return dtype if dtype in self.dtypes else None

    def __enter__(self):
        _active.append(self)
        return super().__enter__()

    def __exit__(self, *exc):
        _active.remove(self)
        return super().__exit__(*exc)


def emulated(precision: str) -> bool:
    """An active mode computes `precision`'s ('fp16'/'bf16') products in float32."""
    return any(precision in (_NAMES[d] for d in mode.dtypes) for mode in _active)


@contextlib.contextmanager
def half_on_float32(device: torch.device, dtypes: list[torch.dtype] | None = None) -> Iterator[HalfOnFloat32 | None]:
    """The emulation for a run on `device`: on a CPU, for the half dtypes it has no instructions
    for (or `dtypes`); None elsewhere (a GPU's own kernels are the thing to measure)."""
    if torch.device(device).type != "cpu":
        yield None
        return
    dtypes = slow_half_dtypes() if dtypes is None else dtypes
    if not dtypes:
        yield None
        return
    with HalfOnFloat32(dtypes) as mode:
        yield mode


def describe(mode: HalfOnFloat32 | None) -> dict[str, Any] | None:
    """What the report says about the emulation (None: nothing was emulated)."""
    if mode is None or not mode.calls:
        return None
    names = sorted(mode.calls)
    return {"precisions": names, "ops": dict(sorted(mode.calls.items())),
            "note": (f"this CPU has no {'/'.join(names)} instructions, so {'/'.join(names)} matrix products and "
                     "convolutions were computed in float32 from the same half-precision inputs and rounded "
                     "once, as GPU tensor cores do: the numbers of PyTorch's CPU kernels (to summation order), "
                     "in a fraction of their time")}
