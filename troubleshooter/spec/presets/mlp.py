"""`mlp`: a plain stack of Linear layers, the smallest thing worth checking."""
from __future__ import annotations

from torch import nn

from .. import batches
from . import Preset
from .catalogue import entry
from .shapes import ACTIVATIONS, checks

_ACT = dict(zip(ACTIVATIONS, (nn.ReLU, nn.GELU, nn.SiLU, nn.Tanh)))


def build(cfg: dict) -> nn.Module:
    """nn.Sequential, so module paths are `0`, `1`, ... like a YAML layers stack."""
    layers: list[nn.Module] = []
    width = cfg["in_features"]
    for _ in range(cfg["depth"] - 1):
        layers += [nn.Linear(width, cfg["hidden"]), _ACT[cfg["activation"]]()]
        width = cfg["hidden"]
    layers.append(nn.Linear(width, cfg["num_classes"]))
    return nn.Sequential(*layers)


def make_batch(cfg: dict, batch_size: int, device, gen):
    x = batches.float_input((batch_size, cfg["in_features"]), device, gen)
    y = batches.int_input((batch_size,), cfg["num_classes"], device, gen)
    return (x,), y


PRESET = Preset(
    **entry("mlp"),
    **checks("mlp"),
    build=build,
    make_batch=make_batch,
    loss_fn=batches.cross_entropy_last_dim,
)
