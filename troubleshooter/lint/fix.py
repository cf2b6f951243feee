"""Safe, mechanical fixes for a few rules: each finding's own `Fix`, and the fixed text plus a diff.

Each fix lives beside its rule (`Rule.apply_fix` in rules/ampNNN.py); this module holds the edit
machinery they share. Only rewrites whose meaning is certain are made:
- AMP106: `torch.cuda.amp.autocast(...)` -> `torch.amp.autocast("cuda", ...)` (likewise GradScaler,
  `torch.cpu.amp`, custom_fwd/custom_bwd), only when the old call passes no positional arguments
  (the new signatures put the device first, so positional ones would shift meaning);
- AMP101: insert `scaler.unscale_(optimizer)` on the line before the clip, with the script's names;
- AMP113: insert `scaler.update()` after `scaler.step(...)`;
- AMP115: `loss.backward()` -> `scaler.scale(loss).backward()`;
- AMP116: `optimizer.step()` -> `scaler.step(optimizer)` when `scaler.update()` already follows.
Anything else is left for the person. `finding_fixes` gives each finding its edits (the linter
attaches them to the report: JSON `fix`, SARIF `fixes`, the language server's quick fixes);
`fix_text` makes every fix that fits with the others; a fix whose result would not parse is dropped.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field

from ..findings import Finding
from .analysis import FileModel
from .edits import Edit, Fix, apply_edits, compatible_fixes, line_starts, position_of, split_lines
from .engine import active_rules, char_col, finding_key, lint_unit
from .rules import RULES
from .rules.amp106 import guarded_ids
from .source import SourceUnit, parse, strip_ipython

FIXABLE = tuple(r.id for r in RULES if r.fixable)


@dataclass
class FixResult:
    """The text after the safe fixes, its unified diff and the findings the fixes resolved."""

    fixed_text: str
    diff: str
    applied: list[Finding] = field(default_factory=list)


class _Source:
    """Offsets in the text for AST (line, UTF-8 column) positions."""

    def __init__(self, text: str):
        self.text = text
        self.lines = split_lines(text)
        self.starts = line_starts(text)

    def offset(self, line: int, col_bytes: int) -> int:
        src = self.lines[line - 1]
        return self.starts[line - 1] + len(src.encode("utf-8")[:col_bytes].decode("utf-8", "replace"))

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset)

    def indent(self, line: int) -> str:
        src = self.lines[line - 1]
        return src[: len(src) - len(src.lstrip())]

    def line_start(self, line: int) -> int:
        return self.starts[line - 1]

    def line_end(self, line: int) -> int:
        """The offset just before the line's ending: an insertion here stays on this line (and in its
        notebook cell, where the next line may belong to the next cell)."""
        return self.starts[line - 1] + len(self.lines[line - 1].rstrip("\r\n"))

    def newline(self, line: int) -> str:
        """The line's own ending (a file with CRLF endings keeps them), `\n` for the last line without one."""
        src = self.lines[line - 1]
        return src[len(src.rstrip("\r\n")):] or "\n"


def finding_fixes(model: FileModel, text: str, located: list[tuple[int, Finding]], rules,
                  locate=None) -> dict[tuple, Fix]:
    """Each finding's safe fix, made alone, keyed by `finding_key`.

    `located` pairs each finding with the line of `text` it was found on; `locate(line)` turns a
    line of `text` into (cell, line in cell) for notebooks, so edits are placed in their cell. A fix
    must leave code that parses: the fixes that fit together are checked with one parse of the
    file, the others (and all of them when that parse fails) one by one."""
    want = {(f.rule, line, f.location.column): f for line, f in located}
    if not want:
        return {}
    src = _Source(text)
    fixer = Fixer(model, src)
    found: dict[tuple, tuple[Fix, list[Edit]]] = {}  # key -> (the fix, its edits on `text`)
    for rule in rules:
        if not rule.fixable or not any(r == rule.id for r, _, _ in want):
            continue
        for hit in rule.check(model):
            line_text = src.lines[hit.line - 1] if 0 < hit.line <= len(src.lines) else ""
            finding = want.get((rule.id, hit.line, char_col(line_text, hit.col)))
            if finding is None or finding_key(finding) in found:
                continue
            fixer.edits = []
            if not rule.apply_fix(fixer, hit) or not fixer.edits:
                continue
            edits = _positions(src, fixer.edits, locate)
            if edits is not None:
                found[finding_key(finding)] = (Fix(finding.suggestion, edits), _in_text(src, fixer.edits))
    chosen = {id(fix) for fix in compatible_fixes(fix for fix, _ in found.values())}
    together = {k for k, (fix, _) in found.items() if id(fix) in chosen}
    if together and not _still_parses(model, text, [e for k in together for e in found[k][1]]):
        together = set()
    return {k: fix for k, (fix, raw) in found.items() if k in together or _still_parses(model, text, raw)}


