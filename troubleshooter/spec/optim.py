"""Optimizer settings shared by YAML specs and presets, as a picklable factory."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:  # torch only where an optimizer is built: the server's size check reads this class
    import torch
    from torch import nn

OPTIMIZERS = ("adamw", "sgd", "adam")


@dataclass(frozen=True)
class OptimizerConfig:
    name: str = "adamw"
    lr: float = 1e-3
    weight_decay: float | None = None  # None: the optimizer's usual default (0.01 for AdamW, else 0)
    momentum: float = 0.0  # sgd only
    betas: tuple[float, float] = (0.9, 0.999)  # adam / adamw
    eps: float = 1e-8

    def to_dict(self) -> dict:
        d = asdict(self)
        d["betas"] = list(self.betas)
        if self.name == "sgd":
            d.pop("betas"), d.pop("eps")
        else:
            d.pop("momentum")
        return d

    def state_floats_per_param(self) -> int:
        """Float32 values the optimizer keeps per parameter (for the memory estimate)."""
        if self.name in ("adam", "adamw"):
            return 2
        return 1 if self.momentum else 0

    def __call__(self, params: Sequence[nn.Parameter]) -> torch.optim.Optimizer:
        import torch

        params = list(params)
        if self.name == "sgd":
            return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum,
                                   weight_decay=self.weight_decay or 0.0)
        cls = torch.optim.AdamW if self.name == "adamw" else torch.optim.Adam
        wd = self.weight_decay if self.weight_decay is not None else (0.01 if self.name == "adamw" else 0.0)
        return cls(params, lr=self.lr, betas=tuple(self.betas), eps=self.eps, weight_decay=wd)
