"""Read a YAML spec: parse with line numbers, validate the schema, resolve the layers.

Problems are collected, never raised one at a time: the user fixes the whole spec in one go.
Nothing in a YAML spec is executed; layers come from an allow-list of torch.nn classes.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import yaml

from . import layers as layer_lib

if TYPE_CHECKING:  # pydantic is imported only to validate a YAML spec: presets load without it
    from pydantic import ValidationError

    from .schema import Spec

MAX_SPEC_BYTES = 256 * 1024  # a layer stack is a few KiB; more is not a spec
MAX_EXPANDED_NODES = 20_000  # nodes after expanding aliases: a billion-laughs file is refused here
MAX_PROBLEM_CHARS = 400  # one problem line in an error message
MAX_PROBLEMS = 40


def _expanded_size(root: yaml.Node) -> int | None:
    """Node count with every alias expanded, computed without expanding anything (an alias is the
    same node object twice); None for a cycle (`&a [*a]`). Stops counting past the limit."""
    sizes: dict[int, int] = {}
    in_progress: set[int] = set()

    def size(node) -> int | None:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in in_progress:
            return None
        in_progress.add(key)
        total = 1
        children = []
        if isinstance(node, yaml.MappingNode):
            children = [c for pair in node.value for c in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        for child in children:
            n = size(child)
            if n is None:
                return None
            total += n
            if total > MAX_EXPANDED_NODES:
                break
        in_progress.discard(key)
        sizes[key] = total
        return total

    return size(root)


def _refuse_hostile(text: str) -> None:
    """Refuse, in milliseconds, what would make parsing, validation or the error message huge."""
    from ..errors import SpecError

    if len(text) > MAX_SPEC_BYTES:
        raise SpecError(f"the spec is {len(text):,} characters, over the limit of {MAX_SPEC_BYTES:,}: "
                        "a model spec is a short YAML file")
    if "&" not in text and "*" not in text:
        return
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return  # parse_yaml reports the syntax error with its line
    except RecursionError:
        raise SpecError("the spec nests too deeply to be a model spec") from None
    if root is None:
        return
    n = _expanded_size(root)
    if n is None:
        raise SpecError("the spec refers to itself through a YAML alias (&anchor ... *anchor inside it): "
                        "write the values out")
    if n > MAX_EXPANDED_NODES:
        raise SpecError(f"the spec expands to more than {MAX_EXPANDED_NODES:,} values through YAML aliases "
                        "(&anchor / *anchor): refused; write the values out or use fewer aliases")


def short(value: Any, limit: int = 120) -> str:
    """repr() of a value from the spec, cut to `limit` characters for an error message."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text):,} characters)"


def cap_problems(problems: list[str]) -> list[str]:
    """At most MAX_PROBLEMS lines of at most MAX_PROBLEM_CHARS each: a hostile spec cannot make
    the error message itself the attack."""
    out = [p if len(p) <= MAX_PROBLEM_CHARS else p[:MAX_PROBLEM_CHARS] + "... (cut)" for p in problems[:MAX_PROBLEMS]]
    if len(problems) > MAX_PROBLEMS:
        out.append(f"... and {len(problems) - MAX_PROBLEMS} more problems")
    return out


def _line_map(text: str) -> dict[tuple, int]:
    """(key, index, ...) path -> 1-based line of that node in the YAML text."""
    lines: dict[tuple, int] = {}
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return lines

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
    """Raw data and line map; raises SpecError (with the line) on malformed YAML."""
    from ..errors import SpecError

    _refuse_hostile(text)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError(f"the spec is not valid YAML{where}: {problem}") from None
    if not isinstance(data, dict):
        raise SpecError("the spec must be a YAML mapping with at least `model:` "
                        f"(got {type(data).__name__ if data is not None else 'an empty document'})")
    return data, _line_map(text)


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
