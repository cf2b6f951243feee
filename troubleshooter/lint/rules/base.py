"""What a lint rule is: its catalogue entry (docs) plus a predicate over a `FileModel`."""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any, Iterator

from ..analysis import FileModel


@dataclass
class Hit:
    """One place a rule fires; the engine turns it into a `Finding`."""

    line: int
    col: int
    message: str
    suggestion: str | None = None  # defaults to the rule's `fix`
    data: dict[str, Any] = field(default_factory=dict)
    # A rule whose finding holds only in some configuration (a device that may be the CPU, an
    # accumulation count that may be 1) lowers it to "warning"; None keeps the rule's severity.
    severity: str | None = None

    @classmethod
    def at(cls, node: ast.AST, message: str, suggestion: str | None = None, **data: Any) -> "Hit":
        return cls(node.lineno, node.col_offset + 1, message, suggestion, data)

    def lowered(self, severity: str = "warning") -> "Hit":
        self.severity = severity
        return self


class Rule:
    id: str = ""
    name: str = ""
    severity: str = "warning"
    summary: str = ""  # one line: what it detects
    why: str = ""  # why it is a problem
    example_bad: str = ""
    example_good: str = ""
    fix: str = ""  # what to do instead

    def check(self, m: FileModel) -> Iterator[Hit]:  # pragma: no cover - every rule overrides
        raise NotImplementedError

    def explain(self) -> str:
        """Markdown: what, why, bad example, good example, fix."""
        return (
            f"# {self.id} {self.name} ({self.severity})\n\n{self.summary}\n\n## Why it matters\n\n{self.why}\n\n"
            f"## Example (flagged)\n\n```python\n{self.example_bad.strip()}\n```\n\n"
            f"## Instead\n\n```python\n{self.example_good.strip()}\n```\n\n## Fix\n\n{self.fix}\n"
        )
