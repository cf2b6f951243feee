"""With --nan: does the traced model's half-precision forward silently collapse (a module's output
all zeros or one value where float32's varies, AMP212)? Checked once, on the first step that ran
in half precision, with the engine's collapse reading (`engine/collapse.py`).

The step's forward is run again, as it ran (its autocast, its half weights) and in float32
(autocast off; a model with half weights on a float32 copy of it), both with the NaN-hunt hooks
recording every module output's min and max, under no_grad, with RNG streams and buffers put
back after each run. When a call collapsed, the module's ops are recorded in both runs to name
the op that started it.
"""
from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from ..engine.collapse import first_bad_op, first_collapse, record_module_ops
from ..engine.nanhooks import HookSet

HALF = (torch.float16, torch.bfloat16)
MAX_COPY_ELEMENTS = 64 * 2**20  # a float32 copy of a half-weight model only up to this size


def _up(obj: Any, depth: int = 0) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.float() if obj.dtype in HALF else obj
    if depth < 3 and isinstance(obj, (list, tuple)):
        return type(obj)(_up(x, depth + 1) for x in obj)
    if depth < 3 and isinstance(obj, dict):
        return {k: _up(v, depth + 1) for k, v in obj.items()}
    return obj


def _calls(model: nn.Module, forward) -> list[dict]:
    hooks = HookSet(model, backward=False).attach()
    try:
        with torch.no_grad():
            forward()
        return hooks.collect().calls
    finally:
        hooks.detach()


def check(model: nn.Module, last_in: tuple, restored) -> dict | None:
    """The collapse of this model's half-precision forward on `last_in` (args, kwargs, autocast
    as it ran), or None (none, no half precision, or it could not be run). `restored(model)` is
    the context that puts RNG state and buffers back."""
    args, kwargs, (device, ac_on, ac_dtype) = last_in
    half_weights = sum(p.numel() for p in model.parameters() if p.dtype in HALF)
    half_ac = bool(ac_on) and ac_dtype in HALF
    if not (half_weights or half_ac):
        return None
    if half_weights:
        if sum(p.numel() for p in model.parameters()) > MAX_COPY_ELEMENTS:
            return None
        ref_model = copy.deepcopy(model).float()
        dtype = next(p.dtype for p in model.parameters() if p.dtype in HALF)
    else:
        ref_model, dtype = model, ac_dtype
    precision = "fp16" if dtype == torch.float16 else "bf16"

    def run_half():
        with restored(model), torch.autocast(device, dtype=ac_dtype, enabled=bool(ac_on)):
            model(*args, **kwargs)

    def run_ref():
        with restored(ref_model), torch.autocast(device, enabled=False):
            ref_model(*_up(args), **_up(kwargs))

    found = first_collapse(_calls(model, run_half), _calls(ref_model, run_ref))
    if found is None:
        return None
    name = found["module"]
    op = first_bad_op(record_module_ops(model, name, found["occurrence"], run_half),
                      record_module_ops(ref_model, name, found["occurrence"], run_ref))
    cls = type(model.get_submodule(name) if name else model).__name__
    return {"collapse": found, "op": op, "class": cls, "precision": precision,
            "reference": "a float32 copy of the model" if half_weights else "autocast off"}
