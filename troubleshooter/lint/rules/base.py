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
    known_problems: str = ""  # where the rule is known to miss or over-report
    fix_safety: str = ""  # for rules with a mechanical fix: when it is applied and why that is safe
    references: tuple[str, ...] = ()
    # Every hit comes from a training-step event (`m.event_scopes`): the engine does not run the rule on a
    # file without one (most files of a real tree define models). tests/test_lint_on_demand.py runs each
    # such rule on every in-repo script without events anyway and checks it finds nothing.
    needs_events: bool = False

    def check(self, m: FileModel) -> Iterator[Hit]:  # pragma: no cover - every rule overrides
        raise NotImplementedError

    def apply_fix(self, fixer, hit: Hit) -> bool:
        """The rule's mechanical fix for one hit, as edits on `fixer` (lint/fix.py); False: none made."""
        return False

    @property
    def fixable(self) -> bool:
        """Has a mechanical fix (`--fix` / `--diff` apply it where its meaning is certain)."""
        return type(self).apply_fix is not Rule.apply_fix

    def docs(self) -> str:
        """The rule's documentation in ruff's sections (docs/lint.md is generated from these)."""
        safety = self.fix_safety if self.fixable else (
            "No mechanical fix: the right change depends on intent; each finding's suggestion names it.")
        refs = "\n".join(f"- {r}" for r in self.references) or "- https://pytorch.org/docs/stable/amp.html"
        return (
            f"### {self.id} {self.name} ({self.severity})\n\n"
            f"#### What it does\n\n{self.summary}\n\n#### Why is this bad?\n\n{self.why}\n\n"
            f"#### Example\n\n```python\n{self.example_bad.strip()}\n```\n\n"
            f"#### Use instead\n\n```python\n{self.example_good.strip()}\n```\n\n{self.fix}\n\n"
            f"#### Known problems\n\n{self.known_problems or 'None known.'}\n\n"
            f"#### Fix safety\n\n{safety}\n\n#### References\n\n{refs}\n"
        )

    def explain(self) -> str:
        """Markdown: what, why, bad example, good example, fix."""
        return (
            f"# {self.id} {self.name} ({self.severity})\n\n{self.summary}\n\n## Why it matters\n\n{self.why}\n\n"
            f"## Example (flagged)\n\n```python\n{self.example_bad.strip()}\n```\n\n"
            f"## Instead\n\n```python\n{self.example_good.strip()}\n```\n\n## Fix\n\n{self.fix}\n"
            + (f"\n## Known problems\n\n{self.known_problems}\n" if self.known_problems else "")
        )
