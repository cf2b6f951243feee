"""Render a LintReport as SARIF 2.1.0, the format code scanning (GitHub, Azure DevOps, IDEs) reads.

Paths become URIs relative to the working folder (`%SRCROOT%`), so an upload from the
repository root points at the right files. A notebook finding points at the line of the
`.ipynb` file that holds its cell's source line, when the notebook stores its source in the
usual one-string-per-line layout; otherwise at the line where that cell's source starts. The
message names the cell either way. Every result has a start line (code scanning requires one).
Inputs that could not be linted become tool execution notifications, not results.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from .. import HOMEPAGE, __version__
from ..findings import Finding
from .docs import rule_url
from .edits import Fix
from .engine import LintReport, all_rules

SCHEMA_URI = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
SRCROOT = "%SRCROOT%"
LEVEL = {"error": "error", "warning": "warning", "info": "note"}


def _rule_descriptor(rule) -> dict:
    level = LEVEL[str(getattr(rule.severity, "value", rule.severity))]
    return {
        "id": rule.id,
        "name": rule.name,
        "shortDescription": {"text": rule.summary},
        "fullDescription": {"text": rule.why or rule.summary},
        "help": {"text": f"{rule.summary}\n\nWhy: {rule.why}\n\nFix: {rule.fix}", "markdown": rule.explain()},
        "helpUri": rule_url(rule.id),
        "defaultConfiguration": {"level": level},
        "properties": {"tags": ["pytorch", "mixed-precision"]},
    }


def relative_path(path: str, root: Path) -> str | None:
    """`path` relative to `root` in forward slashes, or None when it lies outside `root`."""
    try:
        return Path(path).resolve().relative_to(root).as_posix()
    except ValueError:
        return None


def artifact_location(path: str | None, root: Path) -> dict:
    """A path as SARIF wants it: relative to `root` under %SRCROOT%, or an absolute file URI."""
    if not path or path in ("-", "<stdin>"):
        return {"uri": "stdin"}
    rel = relative_path(path, root)
    if rel is None:
        return {"uri": Path(path).resolve().as_uri()}
    return {"uri": quote(rel), "uriBaseId": SRCROOT}


@dataclass(frozen=True)
class CellLine:
    """Where one line of a notebook cell sits in the .ipynb file."""

    file_line: int
    text_column: int | None  # file column of the line's first character; None: several lines share the string
    text: str = ""
    ascii_escaped: bool = False  # the file writes non-ASCII characters as \uXXXX

    def file_column(self, column: int) -> int | None:
        """The file column of the cell line's `column` (escapes such as \" take two columns)."""
        if self.text_column is None:
            return None
        prefix = json.dumps(self.text[: column - 1], ensure_ascii=self.ascii_escaped)
        return self.text_column + len(prefix) - 2


def notebook_line_index(raw: str) -> dict[tuple[int, int], CellLine]:
    """(code-cell number, line in cell) -> CellLine, for the layout nbformat writes.

    That layout is `"source": [` then one JSON string per line. Code cells count from 1 like
    the linter's cell numbers. Key (cell, None) holds the line where the cell's source starts:
    the place to point at when a cell is stored any other way (one string, a minified file).
    """
    try:
        cells = json.loads(raw).get("cells", [])
    except (json.JSONDecodeError, AttributeError, RecursionError):
        return {}
    file_lines = raw.splitlines()
    index: dict[tuple[int, int], CellLine] = {}
    cursor = 0  # file line (0-based) to search on from: cells appear in file order
    code_no = 0
    for cell in cells:
        if not isinstance(cell, dict):
            continue
        is_code = cell.get("cell_type") == "code"
        code_no += is_code
        source = cell.get("source")
        start = next((i for i in range(cursor, len(file_lines)) if '"source":' in file_lines[i]), None)
        if start is None:
            break
        if is_code:  # the fallback for lines not indexed below: the line where the cell's source starts
            index[(code_no, None)] = CellLine(start + 1, None)
        if not (isinstance(source, list) and all(isinstance(s, str) for s in source)
                and file_lines[start].strip() == '"source": ['):
            cursor = start + 1  # one string, or not nbformat's layout: only the fallback line
            continue
        cursor, inner, entries = start + 1, 0, {}
        if not is_code:  # markdown/raw cells: step over their source lines
            cursor += len(source)
            continue
        for piece in source:
            written = file_lines[cursor].strip().rstrip(",") if cursor < len(file_lines) else None
            if written not in (json.dumps(piece, ensure_ascii=False), json.dumps(piece, ensure_ascii=True)):
                entries = {}
                break
            ascii_escaped = written != json.dumps(piece, ensure_ascii=False)
            lines = piece.splitlines() or [""]
            column = file_lines[cursor].index('"') + 2 if len(lines) == 1 else None
            for text in lines:
                inner += 1
                entries[(code_no, inner)] = CellLine(cursor + 1, column, text, ascii_escaped)
            cursor += 1
        index.update(entries)
    return index


