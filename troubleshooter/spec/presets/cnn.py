"""`cnn`: a small ResNet-style image classifier (conv + BatchNorm + residual blocks)."""
from __future__ import annotations

import torch
from torch import nn

from .. import batches
from . import Preset
from .catalogue import entry


class BasicBlock(nn.Module):
    """ResNet basic block: two 3x3 convs with BatchNorm and a (projected) shortcut."""

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(c_out))
        self.relu2 = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn2(self.conv2(self.relu1(self.bn1(self.conv1(x)))))
        return self.relu2(out + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        width = cfg["width"]
        self.stem = nn.Sequential(nn.Conv2d(cfg["in_channels"], width, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(width), nn.ReLU())
        stages = []
        c_in = width
        for s in range(cfg["stages"]):
            c_out = width * 2 ** s
            blocks = [BasicBlock(c_in if b == 0 else c_out, c_out, 2 if (b == 0 and s > 0) else 1)
                      for b in range(cfg["blocks_per_stage"])]
            stages.append(nn.Sequential(*blocks))
            c_in = c_out
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(c_in, cfg["num_classes"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.flatten(self.pool(self.stages(self.stem(x)))))


def build(cfg: dict) -> nn.Module:
    return ResNet(cfg)


def make_batch(cfg: dict, batch_size: int, device, gen):
    shape = (batch_size, cfg["in_channels"], cfg["image_size"], cfg["image_size"])
    x = batches.float_input(shape, device, gen)
    y = batches.int_input((batch_size,), cfg["num_classes"], device, gen)
    return (x,), y


def validate(cfg: dict) -> list[str]:
    smallest = cfg["image_size"] // 2 ** (cfg["stages"] - 1)
    if smallest < 1:
        return [f"image_size {cfg['image_size']} is too small for {cfg['stages']} stages "
                f"(each stage after the first halves it)"]
    return []


def _block(c_in: int, c_out: int, stride: int) -> tuple[int, int]:
    """(parameters, modules) of one BasicBlock."""
    params, modules = 9 * c_in * c_out + 9 * c_out * c_out + 4 * c_out, 7  # block, conv1, bn1, relu1, conv2, bn2, relu2
    if stride != 1 or c_in != c_out:
        return params + c_in * c_out + 2 * c_out, modules + 3  # shortcut Sequential(conv, bn)
    return params, modules + 1  # shortcut Identity


def size(cfg: dict) -> tuple[int, int]:
    """(parameters, modules) computed from cfg alone (per stage, not per block: blocks_per_stage
    may be huge): refused before building when too big."""
    width, blocks = cfg["width"], cfg["blocks_per_stage"]
    params, modules = 9 * cfg["in_channels"] * width + 2 * width, 1 + 4  # the ResNet, stem Sequential(conv, bn, relu)
    c_in = width
    for s in range(cfg["stages"]):
        c_out = width * 2 ** s
        first = _block(c_in, c_out, 2 if s > 0 else 1)
        rest = _block(c_out, c_out, 1)
        params += first[0] + (blocks - 1) * rest[0]
        modules += 1 + first[1] + (blocks - 1) * rest[1]
        c_in = c_out
    params += c_in * cfg["num_classes"] + cfg["num_classes"]
    return params, modules + 1 + 3  # stages Sequential, pool, flatten, fc


PRESET = Preset(
    **entry("cnn"),
    build=build,
    make_batch=make_batch,
    loss_fn=batches.cross_entropy_last_dim,
    validate=validate,
    size=size,
)
