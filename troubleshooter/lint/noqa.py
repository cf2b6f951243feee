"""`lint --add-noqa`: silence every current finding with a `# noqa: AMPnnn` on its line (as ruff does),
so a large codebase can adopt the linter now and fix findings over time.

A line that already has `# noqa: CODES` gets the new ids added to its list; other lines get
`  # noqa: AMPnnn` at their end. A line whose end lies inside a multi-line string, or that a
backslash continues, cannot take a comment there: its findings are left and counted as skipped.
"""
from __future__ import annotations

import io
import tokenize

from .edits import Edit, split_lines
from .engine import _NOQA, LintReport
from .source import strip_ipython


def _unsafe_line_ends(text: str, cell: bool) -> set[int]:
    """Lines whose end is inside a token that spans lines (a triple-quoted string), or continued by `\\`.
    IPython lines (`!pip ...`) are read as the linter reads them (same line numbers)."""
    out: set[int] = set()
    python = [text, "\n".join(strip_ipython(text.splitlines(), cell=cell) or []) + "\n"]
    for candidate in python:
        try:
            for tok in tokenize.generate_tokens(io.StringIO(candidate).readline):
                if tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT) and tok.end[0] > tok.start[0]:
                    out.update(range(tok.start[0], tok.end[0]))
            break
        except (tokenize.TokenError, SyntaxError):
            out = set()
    else:
        return set(range(1, len(split_lines(text)) + 1))  # cannot tell: touch nothing
    for no, line in enumerate(split_lines(text), 1):
        if line.rstrip("\r\n").endswith("\\"):
            out.add(no)
    return out


def noqa_edits(text: str, codes_by_line: dict[int, set[str]], cell: int | None = None) -> tuple[list[Edit], int]:
    """Edits adding `# noqa` codes to lines of `text` (Python, or a notebook cell); (edits, lines skipped)."""
    lines = split_lines(text)
    unsafe = _unsafe_line_ends(text, cell is not None)
    edits, skipped = [], 0
    for no, codes in sorted(codes_by_line.items()):
        if not 1 <= no <= len(lines) or no in unsafe:
            skipped += 1
            continue
        line = lines[no - 1].rstrip("\r\n")
        mt = _NOQA.search(line)
        if mt and mt.group("codes"):
            have = [c.strip() for c in mt.group("codes").split(",")]
            merged = ", ".join(have + sorted(codes - {c.upper() for c in have}))
            start, end = mt.span("codes")
            edits.append(Edit(no, start + 1, no, end + 1, merged, cell))
        elif not mt:
            edits.append(Edit(no, len(line) + 1, no, len(line) + 1, f"  # noqa: {', '.join(sorted(codes))}", cell))
    return edits, skipped


def codes_by_line(report: LintReport, cell: int | None = None) -> dict[int, set[str]]:
    out: dict[int, set[str]] = {}
    for f in report.findings:
        if f.location.cell == cell and f.location.line:
            out.setdefault(f.location.line, set()).add(f.rule)
    return out
