"""One training step in a given precision, shared by the checks that train a model for real.

The skip-rate probe (and anyone else who needs it: the NaN hunt, the speedup check) builds the
model and optimizer the same way and steps them the same way, so "an fp16 step" measured by one
check is the step another check reasons about. Precision handling itself lives in `precision`.
"""
from __future__ import annotations

import contextlib
import contextvars
import copy
import gc
from collections.abc import Iterator
from typing import Any
import torch
from torch import nn

from ..workload import Batch, Workload
from . import precision as prec


def build(workload: Workload, device: torch.device, seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    """A fresh, seeded model on `device` in train mode, and its optimizer. Inside
    `shared_start(workload, seed)` it is a copy of one kept build instead (same weights, same RNG
    state after it)."""
    shared = _SHARED.get()
    if shared is not None and shared.workload is workload and shared.seed == seed:
        return shared.build(device)
    return _fresh_build(workload, device, seed)


def _fresh_build(workload: Workload, device: torch.device, seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    return _placed(workload.build_model(), device, workload)


class SeededStart:
    """Every model a check or the speedup check trains starts from one seeded build, copied:
    identical weights, and one build's cost instead of one per precision or check (a GPT-2 small
    build is about 1 s of CPU: four of them were a fifth of the speedup check's default budget
    on a GPU). After a copy the RNG is left as a fresh seeded build would leave it, so dropout
    masks and batches are what they were. A model that cannot be deep-copied is built again."""

    def __init__(self, workload: Workload, seed: int = 0):
        self.workload, self.seed = workload, seed
        self._master: nn.Module | None = None
        self._rng_after_build: torch.Tensor | None = None
        self._copyable = True

    def build(self, device: torch.device, last: bool = False) -> tuple[nn.Module, torch.optim.Optimizer]:
        """A model with the seeded start on `device` in train mode, and its optimizer; `last`
        hands over the kept build itself (no copy)."""
        if not self._copyable:
            return _fresh_build(self.workload, device, self.seed)
        if self._master is None:
            torch.manual_seed(self.seed)
            self._master = self.workload.build_model()
            self._rng_after_build = torch.get_rng_state()
            if not _on_cpu(self._master):  # a kept copy on a GPU would take the memory the checks need
                self._copyable, model, self._master = False, self._master, None
                return _placed(model, device, self.workload)
        if last:
            model, self._master = self._master, None
        else:
            try:
                model = copy.deepcopy(self._master)
            except Exception:  # noqa: BLE001 - a user's module may refuse deepcopy: rebuild it instead
                self._copyable, self._master = False, None
                return _fresh_build(self.workload, device, self.seed)
        torch.manual_seed(self.seed)  # every device's generator as after a seeded build ...
        torch.set_rng_state(self._rng_after_build)  # ... and the CPU's past the build's draws
        return _placed(model, device, self.workload)


def _on_cpu(model: nn.Module) -> bool:
    return all(t.device.type == "cpu" for t in (*model.parameters(), *model.buffers()))


def _placed(model: nn.Module, device: torch.device, workload: Workload) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = model.to(device)
    model.train()
    return model, workload.make_optimizer(list(model.parameters()))


_SHARED: contextvars.ContextVar[SeededStart | None] = contextvars.ContextVar("shared_start", default=None)


@contextlib.contextmanager
def shared_start(workload: Workload, seed: int = 0) -> Iterator[SeededStart]:
    """Within it, `build(workload, device, seed)` copies one kept build (dropped on exit)."""
    token = _SHARED.set(SeededStart(workload, seed))
    try:
        yield _SHARED.get()
    finally:
        _SHARED.reset(token)


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
