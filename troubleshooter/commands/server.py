"""`python -m troubleshooter server`: the language server for editors (LSP over stdio)."""
from __future__ import annotations

import argparse


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "server", help="language server for editors: lint findings as diagnostics, safe fixes as quick fixes",
        description="Speak the Language Server Protocol on stdin/stdout: diagnostics for Python files on open, "
                    "change and save, with quick fixes for the safe fixes. Needs the [lsp] extra (pygls). "
                    "Editor set-up: docs/editors.md.")
    p.add_argument("--stdio", action="store_true", help="accepted for editors that pass it; stdio is the only transport")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..lsp.server import serve

    return serve()
