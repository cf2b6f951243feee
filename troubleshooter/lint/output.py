"""Render a LintReport for people (ruff-like text), CI (GitHub annotations) or tools (JSON)."""
from __future__ import annotations

import json

from ..findings import Finding
from .engine import LintReport
from .sarif import format_sarif

_GH_LEVEL = {"error": "error", "warning": "warning", "info": "notice"}


def _where(f: Finding) -> str:
    loc = f.location
    if loc.cell is not None:
        return f"{loc.path}:cell {loc.cell}:{loc.line}:{loc.column}"
    return f"{loc.path}:{loc.line}:{loc.column}"


def format_text(report: LintReport) -> str:
    out = []
    for f in report.findings:
        out.append(f"{_where(f)}: {f.rule} [{f.severity.value}] {f.message}")
        out.append(f"    fix: {f.suggestion}")
    for e in report.errors:
        where = e.path + (f":cell {e.cell}" if e.cell is not None else "") + (f":{e.line}" if e.line else "")
        out.append(f"{where}: error: {e.message}")
    for note in report.notes:
        out.append(f"note: {note}")
    counts = {s: sum(1 for f in report.findings if f.severity.value == s) for s in ("error", "warning", "info")}
    n = len(report.findings)
    if n:
        summary = f"Found {n} problem{'s' if n != 1 else ''} ({counts['error']} error{'s' if counts['error'] != 1 else ''}, " \
                  f"{counts['warning']} warning{'s' if counts['warning'] != 1 else ''}, {counts['info']} info)"
    else:
        summary = "No mixed-precision problems found"
    if report.errors:
        summary += f"; {len(report.errors)} input{'s' if len(report.errors) != 1 else ''} could not be linted"
    out.append(summary + ".")
    if n:
        out.append("Explain a rule: python -m troubleshooter rules AMPnnn")
    return "\n".join(out) + "\n"


def _gh_escape(value: str, prop: bool = False) -> str:
    value = value.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    if prop:
        value = value.replace(":", "%3A").replace(",", "%2C")
    return value


def format_github(report: LintReport) -> str:
    out = []
    for f in report.findings:
        loc = f.location
        line, col = loc.line, loc.column
        if loc.cell is not None:  # GitHub places annotations on the raw .ipynb lines
            line = report.notebook_lines.get((loc.path, loc.cell, loc.line), 1)
            col = None
        where = f"line={line}" + (f",col={col}" if col else "")
        props = f"file={_gh_escape(loc.path or '', True)},{where},title={_gh_escape(f'{f.rule} {f.name}', True)}"
        cell = f" (code cell {loc.cell}, line {loc.line})" if loc.cell is not None else ""
        out.append(f"::{_GH_LEVEL[f.severity.value]} {props}::{_gh_escape(f.message + cell + '. Fix: ' + f.suggestion)}")
    for e in report.errors:
        props = f"file={_gh_escape(e.path, True)}" + (f",line={e.line}" if e.line and e.cell is None else "")
        cell = f" (code cell {e.cell}, line {e.line})" if e.cell is not None else ""
        out.append(f"::error {props},title=lint input error::{_gh_escape(e.message + cell)}")
    for note in report.notes:
        out.append(f"::notice title=lint note::{_gh_escape(note)}")
    return "\n".join(out) + ("\n" if out else "")


def format_json(report: LintReport) -> str:
    return json.dumps(report.to_dict(), indent=2, default=str) + "\n"


FORMATS = {"text": format_text, "github": format_github, "json": format_json, "sarif": format_sarif}
