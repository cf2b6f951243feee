"""Synthetic batches, made the same way for every spec kind.

Random numbers are drawn on the CPU from the caller's generator (so a seed gives the same batch
on every device) and then moved; on the `meta` device nothing is drawn at all, which is what lets
the size estimate and the dry run look at a model without allocating it.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F


def float_input(shape: Sequence[int], device: torch.device, gen: torch.Generator | None,
                scale: float = 1.0) -> torch.Tensor:
    shape = tuple(int(s) for s in shape)
    if torch.device(device).type == "meta":
        return torch.empty(shape, dtype=torch.float32, device="meta")
    x = torch.randn(shape, generator=gen, dtype=torch.float32)
    if scale != 1.0:
        x = x * scale
    return x.to(device)


def int_input(shape: Sequence[int], high: int, device: torch.device,
              gen: torch.Generator | None) -> torch.Tensor:
    shape = tuple(int(s) for s in shape)
    if torch.device(device).type == "meta":
        return torch.empty(shape, dtype=torch.int64, device="meta")
    return torch.randint(0, int(high), shape, generator=gen, dtype=torch.int64).to(device)


def cross_entropy_last_dim(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy with the classes on the last dimension: (B, C), (B, T, C), ... ."""
    return F.cross_entropy(output.reshape(-1, output.shape[-1]).float(), target.reshape(-1))


def mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(output.float(), target.float())


def mean_output(output: torch.Tensor, target=None) -> torch.Tensor:
    """Loss for specs without a target: the model's output reduced to a scalar."""
    return output.float().mean()


def mse_to_zero(output: torch.Tensor, target=None) -> torch.Tensor:
    return output.float().pow(2).mean()
