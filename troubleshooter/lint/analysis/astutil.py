"""Small AST helpers every part of the analysis uses: fast walk, names, keyword arguments."""
from __future__ import annotations

import ast
import re
from typing import Callable

from .vocab import ZEROING


# Fields that only hold shared marker singletons (Load/Store, Add, Eq, Not, ...): a third of a tree's
# nodes, never looked for by walking (rules read `n.ctx` / `n.op` directly), so walks skip them.
_MARKER_FIELDS = frozenset({"ctx", "op", "ops"})
_FIELDS: dict[type, tuple[str, ...]] = {}


def _fields(cls: type) -> tuple[str, ...]:
    f = _FIELDS.get(cls)
    if f is None:
        f = _FIELDS[cls] = tuple(name for name in cls._fields if name not in _MARKER_FIELDS)
    return f


def walk(node: ast.AST) -> list[ast.AST]:
    """All nodes under `node` (itself first) but the Load/Store/operator markers, as a list: ~2x faster
    than `ast.walk`'s generator."""
    out = [node]
    i = 0
    AST = ast.AST
    fields = _FIELDS
    while i < len(out):
        n = out[i]
        i += 1
        names = fields.get(n.__class__) or _fields(n.__class__)
        for name in names:
            v = getattr(n, name, None)
            if v.__class__ is list:
                for x in v:
                    if isinstance(x, AST):
                        out.append(x)
            elif isinstance(v, AST):
                out.append(v)
    return out


# ASDL types of fields that never hold a child node worth walking: names, strings, constants, numbers
# and the marker singletons.
_LEAF_TYPES = frozenset({"identifier", "string", "constant", "int",
                         "expr_context", "boolop", "operator", "unaryop", "cmpop"})
# The two list fields the parser fills with None as well as nodes (`{**d}`'s key, a kw-only arg without default).
_LISTS_WITH_NONE = frozenset({("Dict", "keys"), ("arguments", "kw_defaults")})
_SIGNATURE = re.compile(r"(\w+)\((.*)\)")
_FIELD_SPEC = re.compile(r"(\w+)([*?]?) (\w+)")
_KIDS: dict[type, Callable[[ast.AST], list[ast.AST]] | None] = {}


def _kids_getter(cls: type) -> Callable[[ast.AST], list[ast.AST]] | None:
    """A function returning a parsed node's children in field order (what `walk` appends), compiled once
    per node class from its ASDL signature (`Call(expr func, expr* args, keyword* keywords)` ->
    `[n.func, *n.args, *n.keywords]`): one call per node instead of a getattr and a type test per field,
    the indexing walk's main cost. None for a class without children; the generic loop when the
    signature cannot be read (docstrings stripped by `python -OO`)."""
    if not cls._fields:
        return None
    head = _SIGNATURE.fullmatch((cls.__doc__ or "").split("\n")[0])
    specs = [_FIELD_SPEC.fullmatch(f.strip()) for f in head.group(2).split(",")] if head else []
    if not head or head.group(1) != cls.__name__ or not all(specs) or \
            tuple(m.group(3) for m in specs) != cls._fields:
        return _generic_kids
    parts = []
    for m in specs:
        typ, how, name = m.groups()
        if typ in _LEAF_TYPES:
            continue
        if how == "*":
            parts.append(f"*[x for x in n.{name} if x is not None]" if (cls.__name__, name) in _LISTS_WITH_NONE
                         else f"*n.{name}")
        elif how == "?":
            parts.append(f"*((n.{name},) if n.{name} is not None else ())")
        else:
            parts.append(f"n.{name}")
    if not parts:
        return None
    scope: dict = {}
    exec(f"def kids(n): return [{', '.join(parts)}]", scope)  # noqa: S102 - built from ast's own field names
    return scope["kids"]


def _generic_kids(n: ast.AST) -> list[ast.AST]:
    kids = []
    for name in _fields(n.__class__):
        v = getattr(n, name, None)
        if v.__class__ is list:
            kids += [x for x in v if isinstance(x, ast.AST)]
        elif isinstance(v, ast.AST):
            kids.append(v)
    return kids


def kids_of(cls: type) -> Callable[[ast.AST], list[ast.AST]] | None:
    """The compiled children getter of a node class (None: it has no children)."""
    try:
        return _KIDS[cls]
    except KeyError:
        getter = _KIDS[cls] = _kids_getter(cls)
        return getter