def _region(f: Finding, notebooks: dict[str, dict]) -> dict:
    loc = f.location
    if loc.line is None:
        return {"startLine": 1}
    if loc.cell is None:
        region = {"startLine": loc.line}
        if loc.column:
            region["startColumn"] = loc.column
        return region
    cells = notebooks.get(loc.path or "", {})
    where = cells.get((loc.cell, loc.line)) or cells.get((loc.cell, None))
    if where is None:  # code scanning needs a line: the file's first, the message names the cell
        return {"startLine": 1}
    region = {"startLine": where.file_line}
    column = where.file_column(loc.column) if loc.column else None
    if column:
        region["startColumn"] = column
    return region


def _notebook_indexes(report: LintReport) -> dict[str, dict]:
    out = {}
    for path in {f.location.path for f in report.findings if f.location.cell is not None}:
        try:
            out[path] = notebook_line_index(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, TypeError):
            out[path] = {}
    return out


def _fix(fix: Fix, where: dict) -> dict:
    """A SARIF fix: the finding's edits as replacements (columns in code points, end exclusive)."""
    replacements = [{"deletedRegion": {"startLine": e.line, "startColumn": e.column, "endLine": e.end_line,
                                       "endColumn": e.end_column},
                     "insertedContent": {"text": e.content}} for e in fix.edits]
    return {"description": {"text": fix.message}, "artifactChanges": [{"artifactLocation": where,
                                                                        "replacements": replacements}]}


def _result(f: Finding, index: dict[str, int], root: Path, notebooks: dict[str, dict], fix: Fix | None = None) -> dict:
    loc = f.location
    text = f"{f.message.rstrip('.')}. Fix: {f.suggestion}" if f.suggestion else f.message
    if loc.cell is not None:
        text += f" (cell {loc.cell}, line {loc.line})"
    physical = {"artifactLocation": artifact_location(loc.path, root), "region": _region(f, notebooks)}
    result = {
        "ruleId": f.rule,
        "level": LEVEL[f.severity.value],
        "message": {"text": text},
        "locations": [{"physicalLocation": physical}],
    }
    if f.rule in index:
        result["ruleIndex"] = index[f.rule]
    if loc.cell is not None:
        result["properties"] = {"cell": loc.cell, "cellLine": loc.line, "cellColumn": loc.column}
    elif fix is not None:  # a notebook's edits are in cell coordinates, which no SARIF region can hold
        result["fixes"] = [_fix(fix, physical["artifactLocation"])]
    return result


def _notification(error, root: Path) -> dict:
    physical: dict = {"artifactLocation": artifact_location(error.path, root)}
    if error.line and error.cell is None:
        physical["region"] = {"startLine": error.line}
    where = f" (cell {error.cell})" if error.cell is not None else ""
    return {"level": "error", "message": {"text": f"{error.path}{where}: {error.message}"},
            "locations": [{"physicalLocation": physical}]}


def to_sarif(report: LintReport, root: str | os.PathLike | None = None) -> dict:
    """The SARIF log as a dict: one run, the whole rule catalogue, one result per finding."""
    base = Path(root or os.getcwd()).resolve()
    rules = all_rules()
    index = {r.id: i for i, r in enumerate(rules)}
    notebooks = _notebook_indexes(report)
    return {
        "$schema": SCHEMA_URI,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": "amp-troubleshooter",
                "version": __version__,
                "semanticVersion": __version__,
                "informationUri": HOMEPAGE,
                "rules": [_rule_descriptor(r) for r in rules],
            }},
            "originalUriBaseIds": {SRCROOT: {"uri": base.as_uri() + "/"}},
            "columnKind": "unicodeCodePoints",  # columns count characters, as the linter's do
            "invocations": [{
                "executionSuccessful": not report.errors,
                "workingDirectory": {"uri": base.as_uri() + "/"},
                "toolExecutionNotifications": [_notification(e, base) for e in report.errors],
            }],
            "results": [_result(f, index, base, notebooks, report.fix_of(f)) for f in report.findings],
        }],
    }


def format_sarif(report: LintReport) -> str:
    return json.dumps(to_sarif(report), indent=2) + "\n"
