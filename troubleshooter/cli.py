"""The command line: one subcommand per module in `troubleshooter.commands`.

Each command module defines `register(subparsers)` which adds its parser and sets
`func=run` where `run(args) -> int` returns the exit status. Adding a command means adding
one file; nothing here changes.
"""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from . import __version__, commands
from .errors import UserError

# Order in `--help`: the four user actions first, then helpers.
_ORDER = ["lint", "rules", "check", "capability", "inspect", "speedup", "ask", "explain", "recipe"]


def _command_modules():
    names = [m.name for m in pkgutil.iter_modules(commands.__path__) if not m.name.startswith("_")]
    names.sort(key=lambda n: (_ORDER.index(n) if n in _ORDER else len(_ORDER), n))
    return [importlib.import_module(f"{commands.__name__}.{n}") for n in names]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m troubleshooter",
        description="AMP Troubleshooter: diagnose and fix PyTorch FP16/BF16 mixed-precision training.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in _command_modules():
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