def walk_indexed(root: ast.AST) -> tuple[list[ast.AST], dict[type, list[ast.AST]]]:
    """`walk(root)` of a tree straight from the parser, plus the nodes of each class in walk order (rules
    that look for a few node kinds scan those lists instead of every node). No per-node child lists are
    kept: later walks of a subtree (`walk_parsed`) call the same getters again, on a fifth of the nodes."""
    out = [root]
    by_class: dict[type, list[ast.AST]] = {}
    table: dict[type, tuple] = {}  # class -> (its bucket's append, its children getter): one lookup per node
    for n in out:  # `out` grows while it is read: a breadth-first walk, as `walk` does
        cls = n.__class__
        try:
            add, get = table[cls]
        except KeyError:
            bucket = by_class[cls] = []
            add, get = table[cls] = (bucket.append, kids_of(cls))
        add(n)
        if get is not None:
            out += get(n)
    return out, by_class


def walk_parsed(node: ast.AST) -> list[ast.AST]:
    """`walk(node)` through the compiled getters: same nodes, same order (tests/test_lint_walk.py)."""
    out = [node]
    getters = _KIDS
    for n in out:
        try:
            get = getters[n.__class__]
        except KeyError:
            get = kids_of(n.__class__)
        if get is not None:
            out += get(n)
    return out


_Name, _Attribute = ast.Name, ast.Attribute


def tail(node: ast.AST) -> str | None:
    """Last name component: `self.scaler` -> 'scaler', `scaler` -> 'scaler', `f()` -> None."""
    cls = node.__class__  # exact classes: called for nearly every call and assignment of the file
    if cls is _Name:
        return node.id
    if cls is _Attribute:
        return node.attr
    return None


def chain_base(node: ast.AST | None) -> str | None:
    """`model.cuda().half()` -> 'model': the object at the root of a method-call chain."""
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        node = node.func.value
    return tail(node) if isinstance(node, (ast.Name, ast.Attribute)) else None


def func_tail(call: ast.Call) -> str | None:
    return tail(call.func)


def receiver(call: ast.Call) -> ast.AST | None:
    return call.func.value if call.func.__class__ is _Attribute else None


def text(node: ast.AST | None) -> str:
    if node is None:
        return ""
    try:
        return ast.unparse(node)
    except Exception:  # pragma: no cover - unparse handles every parsed node
        return ""


def names_in(node: ast.AST | None) -> set[str]:
    """Every Name id and attribute name mentioned in an expression."""
    out: set[str] = set()
    if node is None:
        return out
    for n in walk(node):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
    return out



def grad_of(sub: ast.Subscript) -> ast.Attribute | None:
    """The `.grad` attribute under `x.grad[...]` / `x.grad.data[...]`, or None."""
    v = sub.value
    if isinstance(v, ast.Attribute) and v.attr == "data":
        v = v.value
    return v if isinstance(v, ast.Attribute) and v.attr == "grad" else None


def is_grad_read(node: ast.Attribute, root: ast.AST) -> bool:
    for parent in walk(root):
        if isinstance(parent, ast.Compare) and (parent.left is node or node in parent.comparators):
            return False
        if isinstance(parent, ast.Attribute) and parent.value is node and parent.attr in ZEROING | {"data"}:
            return parent.attr == "data"
        if isinstance(parent, ast.Assign) and node in parent.targets:
            return False
    return True



def dict_like(node: ast.AST) -> bool:
    """What a save helper's first argument looks like when it is a checkpoint: a dict display, a
    name (`to_save`, `checkpoint`), `dict(...)` or `asdict(state)`."""
    return isinstance(node, (ast.Dict, ast.Name)) or (
        isinstance(node, ast.Call) and func_tail(node) in {"dict", "asdict", "vars"})


def peel(value: ast.AST) -> ast.AST:
    return value.value if isinstance(value, ast.Await) else value


def kwarg(call: ast.Call, name: str) -> ast.AST | None:
    for k in call.keywords:
        if k.arg == name:
            return k.value
    return None


def kw_is_false(call: ast.Call, name: str) -> bool:
    v = kwarg(call, name)
    return v is not None and is_false(v)


def is_false(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value in (False, 0) and node.value is not None


def is_true(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is True
