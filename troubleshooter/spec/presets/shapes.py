"""What each preset's parameters allow and how big the model gets, computed from its parameters
alone, without torch: the app's server checks a preset here before a job is queued (and never
imports torch); the preset modules build their `Preset` from the same functions."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from .catalogue import CATALOGUE

ACTIVATIONS = ("relu", "gelu", "silu", "tanh")  # mlp's `activation` choices (mlp.py maps them to modules)


BLOCK_MODULES = 11  # Block, ln1, attn, qkv, proj, ln2, mlp, fc, act, proj, drop


def block_params(d: int) -> int:
    """Parameters of one Block of width d: qkv 3d²+3d, proj d²+d, fc 4d²+4d, proj 4d²+d, two LayerNorms 4d."""
    return 12 * d * d + 13 * d


def check_heads(cfg: dict) -> list[str]:
    if cfg["d_model"] % cfg["n_head"]:
        return [f"d_model {cfg['d_model']} is not divisible by n_head {cfg['n_head']}"]
    return []


def mlp_size(cfg: dict) -> tuple[int, int]:
    """(parameters, modules) computed from cfg alone: refused before building when too big."""
    widths = [cfg["in_features"]] + [cfg["hidden"]] * (cfg["depth"] - 1) + [cfg["num_classes"]]
    hidden_layers = cfg["depth"] - 1
    params = widths[0] * widths[1] + widths[1]  # the first Linear
    if hidden_layers:
        h = cfg["hidden"]
        params += (hidden_layers - 1) * (h * h + h) + h * cfg["num_classes"] + cfg["num_classes"]
    return params, 1 + 2 * hidden_layers + 1


def cnn_validate(cfg: dict) -> list[str]:
    smallest = cfg["image_size"] // 2 ** (cfg["stages"] - 1)
    if smallest < 1:
        return [f"image_size {cfg['image_size']} is too small for {cfg['stages']} stages "
                f"(each stage after the first halves it)"]
    return []


def _cnn_block(c_in: int, c_out: int, stride: int) -> tuple[int, int]:
    """(parameters, modules) of one BasicBlock."""
    params, modules = 9 * c_in * c_out + 9 * c_out * c_out + 4 * c_out, 7  # block, conv1, bn1, relu1, conv2, bn2, relu2
    if stride != 1 or c_in != c_out:
        return params + c_in * c_out + 2 * c_out, modules + 3  # shortcut Sequential(conv, bn)
    return params, modules + 1  # shortcut Identity


def cnn_size(cfg: dict) -> tuple[int, int]:
    """(parameters, modules) computed from cfg alone (per stage, not per block: blocks_per_stage
    may be huge): refused before building when too big."""
    width, blocks = cfg["width"], cfg["blocks_per_stage"]
    params, modules = 9 * cfg["in_channels"] * width + 2 * width, 1 + 4  # the ResNet, stem Sequential(conv, bn, relu)
    c_in = width
    for s in range(cfg["stages"]):
        c_out = width * 2 ** s
        first = _cnn_block(c_in, c_out, 2 if s > 0 else 1)
        rest = _cnn_block(c_out, c_out, 1)
        params += first[0] + (blocks - 1) * rest[0]
        modules += 1 + first[1] + (blocks - 1) * rest[1]
        c_in = c_out
    params += c_in * cfg["num_classes"] + cfg["num_classes"]
    return params, modules + 1 + 3  # stages Sequential, pool, flatten, fc


def gpt_size(cfg: dict) -> tuple[int, int]:
    """(parameters, modules) computed from cfg alone: refused before building when too big."""
    d, layers = cfg["d_model"], cfg["n_layer"]
    params = (cfg["vocab_size"] + cfg["seq_len"]) * d + layers * block_params(d) + 2 * d  # lm_head is tied
    return params, 7 + layers * BLOCK_MODULES


def validate_vit(cfg: dict) -> list[str]:
    problems = check_heads(cfg)
    if cfg["image_size"] % cfg["patch_size"]:
        problems.append(f"image_size {cfg['image_size']} is not divisible by patch_size {cfg['patch_size']}")
    return problems


def bert_size(cfg: dict) -> tuple[int, int]:
    """(parameters, modules) computed from cfg alone: refused before building when too big."""
    d, layers, classes = cfg["d_model"], cfg["n_layer"], cfg["num_classes"]
    params = (cfg["vocab_size"] + cfg["seq_len"]) * d + layers * block_params(d) + 2 * d + d * classes + classes
    return params, 6 + layers * BLOCK_MODULES


def vit_size(cfg: dict) -> tuple[int, int]:
    d, layers, classes, p = cfg["d_model"], cfg["n_layer"], cfg["num_classes"], cfg["patch_size"]
    patches = (cfg["image_size"] // p) ** 2
    params = (cfg["in_channels"] * p * p * d + d + d + (patches + 1) * d + layers * block_params(d)
              + 2 * d + d * classes + classes)
    return params, 5 + layers * BLOCK_MODULES


@dataclass(frozen=True)
class Shape:
    """A preset's checkable side: what `resolve_params` and the size check read."""
    name: str
    description: str
    params: dict[str, Any]
    choices: dict[str, tuple] = field(default_factory=dict)
    validate: Callable[[dict], list[str]] = lambda cfg: []
    size: Callable[[dict], tuple[int, int]] | None = None


_SHAPES = {
    "mlp": dict(choices={"activation": ACTIVATIONS}, size=mlp_size),
    "cnn": dict(validate=cnn_validate, size=cnn_size),
    "gpt": dict(validate=check_heads, size=gpt_size),
    "bert": dict(validate=check_heads, size=bert_size),
    "vit": dict(validate=validate_vit, size=vit_size),
}


def checks(name: str) -> dict[str, Any]:
    """`Preset(**entry(name), **checks(name), build=...)`: its choices, checks and size formula,
    the ones `shape(name)` gives the server, so the two cannot drift apart."""
    return dict(_SHAPES[name])


def shape(name: str) -> Shape:
    """The checkable side of preset `name` (a KeyError for an unknown one: the caller names it)."""
    description, params = CATALOGUE[name]
    return Shape(name, description, dict(params), **checks(name))
