"""A `Workload`: a model and what it takes to train it for a few steps on synthetic data.

The spec loaders (YAML, presets, a user's Python file) produce one; every engine check and
the speedup check consume one. Keeping this the only contract between them lets each check
stay ignorant of where the model came from.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import nn

# A batch is (inputs, target): inputs is passed to the model as model(*inputs);
# target is whatever loss_fn expects (None for models that compute their own loss).
Batch = tuple[tuple[Any, ...], Any]


@dataclass
class Workload:
    name: str
    build_model: Callable[[], nn.Module]  # a fresh float32 model on CPU; deterministic after torch.manual_seed
    make_batch: Callable[[int, torch.device, torch.Generator], Batch]  # (batch_size, device, generator)
    loss_fn: Callable[[Any, Any], torch.Tensor]  # (model output, target) -> scalar loss
    make_optimizer: Callable[[Sequence[nn.Parameter]], torch.optim.Optimizer]
    batch_size: int
    loss_weight: float = 1.0  # multiplier on the loss (models a tiny/huge loss scale in the user's code)
    seq_len: int | None = None  # tokens per sample, for language models (throughput in tokens/s)
    flops_per_step: float | None = None  # forward + backward FLOPs of one training step, when known
    summary: dict[str, Any] = field(default_factory=dict)  # JSON-able description for reports

    @property
    def samples_unit(self) -> str:
        return "tokens/s" if self.seq_len else "samples/s"

    @property
    def items_per_step(self) -> int:
        return self.batch_size * (self.seq_len or 1)

    def batch(self, device: torch.device, seed: int = 0, batch_size: int | None = None) -> Batch:
        gen = torch.Generator(device="cpu").manual_seed(seed)
        return self.make_batch(batch_size or self.batch_size, device, gen)

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """Forward and loss, with the loss weight applied; call inside the precision's autocast."""
        inputs, target = batch
        output = model(*inputs)
        return self.loss_fn(output, target) * self.loss_weight
