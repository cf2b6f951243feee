"""Diagnose tab: lint an uploaded or pasted script, explain rules, offer the report and fixes."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from ..findings import Finding, findings_to_markdown, severity_key
from . import common
from .server import SETTINGS

SCRIPT_KINDS = (".py", ".ipynb")
TABLE_HEADERS = ["severity", "rule", "line", "code", "message", "fix"]
_ICON = {"error": "ERROR", "warning": "warning", "info": "info"}  # plain words: no emoji font needed


def _lint():
    from .. import lint

    return lint


@dataclass
class ScriptInput:
    """What the user handed the Diagnose tab, read by the linter's own source reader."""

    unit: object  # lint.source.SourceUnit: decoded text (+ notebook cell map)
    name: str
    encoding: str = "utf-8"  # the upload's declared encoding: the corrected file is written in it
    note: str = ""  # said above the findings (e.g. the pasted code was ignored)


def _lint_source():
    from ..lint import source

    return source


def upload_bytes(upload) -> tuple[bytes | None, str | None]:
    """In the server: the uploaded script's bytes and the name the user gave it (None, None when
    nothing was uploaded). Only a file the caller uploaded, of a script kind, and no bigger than
    the linter reads (refused before it is read)."""
    path = common.upload_path(upload)
    if not path:
        return None, None
    name = common.display_name(path)
    suffix = Path(name).suffix.lower()
    if suffix not in SCRIPT_KINDS:
        raise UserError(f"{name}: expected a Python script or notebook (.py, .ipynb), "
                        f"got a '{suffix or 'no extension'}' file")
    limit = _lint_source().MAX_BYTES
    size = common.check_size(path, SETTINGS.max_file_bytes)
    if size > limit:
        raise UserError(f"{name}: file is {size / 1e6:.1f} MB; the linter reads files up to "
                        f"{limit // (1024 * 1024)} MB (split it, or lint the training script itself)")
    return common.read_upload_bytes(path), name


def input_name(code: str | None, upload) -> str:
    """What the user will see results for: the uploaded file's name, else the pasted code's."""
    path = common.upload_path(upload)
    return common.display_name(path) if path else "pasted.py"


def read_script(code: str | None, data: bytes | None, name: str | None) -> ScriptInput:
    """The upload's bytes if there are any, else the pasted code, through `lint.source` exactly as
    the CLI reads files: PEP 263 coding lines, its 2 MB limit, notebooks as one unit of code cells."""
    src = _lint_source()
    if data is not None:
        try:
            unit = src.unit_from_bytes(data, name)
        except ValueError as exc:
            raise UserError(f"{name}: {exc}") from None
        note = ""
        if (code or "").strip():
            note = (f"Diagnosed the uploaded file **{name}**; the pasted code was not read "
                    "(remove the upload to diagnose the pasted code).")
        return ScriptInput(unit, name, _declared_encoding(data), note)
    text = code or ""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > src.MAX_BYTES:
        raise UserError(f"the pasted code is {size / 1e6:.1f} MB; the linter reads scripts up to "
                        f"{src.MAX_BYTES // (1024 * 1024)} MB (paste the training script itself)")
    if not text.strip():
        raise UserError("nothing to diagnose: paste a training script or upload a .py/.ipynb file")
    return ScriptInput(src.SourceUnit(path="pasted.py", text=text), "pasted.py")


def _declared_encoding(data: bytes) -> str:
    import io
    import tokenize

    try:
        return tokenize.detect_encoding(io.BytesIO(data).readline)[0]
    except SyntaxError:
        return "utf-8"


def offending_line(unit, finding: Finding) -> str:
    """The source line a finding points at (a notebook's cell line, mapped back into the unit)."""
    loc = finding.location
    line = loc.line
    if loc.cell is not None and unit.cell_map:
        line = next((n for n, (c, j) in unit.cell_map.items() if c == loc.cell and j == loc.line), None)
    lines = unit.text.splitlines()
    if line and 1 <= line <= len(lines):
        return lines[line - 1].strip()
    return ""


