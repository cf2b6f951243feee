"""Lint what a command names (files, notebooks, folders, `-` for stdin), file by file, with the result
cache (lint/cache.py) when one is given. `lint_paths` is this without a cache."""
from __future__ import annotations

from ..heap import collector_paused
from .engine import LintReport, lint_unit
from .frameworks.configs import listing_cache
from .source import LintError, SourceUnit, iter_inputs, notebook_unit


def named_stdin(item: SourceUnit | LintError, name: str) -> SourceUnit | LintError:
    """Stdin read under the name `--stdin-filename` gives: findings carry it, and `*.ipynb` is a notebook."""
    if isinstance(item, LintError):
        return LintError(name, item.message, item.line, item.cell)
    if name.endswith(".ipynb"):
        try:
            return notebook_unit(item.text, name)
        except ValueError as exc:
            return LintError(name, str(exc))
    item.path = name
    return item


def lint_inputs(paths: list[str], rules, stdin_filename: str | None = None, cache=None) -> LintReport:
    """Every input linted with `rules`; unreadable ones become errors, the others still reported."""
    report = LintReport()
    # the parse makes millions of AST nodes and no cycles: the collector's passes over them find
    # nothing and cost ~1/3 of a bare `ast.parse` on a real tree
    with collector_paused(), listing_cache():
        _lint_all(report, paths, rules, stdin_filename, cache)
    return report


def _lint_all(report: LintReport, paths: list[str], rules, stdin_filename, cache) -> None:
    for path, item in iter_inputs(list(paths)):
        if path == "-" and stdin_filename:
            item = named_stdin(item, stdin_filename)
        if isinstance(item, LintError):
            report.errors.append(item)
            report.files += 1
        else:
            report.extend(_lint_one(item, rules, cache if path != "-" else None, read_configs=path != "-"))


def _lint_one(unit: SourceUnit, rules, cache, read_configs: bool = False) -> LintReport:
    """`read_configs`: a file on disk, whose framework config files beside it may be read (lint/frameworks)."""
    if cache is None:
        return lint_unit(unit, rules, read_configs=read_configs)
    key = cache.key(unit)  # before linting: an IPython export's text is rewritten as it is parsed
    report = cache.get(unit, key)
    if report is None:
        report = lint_unit(unit, rules, read_configs=read_configs)
        cache.put(unit, key, report)
    return report
