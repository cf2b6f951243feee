"""AMP106 deprecated-amp-api."""
import ast
import re

from ..analysis import walk, DEPRECATED, text
from ..lazy_re import lazy
from .base import Hit, Rule

_GUARD_RE = lazy(r"version|hasattr|getattr|TORCH_|torch_ge|is_torch|packaging|parse\(|_VERSION|LooseVersion", re.I)
_OLD_NAMES = {q.rsplit(".", 1)[1] for q in DEPRECATED}
_OLD_NAMES_LOWER = sorted({n.lower() for n in _OLD_NAMES})  # as FileModel.may_name asks
_FALLBACK_EXC = {"ImportError", "ModuleNotFoundError", "AttributeError", "TypeError"}


def guarded_ids(m) -> set[int]:
    """Nodes inside a version guard: `if torch version ...`, `hasattr(torch.amp, ...)`, try/except ImportError."""
    return m.memo.get(("amp106_guarded",), lambda: _collect_guarded(m))


# Every match of _GUARD_RE holds one of these, lower-cased
_GUARD_PARTS = ("version", "hasattr", "getattr", "torch_", "is_torch", "packaging", "parse")


def may_guard(m, test: ast.AST) -> bool:
    """False only when `_GUARD_RE` cannot match `text(test)`: the test's source lines hold none of
    `_GUARD_PARTS`, and no string, escape or non-ASCII character that the unparser could spell otherwise.
    Unparsing every `if` test of a file that uses an old name cost more than the rest of the rule."""
    lines = m.memo.get(("amp106_lines",), lambda: m.source.replace("\r\n", "\n").replace("\r", "\n").split("\n"))
    span = "\n".join(lines[test.lineno - 1:test.end_lineno])  # lines as the parser counts them
    if not span.isascii() or "\\" in span or '"' in span or "'" in span:
        return True
    low = span.lower()
    return any(p in low for p in _GUARD_PARTS)


def _collect_guarded(m) -> set[int]:
    out: set[int] = set()
    for node in m.of_class(ast.If) + m.of_class(ast.IfExp):
        if may_guard(m, node.test) and _GUARD_RE.search(text(node.test)):
            out.update(id(n) for n in m.subtree(node))
    for node in m.of_class(ast.Try):
        # `try: new API / except ImportError: old API` is a fallback; an old import in the try
        # body itself is what runs on every current torch, so only the handlers are exempt.
        for h in node.handlers:
            names = {getattr(n, "id", getattr(n, "attr", "")) for n in walk(h.type)} if h.type else {"*"}
            if names & _FALLBACK_EXC or "*" in names:
                out.update(id(n) for st in h.body for n in m.subtree(st))
    return out


class DeprecatedAmpApi(Rule):
    id = "AMP106"
    name = "deprecated-amp-api"
    severity = "warning"
    summary = ("`torch.cuda.amp.autocast`, `torch.cuda.amp.GradScaler`, `torch.cpu.amp.autocast`, "
               "`torch.cuda.amp.custom_fwd/custom_bwd` in any import or attribute form.")
    why = ("These spellings are deprecated since PyTorch 2.4 and emit a FutureWarning on every use; they will be "
           "removed. The device-generic `torch.amp` API does the same thing and works for CUDA, CPU, XPU and MPS.")
    example_bad = """
scaler = torch.cuda.amp.GradScaler()
with torch.cuda.amp.autocast():
    loss = model(x)
"""
    example_good = """
scaler = torch.amp.GradScaler("cuda")
with torch.amp.autocast("cuda"):
    loss = model(x)
"""
    fix = ('Use `torch.amp.autocast("cuda", ...)`, `torch.amp.GradScaler("cuda", ...)`, '
           '`torch.amp.custom_fwd(device_type="cuda")`. Keep the old spelling only behind a version guard '
           "for PyTorch < 2.4.")

    known_problems = 'Only the except path of a `try` and branches on the torch version (or `hasattr`) count as a fallback; a deprecated import in a `try` body is reported, since it is what runs on current torch.'
    fix_safety = "Safe: made only when the old call passes no positional arguments (the device now comes first), the file's `torch` is torch, and no use sits behind a version guard. Notebooks are not rewritten."
    references = ('https://pytorch.org/docs/stable/amp.html',)

    def apply_fix(self, fixer, hit) -> bool:
        node = fixer.node(hit, (ast.ImportFrom, ast.Attribute))
        if isinstance(node, ast.Attribute):
            return _fix_attribute(fixer, node)
        if isinstance(node, ast.ImportFrom):
            return _fix_import(fixer, node)
        return False

    def check(self, m):
        attributes = m.of_class(ast.Attribute) if any(map(m.may_name, _OLD_NAMES_LOWER)) else []  # most files: none
        candidates = [n for n in attributes if n.attr in _OLD_NAMES] + \
            [n for n in m.of_class(ast.ImportFrom) if n.module and ".amp" in n.module]
        if not candidates:
            return
        guarded = guarded_ids(m)  # version guards are looked for only in files that use an old name
        for node in candidates:
            if id(node) in guarded:
                continue
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                old = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in DEPRECATED]
                if old:
                    new = ", ".join(DEPRECATED[q] for q in old)
                    yield Hit.at(node, f"deprecated import of {', '.join('`' + q + '`' for q in old)}",
                                 f"import from `torch.amp` and pass the device: {new}", qual=old)
            elif isinstance(node, ast.Attribute) and node.attr in _OLD_NAMES:
                q = m.names.qual(node)
                if q in DEPRECATED:
                    alias = "" if text(node) == q else f" (it resolves to `{q}`)"
                    yield Hit.at(node, f"`{text(node)}` is deprecated since PyTorch 2.4{alias}",
                                 f"use `{DEPRECATED[q]}`", qual=[q])


