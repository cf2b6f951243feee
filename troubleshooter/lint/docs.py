"""Generate the rule catalogue of docs/lint.md from the rules themselves (one source of truth).

    python -m troubleshooter.lint.docs          # rewrite docs/lint.md below the marker
    python -m troubleshooter.lint.docs --check  # exit 1 if docs/lint.md is stale

Everything above the marker is hand-written (usage, how it works); everything below is generated
from each rule's summary, why, examples, fix, known problems, fix safety and references.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .rules import RULES

DOC = Path(__file__).resolve().parents[2] / "docs" / "lint.md"
MARKER = "<!-- Generated from troubleshooter/lint/rules by `python -m troubleshooter.lint.docs`; edit the rules, not this part. -->"


def _anchor(rule) -> str:
    return f"#{rule.id.lower()}-{rule.name}-{rule.severity}"


def render_rules() -> str:
    """The `## Rules` part: a table of every rule, then each rule in ruff's documentation sections."""
    rows = ["| id | name | severity | fix | detects |", "| --- | --- | --- | --- | --- |"]
    for r in RULES:
        rows.append(f"| [{r.id}]({_anchor(r)}) | {r.name} | {r.severity} | {'yes' if r.fixable else ''} | {r.summary} |")
    return "\n\n".join([MARKER, "## Rules", "\n".join(rows), *(r.docs().rstrip("\n") for r in RULES)]) + "\n"


def hand_written(text: str) -> str:
    """The part of docs/lint.md above the generated catalogue."""
    for cut in (MARKER, "## Rules"):
        if cut in text:
            return text[: text.index(cut)]
    return text.rstrip("\n") + "\n\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Generate docs/lint.md's rule catalogue from the rules.")
    ap.add_argument("--check", action="store_true", help="only report whether docs/lint.md is up to date")
    args = ap.parse_args(argv)
    current = DOC.read_text()
    wanted = hand_written(current) + render_rules()
    if args.check:
        if current != wanted:
            print(f"{DOC} is stale: run python -m troubleshooter.lint.docs", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
