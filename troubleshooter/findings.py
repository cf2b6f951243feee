"""The one result type shared by the linter and the diagnostics engine.

Every capability reports `Finding`s so the CLI, the JSON API and the app render them the
same way, and a rule id means the same thing wherever it appears.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Iterable


class Severity(str, Enum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"

    @property
    def rank(self) -> int:
        """Higher is worse; used for sorting and exit codes."""
        return {"info": 0, "warning": 1, "error": 2}[self.value]

    @classmethod
    def parse(cls, value: "str | Severity") -> "Severity":
        if isinstance(value, Severity):
            return value
        try:
            return cls(str(value).lower())
        except ValueError:
            raise ValueError(f"unknown severity {value!r}: use error, warning or info") from None


@dataclass(frozen=True)
class Location:
    """Where a finding points: a source position (lint) or a module path (engine)."""

    path: str | None = None
    line: int | None = None
    column: int | None = None
    cell: int | None = None  # notebook code-cell number (1-based) when linting .ipynb
    module: str | None = None  # name from model.named_modules() for engine findings

    def describe(self) -> str:
        """Human form: `train.py:12:5`, `nb.ipynb [cell 3] 4:1`, `module 'layers.0'`."""
        text = self.path or ""
        if self.cell is not None:
            text += f" [cell {self.cell}]"
        if self.line is not None:
            pos = f"{self.line}" + (f":{self.column}" if self.column is not None else "")
            text += f" {pos}" if self.cell is not None else (f":{pos}" if text else f"line {pos}")
        if self.module is not None:
            mod = f"module '{self.module or '<root>'}'"
            text = f"{text} {mod}" if text else mod
        return text


@dataclass(frozen=True)
class Finding:
    """One problem, from any part of the tool (lint, check, trace, inspect): the one shape every
    report, the page and SARIF read."""

    rule: str  # AMPnnn
    name: str  # short kebab-case name, e.g. clip-before-unscale
    severity: Severity
    message: str  # what is wrong, one line
    suggestion: str  # the fix
    location: Location = field(default_factory=Location)
    precision: str | None = None  # fp16 / bf16 / fp32 for engine findings measured in one precision
    data: dict[str, Any] = field(default_factory=dict)  # measured numbers behind the finding

    def __post_init__(self) -> None:
        object.__setattr__(self, "severity", Severity.parse(self.severity))

    def to_dict(self) -> dict[str, Any]:
        """Flat JSON shape: the keys the lint and check contracts name, plus the optional ones."""
        loc = self.location
        return {
            "path": loc.path,
            "line": loc.line,
            "column": loc.column,
            "cell": loc.cell,
            "module": loc.module,
            "rule": self.rule,
            "name": self.name,
            "severity": self.severity.value,
            "message": self.message,
            "suggestion": self.suggestion,
            "precision": self.precision,
            "data": self.data,
        }

    def text_line(self) -> str:
        """One line for terminal reports: `warning AMP207 bf16-unsupported: message -> fix`."""
        return f"{self.severity.value} {self.rule} {self.name}: {self.message} -> {self.suggestion}"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Finding":
        return cls(
            rule=d["rule"],
            name=d.get("name", ""),
            severity=Severity.parse(d["severity"]),
            message=d.get("message", ""),
            suggestion=d.get("suggestion", ""),
            location=Location(
                path=d.get("path"), line=d.get("line"), column=d.get("column"),
                cell=d.get("cell"), module=d.get("module"),
            ),
            precision=d.get("precision"),
            data=dict(d.get("data") or {}),
        )


def sort_key(f: Finding) -> tuple:
    loc = f.location
    return (loc.path or "", loc.cell or 0, loc.line or 0, loc.column or 0, loc.module or "", f.rule)


def severity_key(f: Finding) -> tuple:
    """Worst first, then by place: the order people read findings in (the page's table, the
    Markdown report), so one error is never buried under hints. Terminal output keeps `sort_key`
    (file and line, as ruff and flake8 print)."""
    return (-f.severity.rank, *sort_key(f))


def worst_severity(findings: Iterable[Finding]) -> Severity | None:
    worst = None
    for f in findings:
        if worst is None or f.severity.rank > worst.rank:
            worst = f.severity
    return worst


def has_problems(findings: Iterable[Finding]) -> bool:
    """True when something of severity warning or error was found (exit status 1)."""
    worst = worst_severity(findings)
    return worst is not None and worst.rank >= Severity.WARNING.rank


def findings_to_json(findings: Iterable[Finding], **extra: Any) -> str:
    payload = {"findings": [f.to_dict() for f in findings], **extra}
    return json.dumps(payload, indent=2, default=str)


_ICON = {Severity.ERROR: "🛑 error", Severity.WARNING: "⚠️ warning", Severity.INFO: "ℹ️ info"}


def _md_cell(text: Any) -> str:
    return str(text if text is not None else "").replace("|", "\\|").replace("\n", " ")


def findings_to_markdown(findings: Iterable[Finding], title: str | None = None) -> str:
    """A Markdown table for the UI and for the downloadable report."""
    findings = sorted(findings, key=severity_key)
    lines = [f"## {title}", ""] if title else []
    if not findings:
        lines.append("No findings.")
        return "\n".join(lines) + "\n"
    counts = {s: sum(1 for f in findings if f.severity is s) for s in Severity}
    lines.append(", ".join(f"{n} {s.value}{'s' if n != 1 else ''}" for s, n in counts.items() if n))
    lines += ["", "| severity | rule | where | message | fix |", "| --- | --- | --- | --- | --- |"]
    for f in findings:
        where = f.location.describe()
        if f.precision:
            where = f"{where} ({f.precision})" if where else f.precision
        lines.append(
            f"| {_ICON[f.severity]} | `{f.rule}` {_md_cell(f.name)} | {_md_cell(where)} "
            f"| {_md_cell(f.message)} | {_md_cell(f.suggestion)} |"
        )
    return "\n".join(lines) + "\n"
