"""The named API endpoints (`api_name`), as typed functions over the same tab callbacks.

Each returns JSON-able values (the same objects the CLI prints with `--format json`) and file
paths where a download is useful, so `gradio_client` users get data, not page fragments.
"""
from __future__ import annotations

from . import diagnose


def lint(code: str, file: str | None = None, select: str = "", ignore: str = "") -> tuple[dict, str, str]:
    """Lint pasted `code` or an uploaded .py/.ipynb `file`: (report JSON, report.md, report.json).
    `select`/`ignore`: comma-separated rule ids or prefixes (e.g. "AMP1", "AMP121,AMP123")."""
    result = diagnose.lint_script(code, file, select, ignore)
    return result["report"], result["md_path"], result["json_path"]


def rules(rule_id: str = "") -> tuple[list | dict, str]:
    """All rules (empty `rule_id`), or one rule and its Markdown explanation."""
    table = diagnose.rules_table()
    if not (rule_id or "").strip():
        return table, ""
    text = diagnose.explain(rule_id)
    rid = rule_id.strip().upper()
    return next((r for r in table if r["id"] == rid), {"id": rid}), text
