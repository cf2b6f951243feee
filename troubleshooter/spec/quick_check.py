"""Refuse a bad spec before a job is queued, in the app's server, without building anything.

A preset is checked without torch (its parameters and its size computed from them), so a server
that only ever checks presets never imports it; a YAML spec's layer checks need torch's layer
classes and go through the loader.
"""
from __future__ import annotations

import math
import re
from typing import Any

from ..errors import SpecError
from .limits import Limits, check_size
from .optim import OptimizerConfig
from .presets import get_shape, parse_preset_string, resolve_params
from .source import SpecSource


def problem_error(label: str, problems: list[str]) -> SpecError:
    """One error listing every problem, in the order of the spec's lines (the checks find them
    in another order); problems without a line come last, as found."""
    ordered = sorted(problems, key=_line_of)
    return SpecError(f"{label}: {len(problems)} problem{'s' if len(problems) > 1 else ''} in the spec", ordered)


def _line_of(problem: str) -> float:
    match = re.match(r"line (\d+):", problem)
    return int(match.group(1)) if match else math.inf


def check_preset(name: str, overrides: dict[str, Any], limits: Limits, *, label: str,
                 optimizer: OptimizerConfig | None = None, problems: list[str] | None = None):
    """(resolved parameters, problems so far); raises SpecError with every problem found
    (`problems`: those a YAML spec naming this preset already had) or when the preset is too big
    by its size computed from its parameters alone."""
    try:
        preset = get_shape(name)
    except SpecError as exc:
        if not problems:
            raise
        raise problem_error(label, [*problems, str(exc)]) from None
    cfg, param_problems = resolve_params(preset, overrides)
    problems = list(problems or []) + param_problems
    if param_problems:
        raise problem_error(label, problems)
    optimizer = optimizer or OptimizerConfig()
    if preset.size is not None:  # its size from cfg alone: a monster is refused before it is built
        too_big = check_size(*preset.size(cfg), optimizer.state_floats_per_param(), limits)
        if too_big:
            raise problem_error(label, problems + too_big)
    return cfg, problems


def precheck(source: SpecSource, *, max_params: float | None = None, max_memory_gb: float | None = None) -> None:
    """Refuse (SpecError) what can be found wrong without building anything: malformed or hostile
    YAML, schema and preset-parameter mistakes, unknown layers, a missing weights file, and a preset
    too big by its computed size. Cheap; the app asks it in the server process, before a job is
    queued, and builds the model only in the job (under its time limit). A Python file is never
    looked at here."""
    limits = Limits.resolve(max_params, max_memory_gb)
    if source.kind == "preset":
        name, overrides = parse_preset_string(source.value)
        check_preset(name, overrides, limits, label=source.describe())
    elif source.kind == "yaml":
        from .loader import _load_yaml

        _load_yaml(source, limits, only_check=True)
