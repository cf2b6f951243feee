"""The indexing walk and the subtree walk (lint/analysis/astutil.py) read each node's children through
getters compiled from the node classes' ASDL signatures: they must list the same nodes, in the same
order, as the generic field-by-field walk does, on every construct the parser makes."""
import ast
from pathlib import Path

from troubleshooter.lint.analysis import astutil
from troubleshooter.lint.analysis.astutil import walk, walk_indexed, walk_parsed

ROOT = Path(__file__).resolve().parents[1]

# Constructs with optional fields, lists that hold None (`**d` keys, kw-only args without default),
# identifier lists (global, match class attributes), f-strings, patterns, async forms, type comments.
EVERY_KIND = '''
import a.b as c, d
from .e import f as g, h
global_x: int = 1
def fn(p, /, q: int = 2, *r, s, t=3, **u) -> "x":
    global gl
    nonlocal_y = lambda v, *, w=1: v
    return {**u, "k": [i async for i in r] if p else {j: j for j in q}}
async def afn():
    async with a() as (b, c), d:
        async for x in y:
            await z
    try:
        pass
    except (E, F) as e:
        raise X from e
    else:
        del a[1:2:3], b.c
    finally:
        assert x, f"{y!r:>{w}} {z=}"
    try:
        pass
    except* G:
        pass
class K(B, metaclass=M):
    @dec(1)
    def m(self): yield from (yield)
match cmd:
    case [1, *rest] | {"k": v, **kw} if v > 0:
        pass
    case Point(x=0, y=_) as p:
        pass
    case Klass(a, b, c=d) | None | -1 | 1 + 2j | "s":
        pass
while not (a < b <= c and d or e is not f):
    x @= y ** -z
    break
else:
    continue_ = ...
with open(f) as h: print(*a, sep="", **k); x = a if b else c; y = {1, 2}; z = (a, b); q = a[b, c:d]
'''


def _same(tree):
    nodes, by_class = walk_indexed(tree)
    ref_nodes = walk(tree)
    assert [id(n) for n in nodes] == [id(n) for n in ref_nodes]
    expected = {}
    for n in ref_nodes:
        expected.setdefault(n.__class__, []).append(id(n))
    assert {c: [id(x) for x in v] for c, v in by_class.items()} == expected
    for n in ref_nodes:  # every subtree, from the getters, as the generic walk lists it
        assert [id(x) for x in walk_parsed(n)] == [id(x) for x in walk(n)]


def test_every_construct_walks_like_the_generic_walk():
    tree = ast.parse(EVERY_KIND, type_comments=True)
    _same(tree)
    kinds = {n.__class__.__name__ for n in ast.walk(tree)}
    assert {"Dict", "arguments", "MatchMapping", "MatchClass", "TryStar", "Global", "JoinedStr"} <= kinds


def test_in_repo_scripts_walk_like_the_generic_walk():
    scripts = sorted((ROOT / "tests" / "fixtures" / "lint").glob("*.py"))
    assert len(scripts) > 50
    for path in scripts:
        _same(ast.parse(path.read_text()))


def test_getters_fall_back_without_signatures(monkeypatch):
    """Under `python -OO` node classes have no docstrings: the generic walk is used, same result."""
    class Bare(ast.Call):
        __doc__ = None
    assert astutil._kids_getter(Bare) is astutil._generic_kids
    assert astutil._kids_getter(ast.Call) is not astutil._generic_kids
    assert astutil._kids_getter(ast.Pass) is None


def test_two_kinds_merge_in_walk_order():
    """FileModel.in_walk_order merges two kinds of the class index as a walk would list them (the
    roles and imports passes read assignments, defs and imports this way, and their order decides
    which of two bindings of a name wins)."""
    from troubleshooter.lint.analysis import FileModel

    src = EVERY_KIND + '''
x: int = 1
def outer():
    y = 2
    z: float = 3.0
    async def inner():
        import os
        w: str = "a"
        v = w
    from b import c
    return y
import sys
u = 4
'''
    m = FileModel(ast.parse(src), src)
    for a, b in ((ast.Assign, ast.AnnAssign), (ast.FunctionDef, ast.AsyncFunctionDef), (ast.Import, ast.ImportFrom)):
        expected = [id(n) for n in m.nodes if n.__class__ in (a, b)]
        assert [id(n) for n in m.in_walk_order(m.of_class(a), m.of_class(b))] == expected
        assert [id(n) for n in m.in_walk_order(m.of_class(b), m.of_class(a))] == expected
        assert len(expected) >= 3


def test_dotted_names_key_like_the_unparser():
    """cond_key spells a name or attribute chain itself instead of calling ast.unparse: same text."""
    from troubleshooter.lint.analysis.events import _dotted

    checked = 0
    for path in sorted((ROOT / "tests" / "fixtures" / "lint").glob("*.py")):
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, (ast.Name, ast.Attribute)):
                key = _dotted(n)
                if key is not None:
                    assert key == ast.unparse(n)
                    checked += 1
                else:
                    assert isinstance(n, ast.Attribute)  # a chain on a call or subscript: the unparser spells it
    assert checked > 1000
