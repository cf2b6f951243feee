"""`mlp`: a plain stack of Linear layers, the smallest thing worth checking."""
from __future__ import annotations

from torch import nn

from .. import batches
from . import Preset
from .catalogue import entry

_ACT = {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU, "tanh": nn.Tanh}


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


def size(cfg: dict) -> tuple[int, int]:
    """(parameters, modules) computed from cfg alone: refused before building when too big."""
    widths = [cfg["in_features"]] + [cfg["hidden"]] * (cfg["depth"] - 1) + [cfg["num_classes"]]
    hidden_layers = cfg["depth"] - 1
    params = widths[0] * widths[1] + widths[1]  # the first Linear
    if hidden_layers:
        h = cfg["hidden"]
        params += (hidden_layers - 1) * (h * h + h) + h * cfg["num_classes"] + cfg["num_classes"]
    return params, 1 + 2 * hidden_layers + 1


PRESET = Preset(
    **entry("mlp"),
    choices={"activation": tuple(_ACT)},
    build=build,
    make_batch=make_batch,
    loss_fn=batches.cross_entropy_last_dim,
    size=size,
)
