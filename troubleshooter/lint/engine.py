"""Run the rule catalogue over source text or paths and collect a `LintReport`."""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Iterable

from ..errors import UserError
from ..findings import Finding, Location, has_problems, sort_key
from .analysis import FileModel
from .edits import Fix
from .lazy_re import lazy
from .rules import BY_ID, RULES, Rule
from .source import LintError, SourceUnit, parse, parse_problem, strip_ipython

_NOQA = lazy(r"#\s*noqa(?::\s*(?P<codes>[A-Za-z0-9_]+(?:\s*,\s*[A-Za-z0-9_]+)*))?", re.I)


_LINE_REF = lazy(r"\bline (\d+)\b")


def _cell_ref(unit: SourceUnit, line: int) -> str:
    cell, inner = unit.locate(line)
    return f"cell {cell} line {inner}" if cell is not None else f"line {line}"


@dataclass
class LintReport:
    """What a lint run found: findings, unreadable inputs, notes and the safe fixes of the findings."""

    findings: list[Finding] = field(default_factory=list)
    errors: list[LintError] = field(default_factory=list)
    files: int = 0
    notes: list[str] = field(default_factory=list)  # e.g. a notebook with no code: nothing to lint, not an error
    # (path, cell, line in cell) -> line in the raw .ipynb, for annotations GitHub can place
    notebook_lines: dict[tuple[str, int, int], int] = field(default_factory=dict)
    fixes: dict[tuple, Fix] = field(default_factory=dict)  # finding_key -> its safe fix (lint/fix.py)

    def fix_of(self, f: Finding) -> Fix | None:
        return self.fixes.get(finding_key(f))

    def finding_dict(self, f: Finding) -> dict:
        """A finding's JSON: its fields plus `fixable` and, when it has one, its safe `fix` (ruff's shape)."""
        fix = self.fix_of(f)
        return {**f.to_dict(), "fixable": fix is not None, "fix": fix.to_dict() if fix else None}

    def to_dict(self) -> dict:
        out = {"findings": [self.finding_dict(f) for f in self.findings], "errors": [e.to_dict() for e in self.errors]}
        if self.notes:
            out["notes"] = list(self.notes)
        return out

    @property
    def exit_code(self) -> int:
        if self.errors:
            return 2
        return 1 if has_problems(self.findings) else 0

    def extend(self, other: "LintReport") -> None:
        self.findings += other.findings
        self.errors += other.errors
        self.files += other.files
        self.notes += other.notes
        self.notebook_lines.update(other.notebook_lines)
        self.fixes.update(other.fixes)


def finding_key(f: Finding) -> tuple:
    """What identifies a lint finding within a report (its fix is stored under it)."""
    loc = f.location
    return loc.path, loc.cell, loc.line, loc.column, f.rule


def parse_ids(value: str | Iterable[str] | None, option: str) -> list[str] | None:
    """'AMP101, AMP1' -> ['AMP101', 'AMP1']; every entry must name a rule or a prefix of one."""
    if value is None:
        return None
    parts = value.split(",") if isinstance(value, str) else [p for v in value for p in str(v).split(",")]
    ids = [p.strip().upper() for p in parts if p.strip()]
    bad = [i for i in ids if i != "ALL" and not any(r.id.startswith(i) for r in RULES)]
    if bad:
        raise UserError(f"unknown rule id{'s' if len(bad) > 1 else ''} in {option}: {', '.join(bad)} "
                        f"(rules are {RULES[0].id}..{RULES[-1].id}; see `python -m troubleshooter rules`)")
    return ids


def active_rules(select=None, ignore=None) -> list[Rule]:
    sel = parse_ids(select, "--select")
    ign = parse_ids(ignore, "--ignore") or []

    def match(rule_id: str, prefixes: list[str]) -> bool:
        return any(p == "ALL" or rule_id.startswith(p) for p in prefixes)

    return [r for r in RULES if (sel is None or match(r.id, sel)) and not match(r.id, ign)]


def char_col(line: str, byte_col: int) -> int:
    """ast columns count UTF-8 bytes; people (and editors) count characters. Both 1-based."""
    if line.isascii():
        return byte_col
    return len(line.encode("utf-8")[: byte_col - 1].decode("utf-8", "replace")) + 1


def _noqa_codes(line: str) -> set[str] | None:
    """None: no noqa; empty set: bare noqa (everything); else the listed codes/prefixes."""
    if "noqa" not in line.lower():
        return None
    mt = _NOQA.search(line)
    if not mt:
        return None
    codes = mt.group("codes")
    return {c.strip().upper() for c in codes.split(",")} if codes else set()


