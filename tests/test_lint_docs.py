"""docs/lint.md's rule catalogue is generated from the rules and must match them."""
from troubleshooter.lint import all_rules
from troubleshooter.lint.docs import DOC, DOCS_URL_ENV, MARKER, RULE_PAGES, hand_written, render_rules, rule_url, \
    stale_files

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


def test_rule_pages_are_generated_and_current():
    """docs/rules/AMPnnn.md (what every documentation link opens) matches the rules, one page per rule."""
    assert stale_files() == [], "run: python -m troubleshooter.lint.docs"
    assert sorted(p.stem for p in RULE_PAGES.glob("*.md")) == [r.id for r in all_rules()]
    for r in all_rules():
        page = (RULE_PAGES / f"{r.id}.md").read_text()
        assert page.startswith(f"# {r.id} {r.name} ({r.severity})\n") and r.example_bad.strip() in page


def test_rule_urls_point_at_the_rule_pages(monkeypatch):
    monkeypatch.delenv(DOCS_URL_ENV, raising=False)
    assert rule_url("AMP101").startswith("https://") and rule_url("AMP101").endswith("/docs/rules/AMP101.md")
    monkeypatch.setenv(DOCS_URL_ENV, "https://wiki.example/amp/")
    assert rule_url("AMP127") == "https://wiki.example/amp/AMP127.md"
