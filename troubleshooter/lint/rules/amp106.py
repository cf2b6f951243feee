"""AMP106 deprecated-amp-api."""
import ast
import re

from ..analysis import walk, DEPRECATED, text
from .base import Hit, Rule

_GUARD_RE = re.compile(r"version|hasattr|getattr|TORCH_|torch_ge|is_torch|packaging|parse\(|_VERSION|LooseVersion", re.I)
_OLD_NAMES = {q.rsplit(".", 1)[1] for q in DEPRECATED}
_FALLBACK_EXC = {"ImportError", "ModuleNotFoundError", "AttributeError", "TypeError"}


def guarded_ids(m) -> set[int]:
    """Nodes inside a version guard: `if torch version ...`, `hasattr(torch.amp, ...)`, try/except ImportError."""
    return m.memo.get(("amp106_guarded",), lambda: _collect_guarded(m))


def _collect_guarded(m) -> set[int]:
    out: set[int] = set()
    for node in m.nodes:
        if isinstance(node, (ast.If, ast.IfExp)) and _GUARD_RE.search(text(node.test)):
            out.update(id(n) for n in m.subtree(node))
        elif isinstance(node, ast.Try):
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

    def check(self, m):
        guarded = guarded_ids(m)
        for node in m.nodes:
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
