"""`python -m troubleshooter lint PATH ...`: the static mixed-precision linter."""
from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tokenize

from ..errors import UserError
from ..heap import collector_paused

# lint/output.py's FORMATS, named here so building the parser imports no linter code
FORMAT_NAMES = ("text", "full", "concise", "json", "json-lines", "github", "gitlab", "junit", "sarif")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "lint", help="find mixed-precision (AMP) mistakes in training scripts and notebooks",
        description="Statically check PyTorch training scripts (.py), notebooks (.ipynb), directories or stdin (-) "
                    "for FP16/BF16 mixed-precision mistakes. Exit 0: clean, 1: warnings/errors found "
                    "(with --diff: something would change), 2: an input could not be read or parsed.")
    p.add_argument("paths", nargs="*", metavar="PATH",
                   help="file, notebook, directory, or - for stdin (stdin alone when --stdin-filename is given)")
    p.add_argument("--format", choices=FORMAT_NAMES, default="text",
                   help="output format (default text; full is text; concise: one line per finding; json-lines: one "
                        "object per line; github: annotations; gitlab: code quality report; junit: JUnit XML; "
                        "sarif: SARIF 2.1.0 for code scanning)")
    p.add_argument("--statistics", action="store_true",
                   help="print how many findings each rule has (a JSON list with --format json) instead of the findings")
    p.add_argument("--select", metavar="IDS", help="only these rules: comma list of ids or prefixes (AMP101,AMP11); "
                                                   "replaces `select` from pyproject.toml")
    p.add_argument("--ignore", metavar="IDS", help="skip these rules: comma list of ids or prefixes; "
                                                   "replaces `ignore` from pyproject.toml")
    p.add_argument("--exclude", metavar="GLOBS", help="skip files matching these comma-separated globs "
                                                      "(third_party,legacy/*.py); replaces `exclude` from pyproject.toml")
    p.add_argument("--config", metavar="PYPROJECT", help="read [tool.amp-troubleshooter] from this file "
                                                         "(default: the nearest pyproject.toml that has it)")
    p.add_argument("--isolated", action="store_true", help="ignore pyproject.toml settings")
    p.add_argument("--exit-zero", action="store_true",
                   help="exit 0 even when problems are found (2 still means an input could not be read)")
    p.add_argument("--stdin-filename", metavar="NAME",
                   help="the name of what stdin holds: findings carry it, per-file-ignores match it, and a name "
                        "ending in .ipynb reads stdin as a notebook")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--diff", action="store_true",
                      help="print the safe mechanical fixes as a unified diff (per cell for notebooks); change "
                           "nothing; exit 1 when something would change")
    mode.add_argument("--fix", action="store_true",
                      help="apply the safe mechanical fixes in place (notebooks: in their code cells)")
    mode.add_argument("--add-noqa", action="store_true",
                      help="add `# noqa: AMPnnn` to every line with a finding, so only new findings are reported")
    p.add_argument("--no-cache", action="store_true", help="analyse every file again instead of reusing cached results")
    p.add_argument("--cache-dir", metavar="DIR",
                   help="where cached results live (default: .amp_troubleshooter_cache beside the pyproject.toml "
                        "that configures the linter, else in the working folder; or $AMP_TROUBLESHOOTER_CACHE_DIR)")
    p.set_defaults(func=run)


def _settings(args: argparse.Namespace):
    """pyproject.toml settings with the command line's --select/--ignore in place of the file's."""
    from ..lint.config import LintConfig, load_config

    config = LintConfig() if args.isolated else load_config(args.config, start=_search_from(args))
    if args.select is not None:
        config.select = args.select
    if args.ignore is not None:
        config.ignore = args.ignore
    if args.exclude is not None:
        config.exclude = [g.strip() for g in args.exclude.split(",") if g.strip()]
    return config


