"""Built-in model presets, written in plain torch (nothing is downloaded).

A preset is a named family of models with typed parameters and defaults; `gpt:d_model=768,n_layer=12`
picks one member. Each preset module defines `PRESET`; parameters are checked against the defaults'
types so a typo or a wrong value is a `SpecError`, never a surprise deep in a run.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Callable

from ...errors import SpecError
from .catalogue import CATALOGUE


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    params: dict[str, Any]  # parameter -> default (its type is the parameter's type)
    build: Callable[[dict], Any]  # module-level (cfg) -> nn.Module, so partials pickle
    make_batch: Callable  # (cfg, batch_size, device, generator) -> Batch
    loss_fn: Callable  # (output, target) -> loss
    validate: Callable[[dict], list[str]] = lambda cfg: []
    seq_len: Callable[[dict], int | None] = lambda cfg: None
    flops_per_step: Callable[[dict, int], float] | None = None  # (cfg, n_params) -> fwd+bwd FLOPs
    choices: dict[str, tuple] = field(default_factory=dict)  # allowed values of str parameters
    size: Callable[[dict], tuple[int, int]] | None = None  # cfg -> (parameters, modules), without building


# The names, without importing torch (for --help); test_spec_presets checks they match the registry.
PRESET_NAMES = tuple(CATALOGUE)


def _registry() -> dict[str, Preset]:
    from . import cnn, encoder, gpt, mlp

    presets = [mlp.PRESET, cnn.PRESET, gpt.PRESET, encoder.BERT, encoder.VIT]
    return {p.name: p for p in presets}


def _known(name: str) -> str:
    key = name.strip().lower()
    if key not in CATALOGUE:
        raise SpecError(f"unknown preset {name!r}{_did_you_mean(key, CATALOGUE)}; presets: {', '.join(CATALOGUE)}")
    return key


def get_preset(name: str) -> Preset:
    return _registry()[_known(name)]


def get_shape(name: str):
    """The preset's parameters, choices, checks and size formula, without torch (`shapes.Shape`)."""
    from .shapes import shape

    return shape(_known(name))


def list_presets() -> dict[str, dict[str, Any]]:
    """{preset name: {parameter: default}}; see `preset_descriptions()` for the one-liners. Read from
    the catalogue: no torch imported (the page's preset list)."""
    return {name: dict(params) for name, (_, params) in CATALOGUE.items()}


def preset_descriptions() -> dict[str, str]:
    return {name: description for name, (description, _) in CATALOGUE.items()}


def _did_you_mean(word: str, options) -> str:
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def parse_preset_string(text: str) -> tuple[str, dict[str, str]]:
    """'gpt:d_model=768,n_layer=12' -> ('gpt', {'d_model': '768', 'n_layer': '12'})."""
    name, _, rest = text.strip().partition(":")
    overrides: dict[str, str] = {}
    problems = []
    for part in rest.split(","):
        if not part.strip():
            continue
        key, eq, value = part.partition("=")
        if not eq or not key.strip():
            problems.append(f"{part.strip()!r} is not key=value")
            continue
        overrides[key.strip()] = value.strip()
    if not name.strip():
        problems.append("no preset name before ':'")
    if problems:
        raise SpecError(f"cannot read preset {text!r} (use NAME:key=value,...)", problems)
    return name.strip().lower(), overrides


_TRUE = {"true", "yes", "1", "on"}
_FALSE = {"false", "no", "0", "off"}


def _coerce(preset: Preset, key: str, value: Any) -> tuple[Any, str | None]:
    default = preset.params[key]
    where = f"{preset.name}: {key}"
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value, None
        if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
            return value.lower() in _TRUE, None
        return None, f"{where} must be true or false, got {value!r}"
    if isinstance(default, int):
        if isinstance(value, int) and not isinstance(value, bool):
            return value, None
        if isinstance(value, float) and value.is_integer():
            return int(value), None
        if isinstance(value, str):
            try:
                return int(value.replace("_", "")), None
            except ValueError:
                pass
        return None, f"{where} must be an integer, got {value!r}"
    if isinstance(default, float):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value), None
        if isinstance(value, str):
            try:
                return float(value), None
            except ValueError:
                pass
        return None, f"{where} must be a number, got {value!r}"
    if not isinstance(value, str):
        return None, f"{where} must be text, got {value!r}"
    allowed = preset.choices.get(key)
    if allowed and value not in allowed:
        return None, f"{where} must be one of {', '.join(allowed)}, got {value!r}"
    return value, None


def resolve_params(preset: Preset, overrides: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Defaults overlaid with typed overrides, and every problem found (unknown key, bad type/value)."""
    cfg = dict(preset.params)
    problems: list[str] = []
    for key, value in overrides.items():
        if key not in preset.params:
            problems.append(f"{preset.name}: unknown parameter {key!r}{_did_you_mean(key, preset.params)}; "
                            f"parameters: {', '.join(preset.params)}")
            continue
        coerced, problem = _coerce(preset, key, value)
        if problem:
            problems.append(problem)
        else:
            cfg[key] = coerced
    if not problems:
        for key, value in cfg.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value <= 0 \
                    and key not in ("dropout",):
                problems.append(f"{preset.name}: {key} must be positive, got {value}")
            if key == "dropout" and not 0 <= value < 1:
                problems.append(f"{preset.name}: dropout must be in [0, 1), got {value}")
        if not problems:
            problems += [f"{preset.name}: {p}" for p in preset.validate(cfg)]
    return cfg, problems
