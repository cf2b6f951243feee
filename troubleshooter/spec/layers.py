"""The torch.nn classes a YAML `layers:` stack may name, and how an entry becomes a module.

An allow-list (not `getattr(torch.nn, name)`) keeps a spec from reaching anything but plain,
sequential-friendly layers; arguments are bound against the class's own signature first so a
wrong argument is reported with the layer it belongs to, before anything is built.
"""
from __future__ import annotations

import difflib
import inspect
from typing import Any

from torch import nn

ALLOWED_LAYERS: tuple[str, ...] = (
    # linear and embedding
    "Linear", "Identity", "Embedding",
    # convolution and pooling
    "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d",
    "MaxPool1d", "MaxPool2d", "MaxPool3d", "AvgPool1d", "AvgPool2d", "AvgPool3d",
    "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveAvgPool3d", "AdaptiveMaxPool1d", "AdaptiveMaxPool2d",
    "Upsample", "PixelShuffle", "ZeroPad2d", "ConstantPad1d", "ConstantPad2d",
    # normalisation
    "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "LayerNorm", "GroupNorm", "RMSNorm",
    "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d", "LocalResponseNorm",
    # activations
    "ReLU", "ReLU6", "LeakyReLU", "PReLU", "ELU", "SELU", "CELU", "GELU", "SiLU", "Mish", "Tanh",
    "Sigmoid", "Hardtanh", "Hardswish", "Hardsigmoid", "Softplus", "Softsign", "Tanhshrink",
    "Threshold", "Softmax", "LogSoftmax", "GLU",
    # regularisation and reshaping
    "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "Flatten", "Unflatten",
)

# Names a user may reasonably try that cannot live in an nn.Sequential of single-input layers.
_NOT_SEQUENTIAL = {
    "MultiheadAttention": "it takes query, key and value and returns a tuple",
    "Transformer": "it takes a source and a target sequence",
    "TransformerEncoderLayer": "use the `bert` or `gpt` preset for transformer models",
    "TransformerDecoderLayer": "it takes a target and a memory sequence",
    "TransformerEncoder": "use the `bert` or `gpt` preset for transformer models",
    "LSTM": "it returns a tuple (output, (h, c))",
    "GRU": "it returns a tuple (output, h)",
    "RNN": "it returns a tuple (output, h)",
    "EmbeddingBag": "it needs offsets beside the indices",
    "Bilinear": "it takes two inputs",
}

# Keyword arguments that would bypass the engine's own device and dtype handling.
_FORBIDDEN_KWARGS = ("device", "dtype")

_LOWER = {n.lower(): n for n in ALLOWED_LAYERS}


def did_you_mean(name: str) -> str:
    if name.lower() in _LOWER:
        return f" (did you mean {_LOWER[name.lower()]!r}? names are case-sensitive)"
    close = difflib.get_close_matches(name, ALLOWED_LAYERS, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def layer_class(name: str) -> tuple[type | None, str | None]:
    """The allowed nn class for `name`, or (None, why not)."""
    if name in ALLOWED_LAYERS and hasattr(nn, name):
        return getattr(nn, name), None
    if name in _NOT_SEQUENTIAL:
        return None, (f"layer {name!r} cannot be used in a layers stack ({_NOT_SEQUENTIAL[name]}); "
                      "use a preset or a Python file for such models")
    return None, f"unknown layer {name!r}{did_you_mean(name)}"


def _plain(value: Any) -> Any:
    """YAML lists become tuples (kernel_size: [3, 3]), as torch's signatures expect."""
    if isinstance(value, list):
        return tuple(_plain(v) for v in value)
    return value


def bind_arguments(cls: type, args: list, kwargs: dict) -> tuple[tuple, dict, str | None]:
    """Check the arguments against `cls.__init__`'s signature; (args, kwargs, problem or None)."""
    for key in _FORBIDDEN_KWARGS:
        if key in kwargs:
            return (), {}, f"argument {key!r} is not allowed (the engine places and casts the model itself)"
    args = tuple(_plain(a) for a in args)
    kwargs = {k: _plain(v) for k, v in kwargs.items()}
    sig = inspect.signature(cls.__init__)
    params = [p for p in sig.parameters if p not in ("self", "args", "kwargs", *_FORBIDDEN_KWARGS)]
    hint = f"; {cls.__name__} takes ({', '.join(params)})"
    unknown = [k for k in kwargs if k not in sig.parameters]
    if unknown:
        words = []
        for k in unknown:
            close = difflib.get_close_matches(k, params, n=1, cutoff=0.6)
            words.append(f"{k!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        return (), {}, f"unknown argument {', '.join(words)} for {cls.__name__}{hint}"
    try:
        bound = sig.bind(None, *args, **kwargs)
    except TypeError as exc:
        return (), {}, f"wrong arguments for {cls.__name__}: {exc}{hint}"
    if any(k in bound.arguments for k in _FORBIDDEN_KWARGS):
        return (), {}, f"wrong arguments for {cls.__name__}: too many positional arguments{hint}"
    for name, value in bound.arguments.items():
        default = sig.parameters[name].default
        # true/false where torch expects a size: Python would take it as 1/0 (Linear(4, true))
        if _has_bool(value) and not isinstance(default, bool) and default is not None:
            return (), {}, f"{name} of {cls.__name__} is a size, not true/false (got {value!r}){hint}"
        if _has_bool(value) and default is inspect.Parameter.empty:
            return (), {}, f"{name} of {cls.__name__} is a size, not true/false (got {value!r}){hint}"
    return args, kwargs, None


def _has_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return True
    return isinstance(value, tuple) and any(isinstance(v, bool) for v in value)
