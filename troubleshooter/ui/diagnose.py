"""Diagnose tab: lint an uploaded or pasted script, explain rules, offer the report and fixes."""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import UserError
from ..findings import Finding, findings_to_markdown
from . import common
from .server import SETTINGS

SCRIPT_KINDS = (".py", ".ipynb")
TABLE_HEADERS = ["severity", "rule", "line", "code", "message", "fix"]
_ICON = {"error": "ERROR", "warning": "warning", "info": "info"}  # plain words: no emoji font needed


def _lint():
    from .. import lint

    return lint


def read_script(code: str | None, upload) -> tuple[str, str]:
    """(text, name) from the upload if there is one, else from the editor."""
    path = common.upload_path(upload)
    if path:
        text = common.read_text_upload(path, SETTINGS.max_file_bytes, SCRIPT_KINDS, "a Python script or notebook")
        if not text.strip():
            raise UserError(f"{common.display_name(path)} is empty: nothing to diagnose")
        return text, common.display_name(path)
    text = common.check_text_size(code, SETTINGS.max_file_bytes, "the pasted code")
    if not text.strip():
        raise UserError("nothing to diagnose: paste a training script or upload a .py/.ipynb file")
    return text, "pasted.py"


def _source_lines(text: str, name: str) -> dict[int | None, list[str]]:
    """Lines per notebook cell (key = 1-based code-cell number) or of the script (key None)."""
    if not name.lower().endswith(".ipynb"):
        return {None: text.splitlines()}
    try:
        nb = json.loads(text)
        cells = [c for c in nb.get("cells", []) if c.get("cell_type") == "code"]
    except (ValueError, AttributeError):
        return {}
    out = {}
    for i, cell in enumerate(cells, 1):
        src = cell.get("source", "")
        src = "".join(src) if isinstance(src, list) else str(src)
        out[i] = src.splitlines()
    return out


def offending_line(lines: dict, finding: Finding) -> str:
    loc = finding.location
    block = lines.get(loc.cell if loc.cell is not None else None) or lines.get(None) or []
    if loc.line and 1 <= loc.line <= len(block):
        return block[loc.line - 1].strip()
    return ""


def findings_rows(findings: list[Finding], text: str, name: str) -> list[list]:
    lines = _source_lines(text, name)
    rows = []
    for f in sorted(findings, key=lambda f: (f.location.cell or 0, f.location.line or 0, f.rule)):
        where = f.location.line if f.location.line is not None else ""
        if f.location.cell is not None:
            where = f"cell {f.location.cell}, line {where}"
        rows.append([_ICON.get(f.severity.value, f.severity.value), f"{f.rule} {f.name}".strip(),
                     str(where), offending_line(lines, f), f.message, f.suggestion])
    return rows


def _errors_text(errors: list) -> list[str]:
    out = []
    for e in errors:
        get = (lambda k: e.get(k)) if isinstance(e, dict) else (lambda k: getattr(e, k, None))
        line = get("line")
        out.append(f"{get('path') or ''}{f' line {line}' if line else ''}: {get('message')}".strip(": "))
    return out


def report_markdown(findings: list[Finding], errors: list, name: str) -> str:
    md = findings_to_markdown(findings, title=f"AMP Troubleshooter: {name}")
    if errors:
        md += "\n### Could not analyse\n\n" + "\n".join(f"- {e}" for e in _errors_text(errors)) + "\n"
    return md


