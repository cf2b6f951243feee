"""A document's findings as LSP diagnostics and its safe fixes as code actions (pure: no server state).

The document is linted as `lint` lints a file at its path: the nearest pyproject.toml's
`[tool.amp-troubleshooter]` settings apply (select, ignore, per-file-ignores, exclude), so the editor
shows what the command line reports. Positions go out in the unit the client negotiated (UTF-16 by
default), counted on the lines as Python splits them.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from urllib.parse import unquote, urlparse

from lsprotocol import types as lsp

from ..findings import Finding
from ..lint.docs import rule_url
from ..lint.edits import Edit, Fix, compatible_fixes, split_lines
from ..lint.engine import LintReport, active_rules, lint_unit
from ..lint.noqa import noqa_edits
from ..lint.source import SourceUnit

SOURCE = "amp-troubleshooter"
SEVERITY = {"error": lsp.DiagnosticSeverity.Error, "warning": lsp.DiagnosticSeverity.Warning,
            "info": lsp.DiagnosticSeverity.Information}
FIX_ALL = f"{lsp.CodeActionKind.SourceFixAll.value}.{SOURCE}"


def path_of(uri: str) -> str:
    """A file URI's path (what per-file-ignores match); other schemes keep the URI as the name."""
    parsed = urlparse(uri)
    return unquote(parsed.path) if parsed.scheme == "file" else uri


@dataclass
class Linted:
    """One document version's findings, fixes and lines, kept for its code actions."""

    text: str
    report: LintReport
    lines: list[str] = field(default_factory=list)


def lint_document(uri: str, text: str) -> Linted:
    from ..lint.config import load_config

    path = path_of(uri)
    if path.endswith(".ipynb"):  # editors send notebooks cell by cell, not as this JSON
        return Linted(text, LintReport(), split_lines(text))
    config = load_config(start=os.path.dirname(path) or None)
    ignore = config.ignore
    if config.ignored_for(path):
        ignore = [*(ignore or []), *config.ignored_for(path)]
    report = LintReport() if config.is_excluded(path) else lint_unit(
        SourceUnit(path=path, text=text), active_rules(config.select, ignore))
    return Linted(text, report, split_lines(text))


def _position(lines: list[str], line: int, column: int, units) -> lsp.Position:
    """A 1-based (line, code-point column) as an LSP position in the client's units."""
    text = lines[line - 1] if 0 < line <= len(lines) else ""
    return lsp.Position(line=max(line - 1, 0), character=units(text[: column - 1]))


def _range(lines: list[str], e: Edit, units) -> lsp.Range:
    return lsp.Range(start=_position(lines, e.line, e.column, units), end=_position(lines, e.end_line, e.end_column, units))


def diagnostic(f: Finding, linted: Linted, units) -> lsp.Diagnostic:
    line = f.location.line or 1
    text = linted.lines[line - 1].rstrip("\r\n") if 0 < line <= len(linted.lines) else ""
    start = _position(linted.lines, line, f.location.column or 1, units)
    end = lsp.Position(line=start.line, character=max(units(text.rstrip()), start.character))
    fix = linted.report.fix_of(f)
    return lsp.Diagnostic(
        range=lsp.Range(start=start, end=end), message=f"{f.message}\nfix: {f.suggestion}",
        severity=SEVERITY[f.severity.value], code=f.rule, source=SOURCE,
        code_description=lsp.CodeDescription(href=rule_url(f.rule)),
        data={"rule": f.rule, "line": line, "fix": fix.to_dict() if fix else None})


def diagnostics(linted: Linted, units) -> list[lsp.Diagnostic]:
    return [diagnostic(f, linted, units) for f in linted.report.findings]


def _edit(uri: str, linted: Linted, edits, units) -> lsp.WorkspaceEdit:
    return lsp.WorkspaceEdit(changes={uri: [lsp.TextEdit(range=_range(linted.lines, e, units), new_text=e.content)
                                            for e in edits]})


def code_actions(uri: str, linted: Linted, wanted: list[lsp.Diagnostic], units,
                 only: list[str] | None = None) -> list[lsp.CodeAction]:
    """Quick fixes for the diagnostics asked about (their safe fix; a `# noqa` for their line), and
    one action that makes every safe fix of the document that fits with the others."""
    actions: list[lsp.CodeAction] = []
    quick = not only or any(k.startswith(lsp.CodeActionKind.QuickFix.value) for k in only)
    for d in wanted if quick else []:
        data = d.data if isinstance(d.data, dict) else {}
        if d.source != SOURCE or not data.get("rule"):
            continue
        if data.get("fix"):
            fix = Fix.from_dict(data["fix"])
            actions.append(lsp.CodeAction(title=f"{data['rule']}: {fix.message}", kind=lsp.CodeActionKind.QuickFix,
                                          diagnostics=[d], is_preferred=True, edit=_edit(uri, linted, fix.edits, units)))
        noqa, _ = noqa_edits(linted.text, {data["line"]: {data["rule"]}})
        if noqa:
            actions.append(lsp.CodeAction(title=f"{data['rule']}: silence on this line (# noqa)",
                                          kind=lsp.CodeActionKind.QuickFix, diagnostics=[d],
                                          edit=_edit(uri, linted, noqa, units)))
    fixes = [linted.report.fix_of(f) for f in linted.report.findings if linted.report.fix_of(f)]
    if fixes and (not only or any(FIX_ALL.startswith(k) or k == lsp.CodeActionKind.Source.value for k in only)):
        chosen = compatible_fixes(fixes)
        actions.append(lsp.CodeAction(title=f"{SOURCE}: apply {len(chosen)} safe fix{'es' if len(chosen) != 1 else ''}",
                                      kind=FIX_ALL, edit=_edit(uri, linted, [e for f in chosen for e in f.edits], units)))
    return actions
