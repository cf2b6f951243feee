"""A finding's safe fix as text edits in the coordinates findings use, for every consumer alike.

Positions are 1-based lines and 1-based character columns (end exclusive), in the file, or for a
notebook in the code cell `cell` (numbered like findings' cells). The same edits feed `--fix`,
`--diff`, the JSON `fix` object, SARIF `fixes` and the language server's quick fixes, so what an
editor offers is what `--fix` writes. Lines end at `\\n`, `\\r\\n` or `\\r` only, as Python counts them
(str.splitlines also splits at form feeds and other separators, which would shift the lines).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from .lazy_re import lazy

_LINES = lazy(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


def split_lines(text: str) -> list[str]:
    """The lines of `text` with their endings, split the way Python's tokenizer counts lines."""
    return _LINES.findall(text)


def line_starts(text: str) -> list[int]:
    """Offset of each line's first character, plus the offset just past the text."""
    starts = [0]
    for line in split_lines(text):
        starts.append(starts[-1] + len(line))
    return starts


@dataclass(frozen=True)
class Edit:
    """Replace the text from (line, column) up to (end_line, end_column) with `content`."""

    line: int
    column: int
    end_line: int
    end_column: int
    content: str
    cell: int | None = None

    def to_dict(self) -> dict:
        """ruff's JSON shape for an edit (rows and columns 1-based), plus the notebook cell when there is one."""
        out = {"content": self.content, "location": {"row": self.line, "column": self.column},
               "end_location": {"row": self.end_line, "column": self.end_column}}
        if self.cell is not None:
            out["cell"] = self.cell
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "Edit":
        return cls(d["location"]["row"], d["location"]["column"], d["end_location"]["row"],
                   d["end_location"]["column"], d["content"], d.get("cell"))


@dataclass(frozen=True)
class Fix:
    """One finding's safe fix: what it does and its edits (all applied together, or none)."""

    message: str
    edits: tuple[Edit, ...] = field(default_factory=tuple)
    applicability: str = "safe"  # only certainly-safe fixes are made (ruff's name for it)

    def to_dict(self) -> dict:
        return {"applicability": self.applicability, "message": self.message,
                "edits": [e.to_dict() for e in self.edits]}

    @classmethod
    def from_dict(cls, d: dict) -> "Fix":
        return cls(d.get("message", ""), tuple(Edit.from_dict(e) for e in d.get("edits", [])),
                   d.get("applicability", "safe"))


def offset_of(starts: list[int], lines: list[str], line: int, column: int) -> int:
    """The text offset of a 1-based (line, column); the line after the last one means the end."""
    if line == len(lines) + 1 and column == 1:
        return starts[-1]
    if not 1 <= line <= len(lines) or not 1 <= column <= len(lines[line - 1].rstrip("\r\n")) + 1:
        raise ValueError(f"position {line}:{column} is outside the text")
    return starts[line - 1] + column - 1


def position_of(starts: list[int], offset: int) -> tuple[int, int]:
    """The 1-based (line, column) of a text offset."""
    lo, hi = 0, len(starts) - 1
    while lo < hi:  # the last start <= offset
        mid = (lo + hi + 1) // 2
        if starts[mid] <= offset:
            lo = mid
        else:
            hi = mid - 1
    return lo + 1, offset - starts[lo] + 1


def apply_edits(text: str, edits: Iterable[Edit]) -> str:
    """`text` with the edits made; overlapping edits or positions outside the text raise ValueError."""
    lines = split_lines(text)
    starts = line_starts(text)
    spans = sorted((offset_of(starts, lines, e.line, e.column), offset_of(starts, lines, e.end_line, e.end_column),
                    e.content) for e in edits)
    for (s1, e1, _), (s2, e2, _) in zip(spans, spans[1:]):
        if s2 < e1 or s1 == e1 == s2 == e2:
            raise ValueError("overlapping edits")
    for start, end, content in reversed(spans):
        if end < start:
            raise ValueError("an edit ends before it starts")
        text = text[:start] + content + text[end:]
    return text


def compatible_fixes(fixes: Iterable[Fix]) -> list[Fix]:
    """The fixes that can be made together, first come first served: one whose edits touch another's
    span is left for a later run (as ruff does), so no two fixes ever rewrite the same text."""
    taken: list[tuple[int, int, int, int, int]] = []  # (cell, line, column, end line, end column)
    out = []
    for fix in fixes:
        spans = [(e.cell or 0, e.line, e.column, e.end_line, e.end_column) for e in fix.edits]

        def clash(a, b) -> bool:
            if a[0] != b[0]:
                return False
            a_start, a_end, b_start, b_end = (a[1], a[2]), (a[3], a[4]), (b[1], b[2]), (b[3], b[4])
            return a_start < b_end and b_start < a_end or a_start == a_end == b_start == b_end \
                or (a_start == b_start and (a_start == a_end or b_start == b_end))

        if any(clash(a, b) for a in spans for b in taken):
            continue
        taken += spans
        out.append(fix)
    return out
