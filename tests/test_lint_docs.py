"""docs/lint.md's rule catalogue is generated from the rules and must match them."""
from troubleshooter.lint import all_rules
from troubleshooter.lint.docs import DOC, MARKER, hand_written, render_rules

RUFF_SECTIONS = ("What it does", "Why is this bad?", "Example", "Use instead", "Known problems", "Fix safety",
                 "References")


def test_docs_lint_md_matches_the_rules():
    text = DOC.read_text()
    assert MARKER in text
    assert text == hand_written(text) + render_rules(), "run: python -m troubleshooter.lint.docs"


def test_every_rule_has_every_ruff_section():
    for r in all_rules():
        doc = r.docs()
        for section in RUFF_SECTIONS:
            assert f"#### {section}\n" in doc, (r.id, section)
        assert r.known_problems and r.references, r.id
        if r.fixable:
            assert r.fix_safety, r.id
