"""`explain`: an error message or a training log in, causes and fixes out."""
from __future__ import annotations

import argparse
import json
import sys

from ..errors import UserError
from ..explain import MAX_CHARS, explain_log


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "explain",
        help="explain a pasted error or training log: cause, matching rule id, fix",
        description="Recognises the messages PyTorch prints around AMP (GradScaler errors, deprecations, "
        "NaN losses, a falling loss scale, out of memory, dtype mismatches, ...).",
    )
    p.add_argument("logfile", metavar="LOGFILE", help="a file with the error or log, or - for stdin")
    p.add_argument("--format", choices=["text", "json", "markdown"], default="text")
    p.set_defaults(func=run)


def read_log(path: str) -> str:
    """The log's text (the last MAX_CHARS characters of a huge one); undecodable bytes replaced."""
    if path == "-":
        data = sys.stdin.buffer.read()
    else:
        try:
            with open(path, "rb") as fh:
                fh.seek(0, 2)
                size = fh.tell()
                fh.seek(max(0, size - 4 * MAX_CHARS))
                data = fh.read()
        except OSError as exc:
            raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    if b"\x00" in data[:8192]:
        raise UserError(f"{path} looks like a binary file, not a log or error message")
    return data.decode("utf-8", errors="replace")


def run(args: argparse.Namespace) -> int:
    report = explain_log(read_log(args.logfile))
    if args.format == "json":
        print(json.dumps(report.to_dict(), indent=2))
    elif args.format == "markdown":
        print(report.to_markdown())
    else:
        print(report.to_text())
    return 0
