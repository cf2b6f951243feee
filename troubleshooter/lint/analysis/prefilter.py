"""Which functions of a file can record a training-step event, decided from the file's call and `.grad`
lists before any scope is walked.

Most functions of a real source tree (model classes, pipelines, utilities) record no event; walking
their every expression node to learn so cost more than parsing the file. A function can record one
only when its lines hold a *trigger* that `Walker._call`/`_exprs` turns into an event (`.grad`,
`backward`, `step`, `zero_grad`, a clip, a save, a scaler's method) or a call to a local helper that
can (the helper summaries of `Walker._call`, followed through the helpers it calls). Everything else
is walked in light mode (statements, loops and `with` regions, call names; no events). The test that
this set is a superset of the functions that do record events lives in tests/test_lint_prefilter.py.
"""
from __future__ import annotations

import ast
from bisect import bisect_left, bisect_right
from typing import TYPE_CHECKING

from .astutil import tail
from .vocab import CLIP_NAMES

if TYPE_CHECKING:
    from .model import FileModel

# Call names `Walker._call` makes an event of (whatever the receiver); "save" in any case is matched too.
# Memo key of the ids of every def of the file that may record an event, itself or through the helpers it
# calls: `Walker._call` summarises a call to any other local helper as nothing without walking it.
EVENT_HELPERS = ("event_helpers",)
# Memo key of the sorted lines of every node that `Walker._exprs` may make an event of: trigger calls, `.grad`
# reads, calls to a helper of EVENT_HELPERS. A statement holding none of these lines records no event.
EVENT_LINES = ("event_lines",)

_TRIGGER_TAILS = frozenset({"backward", "manual_backward", "step", "zero_grad", "clip_grad_norm_",
                            "clip_grad_value_", "unscale_gradients", "clip_gradients"}) | CLIP_NAMES


def event_capable_defs(m: "FileModel", defs: list[ast.AST]) -> set[int]:
    """ids of the defs in `defs` whose walk may record an event (a superset: never misses one)."""
    trig_lines: list[int] = []
    helper: list[tuple[int, str]] = []  # (line, name) of calls that `_call` may summarise as a local helper
    functions = m.functions
    calls = m.calls
    scaler_memo: dict[str, bool] = {}
    # Read by name from the file's call index (each distinct name once, not each call): a call with no
    # name (`f()()`) has no receiver either, and can neither trigger an event nor call a helper.
    for t, where in m.calls_by_tail().items():
        if t in _TRIGGER_TAILS or "save" in t.lower():
            trig_lines += [calls[i].lineno for i in where]
            continue
        if m.may_hold_scaler:
            rest = []
            for i in where:
                f = calls[i].func
                rk = tail(f.value) if f.__class__ is ast.Attribute else None
                if rk:
                    hit = scaler_memo.get(rk)
                    if hit is None:
                        hit = scaler_memo[rk] = m.is_scaler(rk)
                    if hit:
                        trig_lines.append(calls[i].lineno)
                        continue
                rest.append(i)
            where = rest
        if t in functions:
            for i in where:
                f = calls[i].func
                if f.__class__ is not ast.Attribute or tail(f.value) == "self":
                    helper.append((calls[i].lineno, t))
    if m.may_name("grad"):  # False when no name or attribute is `grad`: most files have no `.grad`
        trig_lines += [a.lineno for a in m.of_class(ast.Attribute) if a.attr == "grad"]
    if not trig_lines:  # no def has a trigger, so none is hot and no helper leads to one (most model files)
        m.memo.put(EVENT_HELPERS, frozenset())
        m.memo.put(EVENT_LINES, [])
        return set()
    trig_lines.sort()
    helper.sort()
    helper_lines = [line for line, _ in helper]

    all_defs = [d for ds in functions.values() for d in ds]
    spans = {id(d): (min([d.lineno] + [x.lineno for x in d.decorator_list]), d.end_lineno or d.lineno)
             for d in all_defs + list(defs)}

    def has_trigger(d) -> bool:
        lo, hi = spans[id(d)]
        return bisect_left(trig_lines, lo) < bisect_right(trig_lines, hi)

    def helper_names(d) -> set[str]:
        lo, hi = spans[id(d)]
        return {name for _, name in helper[bisect_left(helper_lines, lo):bisect_right(helper_lines, hi)]}

    hot = {id(d) for d in all_defs if has_trigger(d)}
    hot_names = {d.name for d in all_defs if id(d) in hot}
    calls_of = {id(d): helper_names(d) for d in all_defs if id(d) not in hot}
    changed = True
    while changed:  # a helper that calls a capable helper is capable (Walker._def_has follows calls)
        changed = False
        for d in all_defs:
            if id(d) not in hot and calls_of[id(d)] & hot_names:
                hot.add(id(d))
                hot_names.add(d.name)
                changed = True
    m.memo.put(EVENT_HELPERS, frozenset(hot))
    m.memo.put(EVENT_LINES, sorted(trig_lines + [line for line, name in helper if name in hot_names]))
    return {id(d) for d in defs
            if id(d) in hot or has_trigger(d) or helper_names(d) & hot_names}


def defs_holding(m: "FileModel", defs: list[ast.AST], classes: tuple[type, ...]) -> set[int]:
    """ids of the defs in `defs` whose lines hold a node of one of `classes` (a superset, by lines)."""
    lines = sorted(n.lineno for cls in classes for n in m.of_class(cls))
    if not lines:
        return set()
    return {id(d) for d in defs
            if bisect_left(lines, d.lineno) < bisect_right(lines, d.end_lineno or d.lineno)}
