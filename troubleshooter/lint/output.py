"""Render a LintReport for people (text, concise), CI (GitHub annotations, GitLab code quality, JUnit,
SARIF) or tools (JSON, JSON lines), and count it by rule (`--statistics`).

`text` is the contract people and scripts already read: each finding's line, then its `fix:`
line. `full` is the same output under ruff's name; `concise` is one line per finding. A finding
whose fix `--fix` can make is marked `[*]` (at the end of its fix line in text, after the severity
in concise), and the summary says how many there are and where each rule's page is.
"""
from __future__ import annotations

import json

from ..findings import Finding
from .docs import rule_url
from .engine import LintReport

FIXABLE_MARK = "[*]"

_GH_LEVEL = {"error": "error", "warning": "warning", "info": "notice"}


def _where(f: Finding) -> str:
    loc = f.location
    if loc.cell is not None:
        return f"{loc.path}:cell {loc.cell}:{loc.line}:{loc.column}"
    return f"{loc.path}:{loc.line}:{loc.column}"


def _error_lines(report: LintReport) -> list[str]:
    out = []
    for e in report.errors:
        where = e.path + (f":cell {e.cell}" if e.cell is not None else "") + (f":{e.line}" if e.line else "")
        out.append(f"{where}: error: {e.message}")
    out += [f"note: {note}" for note in report.notes]
    return out


def _summary(report: LintReport) -> list[str]:
    counts = {s: sum(1 for f in report.findings if f.severity.value == s) for s in ("error", "warning", "info")}
    n = len(report.findings)
    if n:
        summary = f"Found {n} problem{'s' if n != 1 else ''} ({counts['error']} error{'s' if counts['error'] != 1 else ''}, " \
                  f"{counts['warning']} warning{'s' if counts['warning'] != 1 else ''}, {counts['info']} info)"
    else:
        summary = "No mixed-precision problems found"
    if report.errors:
        summary += f"; {len(report.errors)} input{'s' if len(report.errors) != 1 else ''} could not be linted"
    out = [summary + "."]
    fixable = sum(1 for f in report.findings if report.fix_of(f))
    if fixable:
        out.append(f"{FIXABLE_MARK} {fixable} fixable with --fix (--diff shows the change first).")
    return out


def format_text(report: LintReport) -> str:
    out = []
    for f in report.findings:
        out.append(f"{_where(f)}: {f.rule} [{f.severity.value}] {f.message}")
        out.append(f"    fix: {f.suggestion}" + (f" {FIXABLE_MARK}" if report.fix_of(f) else ""))
    out += _error_lines(report)
    out += _summary(report)
    if report.findings:
        rules = {f.rule: f.name for f in report.findings}
        out.append("Rule docs:")
        out += [f"  {rule} {name}: {rule_url(rule)}" for rule, name in sorted(rules.items())]
        out.append("Explain a rule: python -m troubleshooter rules AMPnnn")
    return "\n".join(out) + "\n"


def format_concise(report: LintReport) -> str:
    """One line per finding (ruff's concise), then input errors, notes and the summary."""
    out = [f"{_where(f)}: {f.rule} [{f.severity.value}]{' ' + FIXABLE_MARK if report.fix_of(f) else ''} {f.message}"
           for f in report.findings]
    return "\n".join(out + _error_lines(report) + _summary(report)) + "\n"


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


def format_json_lines(report: LintReport) -> str:
    """One JSON object per line: a finding (as in `json`, with `rule`), an input that could not be
    linted (`"error": true`), or a note (`note`)."""
    lines = [report.finding_dict(f) for f in report.findings]
    lines += [{**e.to_dict(), "error": True} for e in report.errors]
    lines += [{"note": note} for note in report.notes]
    return "".join(json.dumps(item, default=str) + "\n" for item in lines)


def statistics(report: LintReport) -> list[dict]:
    """Findings counted per rule, most frequent first (ruff's --statistics)."""
    by_rule: dict[str, dict] = {}
    for f in report.findings:
        row = by_rule.setdefault(f.rule, {"code": f.rule, "name": f.name, "severity": f.severity.value,
                                          "count": 0, "fixable": False})
        row["count"] += 1
        row["fixable"] = row["fixable"] or report.fix_of(f) is not None
    return sorted(by_rule.values(), key=lambda r: (-r["count"], r["code"]))


def format_statistics(report: LintReport, as_json: bool = False) -> str:
    rows = statistics(report)
    if as_json:
        return json.dumps(rows, indent=2) + "\n"
    width = max((len(str(r["count"])) for r in rows), default=1)
    out = [f"{r['count']:>{width}}\t{r['code']}\t{FIXABLE_MARK if r['fixable'] else '[ ]'}\t{r['name']} ({r['severity']})"
           for r in rows]
    out += _error_lines(report)
    if not rows:
        out.append("No mixed-precision problems found.")
    return "\n".join(out) + "\n"


def format_sarif(report: LintReport) -> str:
    from .sarif import format_sarif as fmt  # the CI formats load on use: `lint FILE` need not import xml

    return fmt(report)


def format_gitlab(report: LintReport) -> str:
    from .gitlab import format_gitlab as fmt

    return fmt(report)


def format_junit(report: LintReport) -> str:
    from .junit import format_junit as fmt

    return fmt(report)


FORMATS = {"text": format_text, "full": format_text, "concise": format_concise, "github": format_github,
           "json": format_json, "json-lines": format_json_lines, "sarif": format_sarif, "gitlab": format_gitlab,
           "junit": format_junit}
