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
    p.add_argument("--format", choices=["text", "json", "github"], default="text", help="output format (default text)")
    p.add_argument("--select", metavar="IDS", help="only these rules: comma list of ids or prefixes (AMP101,AMP11)")
    p.add_argument("--ignore", metavar="IDS", help="skip these rules: comma list of ids or prefixes")
    p.add_argument("--diff", action="store_true", help="print the safe mechanical fixes as a unified diff; change nothing")
    p.add_argument("--fix", action="store_true", help="apply the safe mechanical fixes to the files in place")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..lint import lint_paths
    from ..lint.output import FORMATS

    if args.fix or args.diff:
        return _fix(args)
    report = lint_paths(args.paths, select=args.select, ignore=args.ignore)
    sys.stdout.write(FORMATS[args.format](report))
    return report.exit_code


def _fix(args: argparse.Namespace) -> int:
    """--diff / --fix: rewrite what is certainly safe, then report what is left."""
    from ..lint import fix_text, lint_paths
    from ..lint.engine import active_rules
    from ..lint.output import FORMATS
    from ..lint.source import LintError, iter_inputs

    active_rules(args.select, args.ignore)  # validate ids before touching files
    status = 0
    for path, item in iter_inputs(list(args.paths)):
        if isinstance(item, LintError) or item.cell_map is not None:
            continue  # unreadable inputs are reported by the lint below; notebooks are not rewritten
        result = fix_text(item.text, path=path, select=args.select, ignore=args.ignore)
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
    report = lint_paths(args.paths, select=args.select, ignore=args.ignore)
    sys.stdout.write(FORMATS[args.format](report))
    return report.exit_code