def ordered(findings: list[Finding]) -> list[Finding]:
    """Findings in table order, worst first, then by line (as the Markdown report): row i is
    `ordered(findings)[i]`, so the one error is never below the hints."""
    return sorted(findings, key=severity_key)


def findings_rows(findings: list[Finding], unit) -> list[list]:
    rows = []
    for f in ordered(findings):
        where = f.location.line if f.location.line is not None else ""
        if f.location.cell is not None:
            where = f"cell {f.location.cell}, line {where}"
        rows.append([_ICON.get(f.severity.value, f.severity.value), f"{f.rule} {f.name}".strip(),
                     str(where), offending_line(unit, f), f.message, f.suggestion])
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


LINT_TIMEOUT_S = 120.0  # a 2 MB script lints in seconds; beyond this a lint is stuck
LINT_SLOTS = max(2, min(4, (os.cpu_count() or 2) // 2))  # lints at once, each in its own process
LINT_PRELOAD = ("troubleshooter.lint.engine", "troubleshooter.lint.fix")
_lint_pool = None


def lint_script(code: str | None, upload, select: str | None = None, ignore: str | None = None) -> dict:
    """Lint the input; everything the tab and the `lint` API show, as plain values.
    `select`/`ignore`: comma-separated rule ids or prefixes, as `lint --select/--ignore`.

    The server reads the upload (it alone may look in the upload folder); the linting itself runs
    in a worker process of its own (`analyse`), so a hostile or huge script costs that process,
    not the server: many lints at once neither stall the page (the parser holds the interpreter
    lock) nor share CPython's AST-converter state, and each ends within LINT_TIMEOUT_S."""
    data, name = upload_bytes(upload)
    result = _lint_in_worker(code, data, name, select, ignore)
    stem = Path(result["name"]).stem or "script"
    result["md_path"] = common.write_download(f"{stem}_amp_report.md", result["markdown"])
    result["json_path"] = common.write_download(f"{stem}_amp_report.json",
                                                json.dumps(result["report"], indent=2, default=str))
    fixed_file = result.pop("fixed_file", None)  # the corrected script in its declared encoding
    if fixed_file is not None:
        result["fixed_path"] = common.write_download(f"{stem}_amp_fixed.py", fixed_file)
        result["diff_path"] = common.write_download(f"{stem}_amp_fixes.diff", result["diff"] or "")
    return result


def _lint_in_worker(code, data, name, select, ignore) -> dict:
    from ..worker import WarmPool

    global _lint_pool
    if _lint_pool is None:
        _lint_pool = WarmPool(preload=LINT_PRELOAD)
    return _lint_pool.run("lint", analyse, code, data, name, select, ignore, timeout_s=LINT_TIMEOUT_S)


def prepare_lint_worker() -> None:
    """Start the lint standby now (the app calls this at start), so the first lint starts warm."""
    from ..worker import WarmPool

    global _lint_pool
    if _lint_pool is None:
        _lint_pool = WarmPool(preload=LINT_PRELOAD)
    _lint_pool.prepare("lint")


def analyse(code: str | None, data: bytes | None, name: str | None, select: str | None = None,
            ignore: str | None = None) -> dict:
    """Runs in the lint worker: read, lint and fix; the result, without the download files (the
    server writes those)."""
    from ..lint.engine import active_rules, lint_unit
    from ..lint.fix import apply_fixes

    script = read_script(code, data, name)
    name, unit = script.name, script.unit
    report = lint_unit(unit, active_rules((select or "").strip() or None, (ignore or "").strip() or None))
    findings = ordered(report.findings)
    errors = list(report.errors)
    payload = report.to_dict()
    md = report_markdown(findings, errors, name)
    notebook = name.lower().endswith(".ipynb")
    result = {
        "name": name,
        "report": payload,
        "findings": findings,  # table order: row i is findings[i]
        "rows": findings_rows(findings, unit),
        "markdown": md,
        "errors": _errors_text(errors),
        "summary": summary_line(findings, errors, name, script.note, when=common.stamp()),
        "md_path": None, "json_path": None,
        "fixed_text": None, "diff": None, "fixed_path": None, "diff_path": None, "applied": [],
        "rules_found": sorted({f.rule for f in findings}),
        "notebook": notebook,
        "fixable": sorted({f.rule for f in findings if f.rule in _fixable()}),
    }
    if not notebook and not errors and result["fixable"]:
        fixed = apply_fixes(unit.text, report, name)  # the fixes of this lint: no second one
        applied = list(fixed.applied or [])
        if applied and fixed.fixed_text != unit.text:
            result.update(fixed_text=fixed.fixed_text, diff=fixed.diff, applied=[_describe_fix(a) for a in applied],
                          fixed_file=_encoded(fixed.fixed_text, script.encoding))
    return result


def _fixable() -> set[str]:
    from ..lint.fix import FIXABLE

    return set(FIXABLE)


def _encoded(text: str, encoding: str) -> bytes:
    """The corrected script in the encoding its coding line declares (UTF-8 if it cannot hold it)."""
    try:
        return text.encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return text.encode("utf-8")


def fix_note(result: dict) -> str:
    """What the corrected-script panel says: fixes applied, fixes that exist but are not applied
    to notebooks, or none that applies."""
    if result["fixed_text"] is not None:
        n = len(result["applied"])
        return (f"**{n} mechanical fix{'es' if n != 1 else ''} applied** ({', '.join(result['applied'])}); "
                "the other findings need a human. Review the diff.")
    if result["notebook"] and result["fixable"]:
        return (f"{', '.join(result['fixable'])} ha{'ve' if len(result['fixable']) != 1 else 's'} a mechanical fix, "
                "but notebooks are not rewritten: apply the **fix** column in the cells named there.")
    if result["errors"]:
        return "No corrected script: the input could not be analysed completely (see above)."
    return "No mechanical fix applies; follow the **fix** column by hand."


def _describe_fix(applied) -> str:
    """`AMP106 line 4` for an applied fix (a Finding), or its text for anything else."""
    if isinstance(applied, Finding):
        line = applied.location.line
        return f"{applied.rule} line {line}" if line else applied.rule
    return str(applied)


def summary_line(findings: list[Finding], errors: list, name: str, note: str = "", when: str = "") -> str:
    """The status line: whose results these are (the input's name, the time), then the count of
    each severity; "could not analyse" (never "no findings") when the input was not fully read,
    since an unparsed file proves nothing."""
    counts = {s: sum(1 for f in findings if f.severity.value == s) for s in ("error", "warning", "info")}
    parts = [f"{counts[s]} {s}{'s' if counts[s] != 1 else ''}" for s in ("error", "warning", "info")]
    if counts["error"]:
        parts[0] = f"**{parts[0]}**"
    if counts["info"]:
        parts[2] += " (folded below the table)"
    whose = f"Results for **{common.md_escape(name)}**" + (f", {when}" if when else "")
    if errors:
        found = [p for p, s in zip(parts, counts) if counts[s]]
        head = f"{whose}: could not analyse " + ("all of it" if findings else "it")
        text = head + (f"; in the parts read: {', '.join(found)}" if found else "") + "."
        text += "\n\n" + common.error_markdown("\n".join(_errors_text(errors)), title="Could not analyse")
    elif not findings:
        text = f"{whose}: no mixed-precision problems found."
    else:
        text = f"{whose}: " + ", ".join(parts) + "."
    return (note + "\n\n" + text) if note else text


def rule_at(row_rules: list | None, index) -> str | None:
    """The rule of the clicked table row: `row_rules[i]` is row i's rule (kept by index beside
    the table, never parsed back out of the displayed text)."""
    row = index[0] if isinstance(index, (list, tuple)) and index else index
    if not isinstance(row, int) or not row_rules or not 0 <= row < len(row_rules):
        return None
    return row_rules[row]


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
    fix note, corrected code, diff, corrected file, diff file, rule of each row)."""
    r = lint_script(code, upload)
    row_rules = [f.rule for f in r["findings"]]
    first_rule = row_rules[0] if row_rules else None
    return (r["summary"], r["rows"], r["md_path"], r["json_path"], first_rule,
            fix_note(r), r["fixed_text"], r["diff"], r["fixed_path"], r["diff_path"], row_rules)