def _still_parses(model: FileModel, text: str, edits: list[Edit]) -> bool:
    """Does `text` with the edits still parse? Only the top-level statements the edits fall in are
    parsed again (each alone: a module's statements parse independently), not the whole file.
    Edits that collide or fall outside the text are no fix either."""
    try:
        return _regions_parse(model, text, edits)
    except ValueError:
        return False


def _regions_parse(model: FileModel, text: str, edits: list[Edit]) -> bool:
    spans = [(min([st.lineno, *(d.lineno for d in getattr(st, "decorator_list", ()))]), st.end_lineno)
             for st in model.tree.body]
    regions: dict[tuple[int, int], list[Edit]] = {}
    for e in edits:
        span = next(((a, b) for a, b in spans if a <= e.line and e.end_line <= b), None)
        if span is None:  # between statements: judge the whole file
            return _parses(apply_edits(text, edits))
        regions.setdefault(span, []).append(e)
    lines = split_lines(text)
    for (a, b), inside in regions.items():
        snippet = "".join(lines[a - 1:b])
        moved = [Edit(e.line - a + 1, e.column, e.end_line - a + 1, e.end_column, e.content) for e in inside]
        if not _parses(apply_edits(snippet, moved)):
            return False
    return True


def attach_fixes(report, unit: SourceUnit, model: FileModel, rules) -> None:
    """Give the report's findings of fixable rules their fixes (`report.fixes`), from the model the
    linter already built."""
    if not any(r.fixable for r in rules) or not report.findings:
        return
    fixable = {r.id for r in rules if r.fixable}
    if unit.cell_map is None:
        located = [(f.location.line, f) for f in report.findings if f.rule in fixable]
        report.fixes.update(finding_fixes(model, unit.text, located, rules))
        return
    joined = {where: line for line, where in unit.cell_map.items()}
    located = [(joined[(f.location.cell, f.location.line)], f) for f in report.findings
               if f.rule in fixable and (f.location.cell, f.location.line) in joined]
    report.fixes.update(finding_fixes(model, unit.text, located, rules, unit.locate))


def _in_text(src: _Source, raw) -> list[Edit]:
    out = []
    for start, end, new in raw:
        (l1, c1), (l2, c2) = position_of(src.starts, start), position_of(src.starts, end)
        out.append(Edit(l1, c1, l2, c2, new))
    return out


def _positions(src: _Source, raw, locate) -> tuple[Edit, ...] | None:
    """Offsets -> Edits in finding coordinates; None when an edit leaves its notebook cell."""
    edits = _in_text(src, raw)
    if locate is None:
        return tuple(edits)
    out = []
    for e in edits:
        (cell, line), (end_cell, end_line) = locate(e.line), locate(e.end_line)
        if cell is None or cell != end_cell:
            return None
        out.append(Edit(line, e.column, end_line, e.end_column, e.content, cell))
    return tuple(out)


def _parses(text: str) -> bool:
    try:
        parse(text)
        return True
    except SyntaxError:
        pass
    except (ValueError, RecursionError, MemoryError):
        return False
    try:  # a .py exported from a notebook keeps its `!pip` lines: judge it as the linter reads it
        parse("\n".join(strip_ipython(split_lines(text))))
        return True
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False


