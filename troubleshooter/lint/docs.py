"""Generate the rule documentation from the rules themselves (one source of truth).

    python -m troubleshooter.lint.docs          # rewrite docs/lint.md below the marker and docs/rules/*.md
    python -m troubleshooter.lint.docs --check  # exit 1 if either is stale

Everything above the marker in docs/lint.md is hand-written (usage, how it works); everything below,
and each rule's own page docs/rules/AMPnnn.md, is generated from each rule's summary, why, examples,
fix, known problems, fix safety and references. A rule's page is what its documentation link opens
(`rule_url`): SARIF's helpUri, the text output, the language server. Ids never change, so
docs/rules/AMPnnn.md is a stable address; set AMP_TROUBLESHOOTER_DOCS_URL to serve the pages from
elsewhere (a mirror, an internal wiki).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .. import REPOSITORY
from .rules import BY_ID, RULES

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "lint.md"
RULE_PAGES = ROOT / "docs" / "rules"
MARKER = "<!-- Generated from troubleshooter/lint/rules by `python -m troubleshooter.lint.docs`; edit the rules, not this part. -->"
DOCS_URL_ENV = "AMP_TROUBLESHOOTER_DOCS_URL"
DOCS_URL = f"{REPOSITORY}/blob/main/docs/rules"


def rule_url(rule_id: str) -> str:
    """The address of a rule's page: <docs url>/AMPnnn.md."""
    base = os.environ.get(DOCS_URL_ENV, "").strip() or DOCS_URL
    return f"{base.rstrip('/')}/{rule_id}.md"


def _anchor(rule) -> str:
    return f"#{rule.id.lower()}-{rule.name}-{rule.severity}"


def render_rules() -> str:
    """The `## Rules` part: a table of every rule, then each rule in ruff's documentation sections."""
    rows = ["| id | name | severity | fix | detects |", "| --- | --- | --- | --- | --- |"]
    for r in RULES:
        rows.append(f"| [{r.id}]({_anchor(r)}) | {r.name} | {r.severity} | {'yes' if r.fixable else ''} | {r.summary} |")
    return "\n\n".join([MARKER, "## Rules", "\n".join(rows), *(r.docs().rstrip("\n") for r in RULES)]) + "\n"


def render_page(rule) -> str:
    """docs/rules/AMPnnn.md: the rule's documentation as a page of its own."""
    body = rule.docs().split("\n", 1)[1].replace("\n#### ", "\n## ")
    module = type(rule).__module__.rsplit(".", 1)[-1]
    return (f"# {rule.id} {rule.name} ({rule.severity})\n\n"
            f"<!-- Generated from troubleshooter/lint/rules/{module}.py by `python -m troubleshooter.lint.docs`. -->\n"
            f"{body.rstrip()}\n\nEvery rule: [docs/lint.md](../lint.md#rules). Silence it on a line with "
            f"`# noqa: {rule.id}`.\n")


def hand_written(text: str) -> str:
    """The part of docs/lint.md above the generated catalogue."""
    for cut in (MARKER, "## Rules"):
        if cut in text:
            return text[: text.index(cut)]
    return text.rstrip("\n") + "\n\n"


def wanted_files() -> dict[Path, str]:
    """Every generated file and what it must hold."""
    files = {DOC: hand_written(DOC.read_text(encoding="utf-8")) + render_rules()}
    files.update({RULE_PAGES / f"{r.id}.md": render_page(r) for r in RULES})
    return files


def stale_files() -> list[str]:
    """Generated files that differ from the rules, are missing, or belong to no rule."""
    wanted = wanted_files()
    out = [str(p.relative_to(ROOT)) for p, text in wanted.items()
           if not p.is_file() or p.read_text(encoding="utf-8") != text]
    if RULE_PAGES.is_dir():
        out += [str(p.relative_to(ROOT)) for p in sorted(RULE_PAGES.glob("*.md")) if p.stem not in BY_ID]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Generate docs/lint.md's rule catalogue and docs/rules/*.md from the rules.")
    ap.add_argument("--check", action="store_true", help="only report whether the generated docs are up to date")
    args = ap.parse_args(argv)
    if args.check:
        stale = stale_files()
        if stale:
            print(f"stale: {', '.join(stale)}; run python -m troubleshooter.lint.docs", file=sys.stderr)
            return 1
        return 0
    RULE_PAGES.mkdir(exist_ok=True)
    for p in RULE_PAGES.glob("*.md"):
        if p.stem not in BY_ID:
            p.unlink()
    for path, text in wanted_files().items():
        path.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
