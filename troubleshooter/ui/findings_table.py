"""The Diagnose tab's findings as people read them: errors and warnings in the table, worst
first; infos (hints: nothing is wrong) folded away below it; findings seen at run time merged in
by the same order.

A row is the table's list `[severity, rule, where, code, message, fix]`; beside each table the
page keeps the rule of row i (by index, never parsed back out of the text), so clicking a row
explains the right rule whichever table it is in.
"""
from __future__ import annotations

_RANK = {"error": 2, "warning": 1, "info": 0}


def rank(row) -> int:
    """How bad a row is, from its severity cell (`ERROR`, `warning`, `info`): 2, 1, 0."""
    return _RANK.get(str(row[0]).strip().lower(), 0) if row else 0


def by_severity(rows: list, rules: list) -> tuple[list, list]:
    """Rows (and their rules) worst first; rows of the same severity keep their order (static
    findings by line, then those seen at run time)."""
    pairs = sorted(zip(rows, rules), key=lambda pair: -rank(pair[0]))
    return [r for r, _ in pairs], [k for _, k in pairs]


def split(rows: list, rules: list) -> tuple[list, list, list, list]:
    """(error/warning rows, their rules, info rows, their rules), each worst first."""
    rows, rules = by_severity(list(rows or []), list(rules or [])[:len(rows or [])])
    main = [(r, k) for r, k in zip(rows, rules) if rank(r) > 0]
    infos = [(r, k) for r, k in zip(rows, rules) if rank(r) == 0]
    return [r for r, _ in main], [k for _, k in main], [r for r, _ in infos], [k for _, k in infos]


def infos_label(n: int) -> str:
    """The folded infos' heading: how many there are, and that they are hints, not problems."""
    return f"{n} info{'s' if n != 1 else ''}: hints, nothing wrong"
