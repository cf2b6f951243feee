"""Import aliases resolved to qualified names (`ac` -> `torch.amp.autocast`)."""
from __future__ import annotations

import ast


class Names:
    """Import aliases -> qualified names, collected from every import anywhere in the file."""

    def __init__(self, imports: list[ast.AST]):
        """`imports`: the file's `import` and `from ... import` statements in walk order."""
        self.alias: dict[str, str] = {}
        self.imports: list[tuple[ast.AST, str, str]] = []  # (node, local name, qualified)
        for node in imports:
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        self.alias[a.asname] = a.name
                        self.imports.append((node, a.asname, a.name))
                    else:
                        self.alias.setdefault(a.name.split(".")[0], a.name.split(".")[0])
                        self.imports.append((node, a.name.split(".")[0], a.name))
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    local = a.asname or a.name
                    qual = f"{node.module}.{a.name}"
                    # A later unguarded import wins over a try/except fallback seen first.
                    self.alias[local] = qual if local not in self.alias or not _is_old(qual) else self.alias[local]
                    self.imports.append((node, local, qual))

    def qual(self, node: ast.AST | None) -> str | None:
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name):
            base = self.alias.get(node.id, node.id)
            return ".".join([base, *reversed(parts)])
        return None


def _is_old(qual: str) -> bool:
    return ".cuda.amp." in qual or ".cpu.amp." in qual


