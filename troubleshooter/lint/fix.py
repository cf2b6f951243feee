"""Safe, mechanical fixes for a few rules, returned as fixed text plus a unified diff.

Each fix lives beside its rule (`Rule.apply_fix` in rules/ampNNN.py); this module holds the edit
machinery they share. Only rewrites whose meaning is certain are made:
- AMP106: `torch.cuda.amp.autocast(...)` -> `torch.amp.autocast("cuda", ...)` (likewise GradScaler,
  `torch.cpu.amp`, custom_fwd/custom_bwd), only when the old call passes no positional arguments
  (the new signatures put the device first, so positional ones would shift meaning);
- AMP101: insert `scaler.unscale_(optimizer)` on the line before the clip, with the script's names;
- AMP113: insert `scaler.update()` after `scaler.step(...)`;
- AMP115: `loss.backward()` -> `scaler.scale(loss).backward()`;
- AMP116: `optimizer.step()` -> `scaler.step(optimizer)` when `scaler.update()` already follows.
Anything else is left for the person; the result must still parse or nothing is changed.
"""
from __future__ import annotations

import ast
import difflib
from dataclasses import dataclass, field

from ..findings import Finding
from .analysis import FileModel
from .engine import active_rules, char_col, lint_text
from .rules import RULES
from .rules.amp106 import guarded_ids
from .source import parse

FIXABLE = tuple(r.id for r in RULES if r.fixable)


@dataclass
class FixResult:
    fixed_text: str
    diff: str
    applied: list[Finding] = field(default_factory=list)


class _Source:
    """Offsets in the text for AST (line, UTF-8 column) positions."""

    def __init__(self, text: str):
        self.text = text
        self.lines = text.splitlines(True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

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

    def after_line(self, line: int) -> int:
        return self.starts[line]


def fix_text(text: str, path: str = "<stdin>", select=None, ignore=None) -> FixResult:
    """Apply the safe fixes for the findings `lint_text` reports (noqa and select/ignore respected)."""
    report = lint_text(text, path, select=select, ignore=ignore)
    wanted = {(f.rule, f.location.line, f.location.column): f for f in report.findings if f.rule in FIXABLE}
    if report.errors or not wanted:
        return FixResult(text, "", [])
    tree = parse(text)
    model = FileModel(tree, text)
    src = _Source(text)
    fixer = Fixer(model, src)
    applied: list[Finding] = []
    for rule in active_rules(select, ignore):
        if rule.id not in FIXABLE:
            continue
        for hit in rule.check(model):
            line_text = src.lines[hit.line - 1] if 0 < hit.line <= len(src.lines) else ""
            finding = wanted.get((rule.id, hit.line, char_col(line_text, hit.col)))
            if finding is not None and rule.apply_fix(fixer, hit):
                applied.append(finding)
    fixed = fixer.apply()
    if fixed == text:
        return FixResult(text, "", [])
    try:
        parse(fixed)
    except SyntaxError:  # never hand back something that does not parse
        return FixResult(text, "", [])
    diff = "".join(difflib.unified_diff(text.splitlines(True), fixed.splitlines(True),
                                        fromfile=f"a/{path.lstrip('/')}", tofile=f"b/{path.lstrip('/')}"))
    return FixResult(fixed, diff, applied)


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

    def apply(self) -> str:
        out = self.src.text
        for start, end, new in sorted(self.edits, key=lambda x: (x[0], x[1]), reverse=True):
            out = out[:start] + new + out[end:]
        return out

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