def lint_script(code: str | None, upload, select: str | None = None, ignore: str | None = None) -> dict:
    """Lint the input; everything the tab and the `lint` API show, as plain values.
    `select`/`ignore`: comma-separated rule ids or prefixes, as `lint --select/--ignore`."""
    text, name = read_script(code, upload)
    lint = _lint()
    report = lint.lint_text(text, path=name, select=(select or "").strip() or None,
                            ignore=(ignore or "").strip() or None)
    findings = list(report.findings)
    errors = list(report.errors)
    payload = report.to_dict()
    md = report_markdown(findings, errors, name)
    stem = Path(name).stem or "script"
    result = {
        "name": name,
        "report": payload,
        "rows": findings_rows(findings, text, name),
        "markdown": md,
        "errors": _errors_text(errors),
        "summary": summary_line(findings, errors, name),
        "md_path": common.write_download(f"{stem}_amp_report.md", md),
        "json_path": common.write_download(f"{stem}_amp_report.json", json.dumps(payload, indent=2, default=str)),
        "fixed_text": None, "diff": None, "fixed_path": None, "diff_path": None, "applied": [],
        "rules_found": sorted({f.rule for f in findings}),
    }
    fix = getattr(lint, "fix_text", None)
    if fix is not None and not name.lower().endswith(".ipynb"):
        fixed = fix(text, path=name)
        applied = list(getattr(fixed, "applied", []) or [])
        if applied and fixed.fixed_text != text:
            result.update(
                fixed_text=fixed.fixed_text, diff=fixed.diff, applied=[_describe_fix(a) for a in applied],
                fixed_path=common.write_download(f"{stem}_amp_fixed.py", fixed.fixed_text),
                diff_path=common.write_download(f"{stem}_amp_fixes.diff", fixed.diff or ""),
            )
    return result


def _describe_fix(applied) -> str:
    """`AMP106 line 4` for an applied fix (a Finding), or its text for anything else."""
    if isinstance(applied, Finding):
        line = applied.location.line
        return f"{applied.rule} line {line}" if line else applied.rule
    return str(applied)


def summary_line(findings: list[Finding], errors: list, name: str) -> str:
    counts = {}
    for f in findings:
        counts[f.severity.value] = counts.get(f.severity.value, 0) + 1
    if not findings and not errors:
        return f"**{name}**: no mixed-precision problems found."
    parts = [f"{counts[s]} {s}{'s' if counts[s] != 1 else ''}" for s in ("error", "warning", "info") if counts.get(s)]
    text = f"**{name}**: " + (", ".join(parts) if parts else "no findings")
    if errors:
        text += "\n\n" + common.error_markdown("could not analyse all of it:\n" + "\n".join(_errors_text(errors)))
    return text


def rule_of_row(row) -> str | None:
    """The rule id in a findings-table row (its `rule` column reads `AMP101 clip-before-unscale`)."""
    if not row or len(row) < 2:
        return None
    head = str(row[1]).split()
    return head[0] if head and head[0].upper().startswith("AMP") else None


def rule_choices() -> list[tuple[str, str]]:
    return [(f"{r.id} {r.name}", r.id) for r in _lint().all_rules()]


def rules_table() -> list[dict]:
    """Every rule as a JSON-able dict (the `rules` API)."""
    out = []
    for r in _lint().all_rules():
        out.append({k: getattr(r, k, None) for k in
                    ("id", "name", "severity", "summary", "why", "fix", "example_bad", "example_good")})
        sev = out[-1]["severity"]
        out[-1]["severity"] = getattr(sev, "value", sev)
    return out


def explain(rule_id: str | None) -> str:
    rule_id = (rule_id or "").strip().upper()
    if not rule_id:
        return "Pick a rule to see why it matters and how to fix it."
    lint = _lint()
    try:
        return lint.explain_rule(rule_id)
    except (KeyError, LookupError, ValueError):
        known = ", ".join(r.id for r in lint.all_rules())
        raise UserError(f"unknown rule {rule_id!r}; known rules: {known}") from None


def ui_lint(code: str | None, upload) -> tuple:
    """The Diagnose button: (status, rows, report.md, report.json, rule to explain,
    fix note, corrected code, diff, corrected file, diff file)."""
    r = lint_script(code, upload)
    first_rule = r["rules_found"][0] if r["rules_found"] else None
    if r["fixed_text"] is not None:
        note = (f"**{len(r['applied'])} mechanical fix{'es' if len(r['applied']) != 1 else ''} applied** "
                f"({', '.join(r['applied'])}); the other findings need a human. Review the diff.")
    else:
        note = "No mechanical fix applies; follow the **fix** column by hand."
    return (r["summary"], r["rows"], r["md_path"], r["json_path"], first_rule,
            note, r["fixed_text"], r["diff"], r["fixed_path"], r["diff_path"])