def _search_from(args: argparse.Namespace) -> str | None:
    """Where the pyproject.toml search starts: the folder the linted paths share (stdin's by its
    --stdin-filename), as the editor integration starts from its file's folder, so that
    `lint ~/proj/train.py` run from elsewhere still applies ~/proj's settings. None: the working
    folder (stdin without a name; paths on different drives)."""
    named = [p for p in (*(args.paths or ()), args.stdin_filename) if p and p != "-"]
    folders = [os.path.abspath(p if os.path.isdir(p) else os.path.dirname(p) or ".") for p in named]
    try:
        return os.path.commonpath(folders) if folders else None
    except ValueError:
        return None


def _paths(args: argparse.Namespace) -> list[str]:
    if args.paths:
        return list(args.paths)
    if args.stdin_filename:
        return ["-"]
    raise UserError("lint needs a PATH (a file, notebook or folder, or - for stdin)")


def _exit(report, args: argparse.Namespace) -> int:
    code = report.exit_code
    return 0 if args.exit_zero and code == 1 else code


def _lint(paths: list[str], config, args: argparse.Namespace, cached: bool = True):
    from ..lint.engine import active_rules
    from ..lint.runner import lint_inputs

    rules = active_rules(config.select, config.ignore)
    cache = None
    if cached and not args.no_cache:
        from ..lint.cache import LintCache, default_dir

        cache = LintCache(args.cache_dir or default_dir(config.source.parent if config.source else None), rules)
    report = lint_inputs(paths, rules, args.stdin_filename, cache)
    if cache is not None and cache.broken:
        print(f"warning: {cache.broken}", file=sys.stderr)
    config.apply(report)
    return report


def run(args: argparse.Namespace) -> int:
    # the collector off from the imports to the printed report, as while linting: the ~100 linter
    # modules' imports leave nothing it needs to find (2-4 ms of a ~90 ms start-up); --fix, --diff
    # and --add-noqa rewrite with it on
    with collector_paused():  # reading settings imports the linter
        config = _settings(args)
        paths = _paths(args)
        if not (args.fix or args.diff or args.add_noqa):
            report = _lint(paths, config, args)
            _print(report, args)
            return _exit(report, args)
    return _rewrite(args, config, paths)


def _print(report, args: argparse.Namespace) -> None:
    from ..lint.output import FORMATS, format_statistics

    if args.statistics:
        sys.stdout.write(format_statistics(report, as_json=args.format in ("json", "json-lines")))
    else:
        sys.stdout.write(FORMATS[args.format](report))


def _rewrite(args: argparse.Namespace, config, paths: list[str]) -> int:
    """--diff / --fix / --add-noqa: rewrite each input (what is certainly safe), then report what is left."""
    from ..lint.engine import active_rules
    from ..lint.runner import named_stdin
    from ..lint.source import LintError, iter_inputs

    active_rules(config.select, config.ignore)  # validate ids before touching files
    if "-" in paths and len(paths) > 1 and not args.diff:
        raise UserError("--fix and --add-noqa turn stdin (-) into a filter: give it alone, without other PATHs")
    changed = unreadable = 0
    for path, item in iter_inputs(paths):
        name = path
        if path == "-" and args.stdin_filename:
            item, name = named_stdin(item, args.stdin_filename), args.stdin_filename
        if isinstance(item, LintError):
            unreadable += 1
            if path == "-" or args.diff or args.add_noqa:  # --fix reports these with the lint below
                print(f"{item.path}: error: {item.message}", file=sys.stderr)
            if path == "-" and not args.diff:
                return 2
            continue
        before = item.raw if item.raw is not None else item.text  # linting may rewrite unit.text
        new_text, diff, what = (None, "", "") if config.is_excluded(name) else _rewritten(item, before, name, config, args)
        if path == "-" and not args.diff:  # stdin --fix / --add-noqa is a filter: the (possibly unchanged) text out
            sys.stdout.write(new_text if new_text is not None else before)
            return 0
        if new_text is None:
            continue
        changed += 1
        if args.diff:
            sys.stdout.write(diff)
            continue
        _write(path, new_text, item.raw is None)
        print(f"{name}: {what}", file=sys.stderr)
    if args.diff:
        return 2 if unreadable else (1 if changed and not args.exit_zero else 0)
    if args.add_noqa:
        return 2 if unreadable else 0
    report = _lint(paths, config, args, cached=False)
    _print(report, args)
    return _exit(report, args)


