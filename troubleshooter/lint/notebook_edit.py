"""Write edits back into a notebook's code cells (`lint --fix`, `--diff`, `--add-noqa` on .ipynb).

Edits come in cell coordinates (edits.Edit with `cell`, numbered among code cells as findings
are). Each changed cell's source is rewritten in the form it was stored in (a list of lines or
one string) and must still parse; the notebook is then written back as JSON in its own layout
(indent, key order, escaping, final newline). When the file's layout cannot be reproduced (a
hand-formatted notebook), it is not rewritten, and the user is told so: `NotebookLayoutError`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from .edits import Edit, apply_edits, split_lines
from .fix import FixResult, apply_fixes, unified_diff
from .source import strip_ipython


class NotebookLayoutError(ValueError):
    """The notebook's JSON is laid out in a way that writing it back would change beyond the cells."""


@dataclass
class NotebookEdit:
    text: str  # the notebook's new JSON
    diff: str  # one unified diff per changed cell (`a/nb.ipynb:cell 3`)
    cells: list[int] = field(default_factory=list)


def _layout(raw: str, nb: dict) -> dict:
    """json.dumps settings that write `nb` back exactly as `raw` stores it, or raise."""
    indent = None
    for line in raw.splitlines()[1:3]:
        stripped = line.lstrip(" ")
        if stripped.startswith('"') and len(line) > len(stripped):
            indent = len(line) - len(stripped)
            break
    for ascii_only in (False, True):
        layout = {"indent": indent, "ensure_ascii": ascii_only,
                  "separators": (",", ": ") if indent is not None else (",", ":")}
        if json.dumps(nb, **layout) == raw.rstrip("\n"):
            return layout
    raise NotebookLayoutError("its JSON layout is not the one Jupyter writes, so rewriting it would change more "
                              "than the fixed cells; apply the diff (--diff) by hand or save it from Jupyter first")


def code_cells(nb: dict) -> dict[int, dict]:
    """Code cells by the number findings give them (counted among code cells, from 1)."""
    out, n = {}, 0
    for cell in nb.get("cells", []):
        if isinstance(cell, dict) and cell.get("cell_type") == "code":
            n += 1
            out[n] = cell
    return out


def cell_source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(s for s in src if isinstance(s, str)) if isinstance(src, list) else src


def _store(cell: dict, text: str) -> None:
    cell["source"] = split_lines(text) if isinstance(cell.get("source"), list) else text


def _parses(text: str) -> bool:
    lines = strip_ipython(text.splitlines(), cell=True)
    if lines is None:
        return True
    try:
        compile("\n".join(lines) + "\n", "<cell>", "exec", flags=0x400, dont_inherit=True)  # PyCF_ONLY_AST
        return True
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False


def edit_cells(raw: str, path: str, new_sources: dict[int, str]) -> NotebookEdit:
    """The notebook with the given code cells' sources replaced (each must still parse)."""
    nb = json.loads(raw)
    layout = _layout(raw, nb)
    cells = code_cells(nb)
    diffs, changed = [], []
    for number, text in sorted(new_sources.items()):
        cell = cells.get(number)
        if cell is None or not _parses(text):
            continue
        before = cell_source(cell)
        if text == before:
            continue
        _store(cell, text)
        diffs.append(unified_diff(before, text, path, f":cell {number}"))
        changed.append(number)
    if not changed:
        return NotebookEdit(raw, "", [])
    text = json.dumps(nb, **layout) + ("\n" if raw.endswith("\n") else "")
    return NotebookEdit(text, "".join(diffs), changed)


def apply_cell_edits(raw: str, path: str, edits: list[Edit]) -> NotebookEdit:
    """Edits in cell coordinates, made cell by cell."""
    cells = code_cells(json.loads(raw))
    by_cell: dict[int, list[Edit]] = {}
    for e in edits:
        by_cell.setdefault(e.cell, []).append(e)
    return edit_cells(raw, path, {c: apply_edits(cell_source(cells[c]), es) for c, es in by_cell.items() if c in cells})


def fix_notebook(raw: str, report, path: str) -> tuple[NotebookEdit, list]:
    """The report's safe fixes made in the notebook's cells: (the edit, the findings fixed)."""
    cells = code_cells(json.loads(raw))
    results: dict[int, FixResult] = {}
    for number in sorted({f.location.cell for f in report.findings if report.fix_of(f)}):
        if number in cells:
            results[number] = apply_fixes(cell_source(cells[number]), report, path, cell=number)
    edit = edit_cells(raw, path, {c: r.fixed_text for c, r in results.items() if r.applied})
    return edit, [f for c in edit.cells for f in results[c].applied]
