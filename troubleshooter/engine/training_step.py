"""One training step in a given precision, shared by the checks that train a model for real.

The skip-rate probe (and anyone else who needs it: the NaN hunt, the speedup check) builds the
model and optimizer the same way and steps them the same way, so "an fp16 step" measured by one
check is the step another check reasons about. Precision handling itself lives in `precision`.
"""
from __future__ import annotations

import copy
import gc
from typing import Any
import torch
from torch import nn

from ..workload import Batch, Workload
from . import precision as prec


def build(workload: Workload, device: torch.device, seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    """A fresh, seeded model on `device` in train mode, and its optimizer."""
    torch.manual_seed(seed)
    model = workload.build_model().to(device)
    model.train()
    return model, workload.make_optimizer(list(model.parameters()))


class SeededStart:
    """Every precision's model starts from one seeded build, copied: identical weights, and one
    build's cost instead of one per precision (a GPT-2 small build is about 1 s of CPU, so four of
    them were a fifth of the speedup check's default budget on a GPU). A model that cannot be
    deep-copied is built again from the seed, as before."""

    def __init__(self, workload: Workload, seed: int = 0):
        self.workload, self.seed = workload, seed
        self._master: nn.Module | None = None
        self._copyable = True

    def build(self, device: torch.device, last: bool = False) -> tuple[nn.Module, torch.optim.Optimizer]:
        """A model with the seeded start on `device` in train mode, and its optimizer; `last`
        hands over the kept build itself (no copy). The RNG is reseeded, so every precision also
        sees the same dropout masks."""
        if not self._copyable:
            return build(self.workload, device, self.seed)
        if self._master is None:
            torch.manual_seed(self.seed)
            self._master = self.workload.build_model()
        if last:
            model, self._master = self._master, None
        else:
            try:
                model = copy.deepcopy(self._master)
            except Exception:  # noqa: BLE001 - a user's module may refuse deepcopy: rebuild it instead
                self._copyable, self._master = False, None
                return build(self.workload, device, self.seed)
        torch.manual_seed(self.seed)
        model = model.to(device)
        model.train()
        return model, self.workload.make_optimizer(list(model.parameters()))


def _to_device(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.pin_memory().to(device, non_blocking=True)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_device(o, device) for o in obj)
    if isinstance(obj, dict):
        return {k: _to_device(v, device) for k, v in obj.items()}
    return obj


def device_batch(workload: Workload, device: torch.device, seed: int) -> Batch:
    """The seeded synthetic batch on `device`. On CUDA it is made on the host and copied from
    pinned memory without blocking, so making a batch does not wait for the previous step's
    kernels (a pageable copy would: one hidden sync per step)."""
    if device.type != "cuda":
        return workload.batch(device, seed=seed)
    return _to_device(workload.batch(torch.device("cpu"), seed=seed), device)


def training_step(
    workload: Workload,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    batch: Batch,
    precision: str,
    device: torch.device,
) -> torch.Tensor:
    """forward (autocast) -> scaled backward -> scaler.step -> scaler.update.

    Returns the unscaled loss as a detached device tensor: no host sync happens here, so a
    caller stepping many times decides when to synchronise.
    """
    optimizer.zero_grad(set_to_none=True)
    with prec.autocast(precision, device):
        loss = workload.loss(model, batch)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss.detach().float()


def release(device: torch.device | str | None = None) -> None:
    """Give cached device memory back after a check (or its OOM); callers drop their references first."""
    gc.collect()
    if torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda"):
        torch.cuda.empty_cache()


def is_oom(exc: BaseException) -> bool:
    """CUDA/MPS/CPU allocation failures all read as 'out of memory' to the user."""
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(exc, (RuntimeError, MemoryError)) and (
        isinstance(exc, MemoryError) or "out of memory" in str(exc).lower()
    )
