"""What fp16 training with GradScaler really does to the gradients, measured on one real step.

The fp32 reference gradients say which elements should be nonzero. One fp16 autocast step with
the loss multiplied by GradScaler's scale (its default 65536, halved while the scaled gradients
are not finite, as GradScaler backs off) says which of them come out as zero: those are the
gradients fp16 loses. A gradient that autocast computes in float32 (LayerNorm's parameters)
is lost only when what flows into it already was, so nothing is counted that fp16 would not
really lose. Elements that fall below float16's smallest subnormal (6e-8) after scaling flush to
zero; subnormals (below 6.1e-5) lose digits but survive, so they are not counted as lost.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from . import precision as prec

DEFAULT_SCALE = 65536.0  # torch.amp.GradScaler's init_scale
MAX_BACKOFFS = 8  # halvings tried before saying no scale gives finite gradients


@dataclass
class ScaledStep:
    """One real fp16 + loss-scale step against the fp32 reference gradients."""

    scale: float | None  # the scale whose gradients came out finite (None: none did)
    backoffs: int
    lost: list[int]  # per owner module: nonzero in fp32, exactly zero in fp16
    nonzero: list[int]  # per owner module: nonzero in fp32
    relative_error: float | None  # ||g16 / scale - g32|| / ||g32|| over every parameter
    error: str | None = None
    per_module_error: list[float | None] = field(default_factory=list)

    @property
    def lost_share(self) -> float | None:
        total = sum(self.nonzero)
        return sum(self.lost) / total if total and self.scale is not None else None

    def to_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "backoffs": self.backoffs, "lost": sum(self.lost),
                "nonzero": sum(self.nonzero), "lost_share": self.lost_share,
                "gradient_relative_error": self.relative_error, "error": self.error}


def reference_grads(owners: list[tuple[str, nn.Module]]) -> list[list[torch.Tensor | None]]:
    """Copies of the fp32 gradients per owner module (taken right after the reference backward)."""
    return [[None if p.grad is None else p.grad.detach().clone() for p in m.parameters(recurse=False)]
            for _, m in owners]


def _finite(owners) -> bool:
    flags = [torch.isfinite(p.grad).all() for _, m in owners for p in m.parameters(recurse=False)
             if p.grad is not None]
    return bool(torch.stack(flags).all()) if flags else True


def scaled_fp16_step(model: nn.Module, owners: list[tuple[str, nn.Module]], ref: list[list[torch.Tensor | None]],
                     loss_of: Callable[[], torch.Tensor], device: torch.device,
                     start_scale: float = DEFAULT_SCALE) -> ScaledStep:
    """Backward of `loss_of()` (forward included) under fp16 autocast, scaled like GradScaler.

    `loss_of` must run the same seeded forward as the reference step. The model's gradients are
    overwritten (set to None at the end).
    """
    scale = float(start_scale)
    backoffs = 0
    try:
        while True:
            model.zero_grad(set_to_none=True)
            with prec.autocast("fp16", device):
                loss = loss_of()
            if not bool(torch.isfinite(loss.detach()).all()):  # no scale helps a forward overflow
                return ScaledStep(None, backoffs, [0] * len(owners), [0] * len(owners), None,
                                  "the fp16 forward pass is not finite (see AMP202/AMP205)")
            (loss.float() * scale).backward()
            if _finite(owners):
                break
            if backoffs >= MAX_BACKOFFS:
                model.zero_grad(set_to_none=True)
                return ScaledStep(None, backoffs, [0] * len(owners), [0] * len(owners), None,
                                  f"the scaled fp16 gradients are not finite down to scale {scale:g}")
            scale /= 2
            backoffs += 1
        lost, nonzero, errs, num, den = [], [], [], [], []
        zero = torch.zeros((), device=device)
        for (_, m), refs in zip(owners, ref):
            l_m, n_m, num_m, den_m = zero, zero, zero, zero
            for p, r in zip(m.parameters(recurse=False), refs):
                if r is None:
                    continue
                g = p.grad.detach().float() / scale if p.grad is not None else torch.zeros_like(r)
                nz = r != 0
                l_m = l_m + (nz & (g == 0)).sum()
                n_m = n_m + nz.sum()
                num_m = num_m + (g - r).double().pow(2).sum()
                den_m = den_m + r.double().pow(2).sum()
            lost.append(l_m)
            nonzero.append(n_m)
            num.append(num_m)
            den.append(den_m)
        counts = torch.stack([torch.stack(lost), torch.stack(nonzero)]).to(torch.int64).tolist() if owners else [[], []]
        num_h = torch.stack(num).tolist() if owners else []
        den_h = torch.stack(den).tolist() if owners else []
        total_den = sum(den_h)
        rel = math.sqrt(sum(num_h) / total_den) if total_den > 0 else None
        errs = [math.sqrt(a / b) if b > 0 else None for a, b in zip(num_h, den_h)]
        return ScaledStep(scale, backoffs, counts[0], counts[1], rel, per_module_error=errs)
    except Exception as exc:  # noqa: BLE001 - an op without an fp16 kernel on this device
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return ScaledStep(None, backoffs, [0] * len(owners), [0] * len(owners), None,
                          f"{type(exc).__name__}: {text}"[:300])
    finally:
        model.zero_grad(set_to_none=True)