def lint_unit(unit: SourceUnit, rules: list[Rule], read_configs: bool = False) -> LintReport:
    """Lint one unit. `read_configs`: the unit is a file on disk, and framework config files beside
    it (accelerate YAML, DeepSpeed JSON, Lightning CLI YAML) may be read (lint/frameworks/configs.py)."""
    report = LintReport(errors=list(unit.errors), files=1, notes=list(unit.notes))
    if not unit.text.strip():
        return report
    try:
        tree = parse(unit.text, unit.path)
    except SyntaxError as exc:
        tree, exc = _parse_ipython_export(unit, exc)
        if tree is None:
            cell, line = unit.locate(exc.lineno or 0)
            report.errors.append(LintError(unit.path, f"syntax error: {exc.msg}", line if exc.lineno else None, cell))
            return report
    except (ValueError, RecursionError, MemoryError) as exc:
        report.errors.append(LintError(unit.path, f"cannot parse: {parse_problem(exc)}"))
        return report
    try:
        model = FileModel(tree, unit.text)
        model.script_path = unit.path if read_configs else None
    except RecursionError:
        report.errors.append(LintError(unit.path, "code is nested too deeply to analyse"))
        return report
    lines: list[str] | None = None  # split only when a rule hits
    seen = set()
    eventless = not model.event_scopes
    for rule in rules:
        if eventless and rule.needs_events:
            continue  # it finds nothing without a training-step event (rules/base.py)
        try:
            hits = list(rule.check(model))
        except RecursionError:
            report.errors.append(LintError(unit.path, f"{rule.id}: code is nested too deeply to analyse"))
            continue
        for h in hits:
            key = (rule.id, h.line, h.col)
            if key in seen:
                continue
            seen.add(key)
            if lines is None:
                lines = model.lines
            src = lines[h.line - 1] if 0 < h.line <= len(lines) else ""
            codes = _noqa_codes(src)
            if codes is not None and (not codes or any(rule.id.startswith(c) for c in codes)):
                continue
            cell, line = unit.locate(h.line)
            if cell is not None and unit.raw_lines and h.line in unit.raw_lines:
                report.notebook_lines[(unit.path, cell, line)] = unit.raw_lines[h.line]
            col = char_col(src, h.col)
            message = h.message
            if unit.cell_map is not None:  # "line 12" in a message means a line of the joined cells
                message = _LINE_REF.sub(lambda mt: _cell_ref(unit, int(mt.group(1))), message)
            report.findings.append(Finding(
                rule=rule.id, name=rule.name, severity=h.severity or rule.severity, message=message,
                suggestion=h.suggestion or rule.fix,
                location=Location(path=unit.path, line=line, column=col, cell=cell), data=dict(h.data)))
    report.findings.sort(key=sort_key)
    from .fix import attach_fixes  # fix.py builds on this module
    attach_fixes(report, unit, model, rules)
    return report


def _parse_ipython_export(unit: SourceUnit, exc: SyntaxError) -> tuple[ast.Module | None, SyntaxError]:
    """A `.py` exported from Colab/Kaggle keeps `!pip ...`, `%matplotlib`, `%%time`: read it as IPython
    (same line numbers) when it is not plain Python. (None, the error to report) when it still fails."""
    if unit.cell_map is not None:
        return None, exc
    text = "\n".join(strip_ipython(unit.text.splitlines())) + "\n"
    if text.strip() == unit.text.strip():
        return None, exc
    try:
        tree = parse(text, unit.path)
    except SyntaxError as again:
        return None, again  # the Python error left once the IPython lines are read as IPython
    except (ValueError, RecursionError, MemoryError):
        return None, exc
    unit.text = text
    return tree, exc


def lint_text(text: str, path: str = "<stdin>", select=None, ignore=None) -> LintReport:
    """Lint Python source (or notebook JSON when `path` ends in .ipynb)."""
    rules = active_rules(select, ignore)
    if path.endswith(".ipynb"):
        from .source import notebook_unit
        try:
            unit = notebook_unit(text, path)
        except ValueError as exc:
            return LintReport(errors=[LintError(path, str(exc))])
    else:
        unit = SourceUnit(path=path, text=text)
    return lint_unit(unit, rules)


def lint_paths(paths: list[str], select=None, ignore=None) -> LintReport:
    """Lint files, notebooks, directories (recursively) and `-` (stdin); unreadable ones become errors."""
    from .runner import lint_inputs  # the one loop over inputs, shared with the CLI's cached runs

    return lint_inputs(paths, active_rules(select, ignore))


def all_rules() -> list[Rule]:
    return list(RULES)


def get_rule(rule_id: str) -> Rule:
    rule = BY_ID.get(str(rule_id).strip().upper())
    if rule is None:
        raise UserError(f"unknown rule id {rule_id!r} (rules are {RULES[0].id}..{RULES[-1].id}; "
                        "see `python -m troubleshooter rules`)")
    return rule


def explain_rule(rule_id: str) -> str:
    return get_rule(rule_id).explain()