# --- the mechanical fix: torch.cuda.amp.X(...) -> torch.amp.X("cuda", ...) ------------------------

_NEW_NAME = {"autocast": "torch.amp.autocast", "GradScaler": "torch.amp.GradScaler",
             "custom_fwd": "torch.amp.custom_fwd", "custom_bwd": "torch.amp.custom_bwd"}


def _torch_bound(fixer) -> bool:
    return fixer.m.names.alias.get("torch") == "torch"

def _fix_usage(fixer, func: ast.AST, new_func: str | None, kind: str, device: str) -> list[tuple[int, int, str]] | None:
    """Edits turning one use of an old name into the torch.amp form; None if not certainly safe."""
    edits = []
    if new_func is not None:
        s, e = fixer.src.span(func)
        edits.append((s, e, new_func))
    call = fixer.call_of.get(id(func))
    if kind in ("custom_fwd", "custom_bwd"):
        if call is None:
            if id(func) not in fixer.decorators:
                return None
            s, e = fixer.src.span(func)
            edits = [(s, e, f'{new_func or fixer.src.text[s:e]}(device_type="{device}")')]
            return edits
        insert = f'device_type="{device}"' + (", " if call.args or call.keywords else "")
    else:
        if call is None or call.args or any(k.arg is None for k in call.keywords):
            return None
        insert = f'"{device}"' + (", " if call.keywords else "")
    paren = fixer.src.text.find("(", fixer.src.span(func)[1])
    if paren < 0:
        return None
    edits.append((paren + 1, paren + 1, insert))
    return edits

def _fix_attribute(fixer, node: ast.Attribute) -> bool:
    qual = fixer.m.names.qual(node)
    if qual not in DEPRECATED or not _torch_bound(fixer):
        return False
    kind = qual.rsplit(".", 1)[1]
    device = "cpu" if ".cpu.amp" in qual else "cuda"
    edits = _fix_usage(fixer, node, _NEW_NAME[kind], kind, device)
    return bool(edits) and fixer.add_all(edits)

def _fix_import(fixer, node: ast.ImportFrom) -> bool:
    if node.lineno != node.end_lineno or node.module not in ("torch.cuda.amp", "torch.cpu.amp"):
        return False
    device = "cpu" if node.module == "torch.cpu.amp" else "cuda"
    edits = []
    for alias in node.names:
        if alias.name not in _NEW_NAME:
            return False
        local = alias.asname or alias.name
        for n in fixer.m.nodes:
            if isinstance(n, ast.Name) and n.id == local and isinstance(n.ctx, ast.Load):
                if id(n) in fixer.guarded:
                    return False
                usage = _fix_usage(fixer, n, None, alias.name, device)
                if usage is None:
                    return False
                edits += usage
    names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in node.names)
    s, e = fixer.src.span(node)
    edits.append((s, e, f"from torch.amp import {names}"))
    return fixer.add_all(edits)
