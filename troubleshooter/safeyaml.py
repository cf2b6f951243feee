"""The one way this tool reads YAML from a user: bounded before anything is built from it.

A few hundred bytes of YAML can expand through aliases (`&a [*b, *b, ...]`, "billion laughs")
into gigabytes, or nest deep enough to exhaust the recursion of whatever walks the data next
(validation, `repr` in an error message). So the size is checked before parsing, the document is
composed with a depth limit, its alias-expanded size and depth are computed without expanding
anything, and only then are Python objects built (with PyYAML's safe constructor: no tags that
run code). Every refusal is one short sentence.
"""
from __future__ import annotations

from typing import Any

import yaml

from .errors import UserError

MAX_BYTES = 256 * 1024  # a model spec or an answers file is a few KiB
MAX_NODES = 20_000  # values after expanding aliases
MAX_DEPTH = 64  # nesting, aliases expanded; real specs nest 4 or 5 levels


class _Refused(Exception):
    """Raised inside the composer; becomes the caller's error class with the same sentence."""


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader whose composer stops at `max_depth` levels of nesting (the pure-Python composer
    recurses once per level, so an unbounded document would raise RecursionError, or worse)."""

    max_depth = MAX_DEPTH

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > self.max_depth:
                raise _Refused(f"nests more than {self.max_depth} levels deep")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _expanded(root: yaml.Node, max_nodes: int) -> tuple[int, int] | None:
    """(values, depth) of the document with every alias expanded, computed without expanding:
    an alias is the same node object again, so each node is measured once. None for a cycle
    (`&a [*a]`). Counting stops soon after `max_nodes`."""
    memo: dict[int, tuple[int, int]] = {}
    in_progress: set[int] = set()

    def measure(node) -> tuple[int, int] | None:
        key = id(node)
        if key in memo:
            return memo[key]
        if key in in_progress:
            return None
        in_progress.add(key)
        if isinstance(node, yaml.MappingNode):
            children = [c for pair in node.value for c in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        else:
            children = []
        total, depth = 1, 0
        for child in children:
            sub = measure(child)
            if sub is None:
                return None
            total += sub[0]
            depth = max(depth, sub[1])
            if total > max_nodes:
                break
        in_progress.discard(key)
        memo[key] = (total, depth + 1)
        return memo[key]

    return measure(root)


def _syntax_error(exc: yaml.YAMLError, what: str) -> str:
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"{what} is not valid YAML{where}: {problem}"


def compose(text: str | bytes, what: str = "the YAML", *, error: type[UserError] = UserError,
            max_bytes: int = MAX_BYTES, max_nodes: int = MAX_NODES, max_depth: int = MAX_DEPTH) -> yaml.Node | None:
    """The document's node tree, refused (as `error`) when it is too big, too deep, expands too
    far through aliases, refers to itself, or is not YAML. None for an empty document."""
    if isinstance(text, bytes):
        if len(text) > max_bytes:
            raise error(_too_big(len(text), what, max_bytes))
        try:
            text = text.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise error(f"{what} is not UTF-8 text (byte {exc.start})") from None
    if len(text) > max_bytes or len(text.encode("utf-8", "surrogatepass")) > max_bytes:
        raise error(_too_big(len(text.encode("utf-8", "surrogatepass")), what, max_bytes))
    loader = _BoundedLoader(text)
    loader.max_depth = max_depth
    try:
        root = loader.get_single_node()
    except _Refused as exc:
        raise error(f"{what} {exc}: refused") from None
    except yaml.YAMLError as exc:
        raise error(_syntax_error(exc, what)) from None
    except RecursionError:
        raise error(f"{what} nests too deeply: refused") from None
    finally:
        loader.dispose()
    if root is None:
        return None
    size = _expanded(root, max_nodes)
    if size is None:
        raise error(f"{what} refers to itself through a YAML alias (&anchor ... *anchor inside it): "
                    "write the values out")
    if size[0] > max_nodes:
        raise error(f"{what} expands to more than {max_nodes:,} values through YAML aliases "
                    "(&anchor / *anchor): refused; write the values out or use fewer aliases")
    if size[1] > max_depth:
        raise error(f"{what} nests more than {max_depth} levels deep once its aliases are expanded: refused")
    return root


def construct(root: yaml.Node | None) -> Any:
    """Python values of a node tree from `compose` (safe types only)."""
    if root is None:
        return None
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_document(root)
    finally:
        loader.dispose()


def load(text: str | bytes, what: str = "the YAML", *, error: type[UserError] = UserError, **limits: int) -> Any:
    """`yaml.safe_load`, bounded: see `compose` for what is refused and `construct` for the values."""
    root = compose(text, what, error=error, **limits)
    try:
        return construct(root)
    except yaml.YAMLError as exc:  # e.g. an unhashable key, a bad timestamp
        raise error(_syntax_error(exc, what)) from None


def _too_big(size: int, what: str, limit: int) -> str:
    return f"{what} is {size:,} bytes, over the limit of {limit:,}: refused before reading it"
