"""The static AMP linter: parse a training script once, run every rule, return Findings.

Public API (used by the CLI and the app): `lint_text`, `lint_paths`, `LintReport`, `all_rules`,
`get_rule`, `explain_rule`, `fix_text`, and the formatters in `lint.output`.
"""
from .engine import LintReport, all_rules, explain_rule, get_rule, lint_paths, lint_text
from .fix import FixResult, fix_text

__all__ = ["LintReport", "lint_text", "lint_paths", "all_rules", "get_rule", "explain_rule", "fix_text", "FixResult"]
