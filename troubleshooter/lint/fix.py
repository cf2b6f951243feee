"""Safe, mechanical fixes for a few rules, returned as fixed text plus a unified diff.

Only rewrites whose meaning is certain are made:
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
from .analysis import DEPRECATED, FileModel, text as unparse
from .engine import active_rules, char_col, lint_text
from .rules.amp106 import guarded_ids

FIXABLE = ("AMP101", "AMP106", "AMP113", "AMP115", "AMP116")
_NEW_NAME = {"autocast": "torch.amp.autocast", "GradScaler": "torch.amp.GradScaler",
             "custom_fwd": "torch.amp.custom_fwd", "custom_bwd": "torch.amp.custom_bwd"}


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
    tree = ast.parse(text)
    model = FileModel(tree, text)
    src = _Source(text)
    fixer = _Fixer(model, src)
    applied: list[Finding] = []
    for rule in active_rules(select, ignore):
        if rule.id not in FIXABLE:
            continue
        for hit in rule.check(model):
            line_text = src.lines[hit.line - 1] if 0 < hit.line <= len(src.lines) else ""
            finding = wanted.get((rule.id, hit.line, char_col(line_text, hit.col)))
            if finding is not None and getattr(fixer, f"fix_{rule.id}")(hit):
                applied.append(finding)
    fixed = fixer.apply()
    if fixed == text:
        return FixResult(text, "", [])
    try:
        ast.parse(fixed)
    except SyntaxError:  # never hand back something that does not parse
        return FixResult(text, "", [])
    diff = "".join(difflib.unified_diff(text.splitlines(True), fixed.splitlines(True),
                                        fromfile=f"a/{path.lstrip('/')}", tofile=f"b/{path.lstrip('/')}"))
    return FixResult(fixed, diff, applied)


class _Fixer:
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

    def _add(self, start: int, end: int, new: str) -> bool:
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

    def _node(self, hit, types) -> ast.AST | None:
        for n in self.at.get((hit.line, hit.col), []):
            if isinstance(n, types):
                return n
        return None

    def _own_line_stmt(self, node: ast.AST) -> ast.stmt | None:
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

    # AMP101 ---------------------------------------------------------------------------------

    def fix_AMP101(self, hit) -> bool:
        call = self._node(hit, ast.Call)
        opt = hit.data.get("optimizer_known")
        scaler = hit.data.get("scaler")
        if call is None or not opt or not scaler:
            return False
        st = self._own_line_stmt(call)
        if st is None:
            return False
        pos = self.src.line_start(st.lineno)
        return self._add(pos, pos, f"{self.src.indent(st.lineno)}{scaler}.unscale_({opt})\n")

    # AMP113 ---------------------------------------------------------------------------------

    def fix_AMP113(self, hit) -> bool:
        call = self._node(hit, ast.Call)
        if call is None or getattr(call.func, "attr", None) != "step" or not isinstance(call.func, ast.Attribute):
            return False
        st = self._own_line_stmt(call)
        if st is None or not isinstance(st, ast.Expr) or st.value is not call:
            return False
        pos = self.src.after_line(st.end_lineno)
        return self._add(pos, pos, f"{self.src.indent(st.lineno)}{unparse(call.func.value)}.update()\n")

    # AMP115 ---------------------------------------------------------------------------------

    def fix_AMP115(self, hit) -> bool:
        call = self._node(hit, ast.Call)
        scaler = hit.data.get("scaler")
        if call is None or not scaler or not isinstance(call.func, ast.Attribute) or call.func.attr != "backward":
            return False
        target = call.func.value
        start, end = self.src.span(target)
        return self._add(start, end, f"{scaler}.scale({self.src.text[start:end]})")

    # AMP116 ---------------------------------------------------------------------------------

    def fix_AMP116(self, hit) -> bool:
        call = self._node(hit, ast.Call)
        scaler = hit.data.get("scaler")
        if call is None or not scaler or not hit.data.get("update_follows") or call.args or call.keywords \
                or not isinstance(call.func, ast.Attribute) or call.func.attr != "step":
            return False
        start, end = self.src.span(call)
        opt_start, opt_end = self.src.span(call.func.value)
        return self._add(start, end, f"{scaler}.step({self.src.text[opt_start:opt_end]})")

    # AMP106 ---------------------------------------------------------------------------------

    def fix_AMP106(self, hit) -> bool:
        node = self._node(hit, (ast.ImportFrom, ast.Attribute))
        if isinstance(node, ast.Attribute):
            return self._fix_attribute(node)
        if isinstance(node, ast.ImportFrom):
            return self._fix_import(node)
        return False

    def _torch_bound(self) -> bool:
        return self.m.names.alias.get("torch") == "torch"

    def _fix_usage(self, func: ast.AST, new_func: str | None, kind: str, device: str) -> list[tuple[int, int, str]] | None:
        """Edits turning one use of an old name into the torch.amp form; None if not certainly safe."""
        edits = []
        if new_func is not None:
            s, e = self.src.span(func)
            edits.append((s, e, new_func))
        call = self.call_of.get(id(func))
        if kind in ("custom_fwd", "custom_bwd"):
            if call is None:
                if id(func) not in self.decorators:
                    return None
                s, e = self.src.span(func)
                edits = [(s, e, f'{new_func or self.src.text[s:e]}(device_type="{device}")')]
                return edits
            insert = f'device_type="{device}"' + (", " if call.args or call.keywords else "")
        else:
            if call is None or call.args or any(k.arg is None for k in call.keywords):
                return None
            insert = f'"{device}"' + (", " if call.keywords else "")
        paren = self.src.text.find("(", self.src.span(func)[1])
        if paren < 0:
            return None
        edits.append((paren + 1, paren + 1, insert))
        return edits

    def _fix_attribute(self, node: ast.Attribute) -> bool:
        qual = self.m.names.qual(node)
        if qual not in DEPRECATED or not self._torch_bound():
            return False
        kind = qual.rsplit(".", 1)[1]
        device = "cpu" if ".cpu.amp" in qual else "cuda"
        edits = self._fix_usage(node, _NEW_NAME[kind], kind, device)
        return bool(edits) and self._add_all(edits)

    def _fix_import(self, node: ast.ImportFrom) -> bool:
        if node.lineno != node.end_lineno or node.module not in ("torch.cuda.amp", "torch.cpu.amp"):
            return False
        device = "cpu" if node.module == "torch.cpu.amp" else "cuda"
        edits = []
        for alias in node.names:
            if alias.name not in _NEW_NAME:
                return False
            local = alias.asname or alias.name
            for n in self.m.nodes:
                if isinstance(n, ast.Name) and n.id == local and isinstance(n.ctx, ast.Load):
                    if id(n) in self.guarded:
                        return False
                    usage = self._fix_usage(n, None, alias.name, device)
                    if usage is None:
                        return False
                    edits += usage
        names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in node.names)
        s, e = self.src.span(node)
        edits.append((s, e, f"from torch.amp import {names}"))
        return self._add_all(edits)

    def _add_all(self, edits) -> bool:
        for s, e, _ in edits:
            for s2, e2, _ in self.edits:
                if s < e2 and s2 < e or (s == e == s2):
                    return False
        self.edits.extend(edits)
        return True