def _write(path: str, text: str, python: bool) -> None:
    """Write a rewritten input back in the encoding its coding line declares (UTF-8 when none, or when
    that encoding cannot hold the new text), with its own line endings."""
    encoding = "utf-8"
    if python:
        try:
            encoding, _ = tokenize.detect_encoding(io.BytesIO(text.encode("utf-8")).readline)
            text.encode(encoding)
        except (SyntaxError, LookupError, UnicodeEncodeError):
            encoding = "utf-8"
    try:
        with open(path, "w", encoding=encoding, newline="") as fh:
            fh.write(text)
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None


def _rewritten(unit, before: str, name: str, config, args: argparse.Namespace) -> tuple[str | None, str, str]:
    """(the new text or None when nothing changes, its diff, what was done) for one input; `before` is
    the input as read (a notebook's JSON)."""
    from ..lint.engine import active_rules, lint_unit
    from ..lint.fix import apply_fixes
    from ..lint.notebook_edit import NotebookLayoutError, fix_notebook

    ignore = config.ignore
    if config.ignored_for(name):  # the CLI gives "AMP1,AMP2"; both forms parse alike
        ignore = [*([ignore] if isinstance(ignore, str) else ignore or []), *config.ignored_for(name)]
    notebook = unit.raw is not None
    report = lint_unit(unit, active_rules(config.select, ignore or None))
    if report.errors:
        return None, "", ""
    try:
        if args.add_noqa:
            return _noqa(report, before, notebook, name)
        if notebook:
            edit, applied = fix_notebook(before, report, name)
            return (edit.text, edit.diff, _fixed(applied)) if edit.cells else (None, "", "")
        result = apply_fixes(before, report, name)
        return (result.fixed_text, result.diff, _fixed(result.applied)) if result.applied else (None, "", "")
    except NotebookLayoutError as exc:
        print(f"{name}: not rewritten: {exc}", file=sys.stderr)
        return None, "", ""


def _noqa(report, before: str, notebook: bool, name: str) -> tuple[str | None, str, str]:
    from ..lint.edits import apply_edits
    from ..lint.fix import unified_diff
    from ..lint.noqa import codes_by_line, noqa_edits
    from ..lint.notebook_edit import apply_cell_edits, cell_source, code_cells

    edits, skipped = [], 0
    if not notebook:
        edits, skipped = noqa_edits(before, codes_by_line(report))
    else:
        cells = code_cells(json.loads(before))
        for cell in sorted({f.location.cell for f in report.findings if f.location.cell in cells}):
            e, s = noqa_edits(cell_source(cells[cell]), codes_by_line(report, cell), cell)
            edits, skipped = edits + e, skipped + s
    if skipped:
        print(f"{name}: {skipped} line{'s' if skipped != 1 else ''} cannot take a `# noqa` comment at its end "
              "(inside a multi-line string or continued by a backslash); those findings stay", file=sys.stderr)
    if not edits:
        return None, "", ""
    what = f"added {len(edits)} noqa directive{'s' if len(edits) != 1 else ''}"
    if not notebook:
        text = apply_edits(before, edits)
        return text, unified_diff(before, text, name), what
    edit = apply_cell_edits(before, name, edits)
    return (edit.text, edit.diff, what) if edit.cells else (None, "", "")


def _fixed(applied) -> str:
    return f"fixed {len(applied)} problem{'s' if len(applied) != 1 else ''}"
