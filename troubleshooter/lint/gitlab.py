"""Render a LintReport as a GitLab code quality report (`artifacts: reports: codequality:`).

GitLab reads a JSON array of issues with `description`, `check_name`, `fingerprint`, `severity`
(info, minor, major, critical, blocker), `location.path` (relative to the repository) and
`location.lines.begin`; other Code Climate fields are ignored. Issues with the same fingerprint are
shown once, so the fingerprint names the rule, the file and the message (line numbers left out, so
an issue keeps its identity when code above it moves) plus a counter for repeats.
Severities: error -> critical, warning -> major, info -> info; an input that could not be linted
is a `blocker` issue named `input-error`. A notebook finding is placed on the .ipynb line that
holds its cell's source line, as with `--format github`.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from .engine import LintReport
from .sarif import relative_path

SEVERITY = {"error": "critical", "warning": "major", "info": "info"}
_LINE_REF = re.compile(r"\b(line|lines|cell) \d+")


def _path(path: str | None, root: Path) -> str:
    if not path or path == "-":
        return path or "-"
    return relative_path(path, root) or path


def _fingerprint(parts: tuple, seen: dict[tuple, int]) -> str:
    seen[parts] = seen.get(parts, 0) + 1
    digest = hashlib.sha256("\0".join(map(str, (*parts, seen[parts]))).encode("utf-8"))
    return digest.hexdigest()[:32]


def to_gitlab(report: LintReport, root: str | os.PathLike | None = None) -> list[dict]:
    base = Path(root or os.getcwd()).resolve()
    seen: dict[tuple, int] = {}
    issues = []
    for f in report.findings:
        loc = f.location
        line = loc.line or 1
        if loc.cell is not None:
            line = report.notebook_lines.get((loc.path, loc.cell, loc.line), 1)
        cell = f" (cell {loc.cell}, line {loc.line})" if loc.cell is not None else ""
        path = _path(loc.path, base)
        issues.append({
            "type": "issue",
            "description": f"{f.rule} {f.message}{cell}. Fix: {f.suggestion}",
            "check_name": f"{f.rule} {f.name}",
            "fingerprint": _fingerprint((f.rule, path, loc.cell, _LINE_REF.sub(r"\1 N", f.message)), seen),
            "severity": SEVERITY[f.severity.value],
            "location": {"path": path, "lines": {"begin": line}},
        })
    for e in report.errors:
        path = _path(e.path, base)
        where = f" (cell {e.cell})" if e.cell is not None else ""
        issues.append({
            "type": "issue",
            "description": f"could not lint{where}: {e.message}",
            "check_name": "input-error",
            "fingerprint": _fingerprint(("input-error", path, e.cell, e.message), seen),
            "severity": "blocker",
            "location": {"path": path, "lines": {"begin": e.line if e.line and e.cell is None else 1}},
        })
    return issues


def format_gitlab(report: LintReport) -> str:
    return json.dumps(to_gitlab(report), indent=2) + "\n"