def fix_text(text: str, path: str = "<stdin>", select=None, ignore=None) -> FixResult:
    """Apply the safe fixes for the findings the linter reports on Python `text` (noqa and
    select/ignore respected); fixes that touch the same text are left for a second run."""
    report = lint_unit(SourceUnit(path=path, text=text), active_rules(select, ignore))
    if report.errors:
        return FixResult(text, "", [])
    return apply_fixes(text, report, path)


def apply_fixes(text: str, report, path: str, cell: int | None = None, label: str = "") -> FixResult:
    """Make the report's fixes (those of one notebook `cell` when given) that fit together."""
    fixes = [(f, report.fixes[finding_key(f)]) for f in report.findings
             if finding_key(f) in report.fixes and f.location.cell == cell]
    chosen = compatible_fixes(fix for _, fix in fixes)
    applied = [f for f, fix in fixes if any(fix is c for c in chosen)]
    if not applied:
        return FixResult(text, "", [])
    fixed = apply_edits(text, [e for fix in chosen for e in fix.edits])
    if fixed == text or (cell is None and not _parses(fixed)):  # never hand back something that does not parse
        return FixResult(text, "", [])
    return FixResult(fixed, unified_diff(text, fixed, path, label), applied)


def unified_diff(before: str, after: str, path: str, label: str = "") -> str:
    name = path.lstrip("/") + label
    import difflib  # only --diff and the app's diff view need it

    return "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True),
                                        fromfile=f"a/{name}", tofile=f"b/{name}"))


class Fixer:
    """Edits to one file's text. Each rule's `apply_fix(fixer, hit)` (beside the rule) asks it for
    the node at a finding and adds edits; overlapping edits are refused, so fixes never collide."""
    def __init__(self, model: FileModel, src: _Source):
        self.m = model
        self.src = src
        self.edits: list[tuple[int, int, str]] = []
        self.at: dict[tuple[int, int], list[ast.AST]] = {}
        self.call_of: dict[int, ast.Call] = {}
        self.decorators: set[int] = set()
        self.stmt_at: dict[int, ast.stmt] = {}
        for n in model.nodes:
            if hasattr(n, "lineno"):
                self.at.setdefault((n.lineno, n.col_offset + 1), []).append(n)
            if isinstance(n, ast.Call):
                self.call_of[id(n.func)] = n
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.decorators.update(id(d) for d in n.decorator_list)
            if isinstance(n, ast.stmt):
                self.stmt_at.setdefault(n.lineno, n)
        self.guarded = guarded_ids(model)

    # edits ---------------------------------------------------------------------------------

    def add(self, start: int, end: int, new: str) -> bool:
        for s, e, _ in self.edits:
            if start < e and s < end or (start == end == s):
                return False
        self.edits.append((start, end, new))
        return True

    def node(self, hit, types) -> ast.AST | None:
        for n in self.at.get((hit.line, hit.col), []):
            if isinstance(n, types):
                return n
        return None

    def own_line_stmt(self, node: ast.AST) -> ast.stmt | None:
        """The simple statement that starts `node`'s line at its indentation, if any."""
        st = self.stmt_at.get(node.lineno)
        if st is None or isinstance(st, (ast.If, ast.For, ast.While, ast.With, ast.Try, ast.FunctionDef,
                                         ast.ClassDef, ast.AsyncFunctionDef)):
            return None
        if st.col_offset != len(self.src.indent(st.lineno).encode("utf-8")):
            return None
        line = self.src.lines[st.end_lineno - 1]
        tail = line[len(line.encode("utf-8")[: st.end_col_offset].decode("utf-8", "replace")):]
        if tail.strip() and not tail.strip().startswith("#"):
            return None  # `a(); b()` on one line
        return st

    def add_all(self, edits) -> bool:
        for s, e, _ in edits:
            for s2, e2, _ in self.edits:
                if s < e2 and s2 < e or (s == e == s2):
                    return False
        self.edits.extend(edits)
        return True
