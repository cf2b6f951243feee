"""Read a YAML spec: parse with line numbers, validate the schema, resolve the layers.

Problems are collected, never raised one at a time: the user fixes the whole spec in one go.
Nothing in a YAML spec is executed; layers come from an allow-list of torch.nn classes.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import yaml

from .. import safeyaml
from ..errors import MAX_PROBLEM_CHARS, MAX_PROBLEMS, clip_problems  # noqa: F401 (re-exported)
from . import layers as layer_lib

if TYPE_CHECKING:  # pydantic is imported only to validate a YAML spec: presets load without it
    from pydantic import ValidationError

    from .schema import Spec

MAX_SPEC_BYTES = safeyaml.MAX_BYTES  # a layer stack is a few KiB; more is not a spec
MAX_EXPANDED_NODES = safeyaml.MAX_NODES  # nodes after expanding aliases: a billion-laughs file is refused


def short(value: Any, limit: int = 120) -> str:
    """repr() of a value from the spec, cut to `limit` characters for an error message."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text):,} characters)"


def cap_problems(problems: list[str]) -> list[str]:
    """At most MAX_PROBLEMS lines of at most MAX_PROBLEM_CHARS each (`errors.clip_problems`)."""
    return clip_problems(problems)


def _line_map(root: yaml.Node | None) -> dict[tuple, int]:
    """(key, index, ...) path -> 1-based line of that node in the YAML text."""
    lines: dict[tuple, int] = {}

    def walk(node, path):
        if node is None:
            return
        lines[path] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                k = key.value if isinstance(key, yaml.ScalarNode) else str(key)
                lines[path + (k,)] = key.start_mark.line + 1
                walk(value, path + (k,))
                lines[path + (k,)] = key.start_mark.line + 1
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, path + (i,))

    walk(root, ())
    return lines


def _where(path: tuple, lines: dict[tuple, int]) -> str:
    """'line 7: input.shape[1]' from a path, using the deepest part of it the YAML has."""
    dotted = ""
    for part in path:
        dotted += f"[{part}]" if isinstance(part, int) else (f".{part}" if dotted else str(part))
    for cut in range(len(path), -1, -1):
        if path[:cut] in lines:
            line = lines[path[:cut]]
            return f"line {line}: {dotted}" if dotted else f"line {line}"
    return dotted or "spec"


def parse_yaml(text: str) -> tuple[Any, dict[tuple, int]]:
    """Raw data and line map, read by the bounded loader (`safeyaml`: size, depth and alias
    expansion refused before any value is built); SpecError, with the line, on malformed YAML."""
    from ..errors import SpecError

    root = safeyaml.compose(text, "the spec", error=SpecError)
    try:
        data = safeyaml.construct(root)
    except yaml.YAMLError as exc:
        raise SpecError(f"the spec is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise SpecError("the spec must be a YAML mapping with at least `model:` "
                        f"(got {type(data).__name__ if data is not None else 'an empty document'})")
    return data, _line_map(root)


def _pydantic_problems(err: ValidationError, lines: dict[tuple, int]) -> list[str]:
    problems = []
    for e in err.errors():
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and p in ("function-before", "function-after")))
        msg = e["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        if e["type"] == "extra_forbidden":
            msg = f"unknown key {loc[-1]!r}"
        elif e["type"] == "literal_error":
            msg = f"{msg}, got {short(e.get('input'))}"
        problems.append(f"{_where(loc, lines)}: {msg}")
    return problems


def validate_schema(data: dict, lines: dict[tuple, int]) -> tuple[Spec | None, list[str]]:
    from pydantic import ValidationError

    from .schema import Spec

    try:
        return Spec.model_validate(data), []
    except ValidationError as err:
        return None, _pydantic_problems(err, lines)


def resolve_layers(entries: list, lines: dict[tuple, int]) -> tuple[list[tuple[str, tuple, dict]], list[str]]:
    """Each entry (`ReLU`, `{Linear: [4, 8]}`, `{Linear: {in_features: 4, ...}}`) -> (class, args, kwargs)."""
    resolved, problems = [], []
    for i, entry in enumerate(entries):
        where = _where(("model", "layers", i), lines)
        if isinstance(entry, str):
            name, raw = entry.strip(), None
        elif isinstance(entry, dict) and len(entry) == 1:
            name, raw = next(iter(entry.items()))
            name = str(name).strip()
        else:
            problems.append(f"{where}: a layer is a name (`- ReLU`) or one `Name: arguments` pair, got {short(entry)}")
            continue
        cls, why = layer_lib.layer_class(name)
        if cls is None:
            problems.append(f"{where}: {why}")
            continue
        if raw is None:
            args, kwargs = [], {}
        elif isinstance(raw, list):
            args, kwargs = raw, {}
        elif isinstance(raw, dict):
            args, kwargs = [], {str(k): v for k, v in raw.items()}
        else:
            args, kwargs = [raw], {}
        args, kwargs, problem = layer_lib.bind_arguments(cls, args, kwargs)
        if problem:
            problems.append(f"{where} ({name}): {problem}")
            continue
        resolved.append((name, args, kwargs))
    return resolved, problems


def layer_line(index: int, lines: dict[tuple, int]) -> str:
    return _where(("model", "layers", index), lines)
