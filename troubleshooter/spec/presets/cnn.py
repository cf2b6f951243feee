"""`cnn`: a small ResNet-style image classifier (conv + BatchNorm + residual blocks)."""
from __future__ import annotations

import torch
from torch import nn

from .. import batches
from . import Preset
from .catalogue import entry
from .shapes import checks


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


PRESET = Preset(
    **entry("cnn"),
    **checks("cnn"),
    build=build,
    make_batch=make_batch,
    loss_fn=batches.cross_entropy_last_dim,
)
