"""The flake8 plugin: `flake8 --select AMP` runs the AMP rules inside an existing flake8 setup.

Registered under the `flake8.extension` entry point with the `AMP` prefix (like TorchFix's
`TOR`), so flake8's own select/ignore/per-file-ignores/noqa apply to our codes. Severity is not
a flake8 notion: `amp-troubleshooter rules AMPnnn` explains a code and its fix.
"""
from __future__ import annotations

import ast
from typing import Iterator

from . import __version__


class AmpChecker:
    name = "amp-troubleshooter"
    version = __version__

    # flake8 passes plugin arguments by parameter name; `tree` marks this as an AST plugin.
    def __init__(self, tree: ast.AST, lines: list[str], filename: str = "stdin") -> None:
        self._lines = lines
        self._filename = filename

    def run(self) -> Iterator[tuple[int, int, str, type]]:
        from .lint import lint_text

        # The file as Python source, even when named .ipynb (flake8 hands us Python lines).
        path = self._filename if self._filename.endswith(".py") else f"{self._filename}.py"
        report = lint_text("".join(self._lines), path=path)
        for f in report.findings:  # unparsable files are flake8's E999, not ours
            yield f.location.line or 1, max((f.location.column or 1) - 1, 0), f"{f.rule} {f.message}", type(self)
