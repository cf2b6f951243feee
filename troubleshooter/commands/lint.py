"""`python -m troubleshooter lint PATH ...`: the static mixed-precision linter."""
from __future__ import annotations

import argparse
import sys

from ..errors import UserError


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "lint", help="find mixed-precision (AMP) mistakes in training scripts and notebooks",
        description="Statically check PyTorch training scripts (.py), notebooks (.ipynb), directories or stdin (-) "
                    "for FP16/BF16 mixed-precision mistakes. Exit 0: clean, 1: warnings/errors found, "
                    "2: an input could not be read or parsed.")
    p.add_argument("paths", nargs="+", metavar="PATH", help="file, notebook, directory, or - for stdin")
    p.add_argument("--format", choices=["text", "json", "github", "sarif"], default="text",
                   help="output format (default text; sarif: SARIF 2.1.0 for code scanning)")
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
    p.add_argument("--diff", action="store_true", help="print the safe mechanical fixes as a unified diff; change nothing")
    p.add_argument("--fix", action="store_true", help="apply the safe mechanical fixes to the files in place")
    p.set_defaults(func=run)


def _settings(args: argparse.Namespace):
    """pyproject.toml settings with the command line's --select/--ignore in place of the file's."""
    from ..lint.config import LintConfig, load_config

    config = LintConfig() if args.isolated else load_config(args.config)
    if args.select is not None:
        config.select = args.select
    if args.ignore is not None:
        config.ignore = args.ignore
    if args.exclude is not None:
        config.exclude = [g.strip() for g in args.exclude.split(",") if g.strip()]
    return config


def _exit(report, args: argparse.Namespace) -> int:
    code = report.exit_code
    return 0 if args.exit_zero and code == 1 else code


def _lint(paths: list[str], config):
    from ..lint import lint_paths

    report = lint_paths(paths, select=config.select, ignore=config.ignore)
    config.apply(report)
    return report


def run(args: argparse.Namespace) -> int:
    from ..lint.output import FORMATS

    config = _settings(args)
    if args.fix or args.diff:
        return _fix(args, config)
    report = _lint(args.paths, config)
    sys.stdout.write(FORMATS[args.format](report))
    return _exit(report, args)


def _fix(args: argparse.Namespace, config) -> int:
    """--diff / --fix: rewrite what is certainly safe, then report what is left."""
    from ..lint import fix_text
    from ..lint.engine import active_rules
    from ..lint.output import FORMATS
    from ..lint.source import LintError, iter_inputs

    active_rules(config.select, config.ignore)  # validate ids before touching files
    status = 0
    for path, item in iter_inputs(list(args.paths)):
        if isinstance(item, LintError) or item.cell_map is not None or config.is_excluded(path):
            continue  # unreadable inputs are reported by the lint below; notebooks are not rewritten
        ignore = config.ignore
        if path != "-" and config.ignored_for(path):  # the CLI gives "AMP1,AMP2"; both forms parse alike
            ignore = [*([ignore] if isinstance(ignore, str) else ignore or []), *config.ignored_for(path)]
        result = fix_text(item.text, path=path, select=config.select, ignore=ignore or None)
        if path == "-" and args.fix:  # stdin --fix is a filter: the (possibly unchanged) text out
            sys.stdout.write(result.fixed_text)
            return 0
        if not result.applied:
            continue
        if args.diff:
            sys.stdout.write(result.diff)
        else:
            try:
                with open(path, "w", encoding="utf-8") as fh:
                    fh.write(result.fixed_text)
            except OSError as exc:
                raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None
            print(f"{path}: fixed {len(result.applied)} problem{'s' if len(result.applied) != 1 else ''}",
                  file=sys.stderr)
    if args.diff:
        return status
    if "-" in args.paths:
        return 0
    report = _lint(args.paths, config)
    sys.stdout.write(FORMATS[args.format](report))
    return _exit(report, args)
