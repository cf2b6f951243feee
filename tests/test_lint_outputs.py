"""`lint --format gitlab|junit|json-lines|concise|full|sarif` and `--statistics`, each checked against the
format its consumers read: GitLab's documented code quality fields, the JUnit XML structure CI systems
parse, the official SARIF 2.1.0 schema (with rule documentation links and fixes)."""
import json
import xml.etree.ElementTree as ET
from pathlib import Path
from urllib.parse import urlparse

import pytest

from troubleshooter.cli import main
from troubleshooter.lint import lint_paths
from troubleshooter.lint.docs import rule_url
from troubleshooter.lint.edits import apply_edits

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = "tests/fixtures/lint"
INPUTS = [f"{FIXTURES}/bad_AMP101.py", f"{FIXTURES}/bad_AMP121.py", f"{FIXTURES}/bad_notebook.ipynb",
          f"{FIXTURES}/bad_AMP106.py"]


@pytest.fixture(scope="module")
def expected():
    """What `lint` finds in INPUTS (plus a broken file), the reference every format must carry."""
    return lint_paths(INPUTS)


def lint_cli(capsys, monkeypatch, *argv, cwd=ROOT):
    monkeypatch.chdir(cwd)
    code = main(["lint", *argv, "--isolated"])
    return code, capsys.readouterr()


def test_gitlab_code_quality_has_the_documented_fields(capsys, monkeypatch, expected, tmp_path):
    """GitLab's documented fields: description, check_name, fingerprint, severity (info, minor, major,
    critical, blocker), location.path relative to the repository, location.lines.begin (gitlabhq
    doc/ci/testing/code_quality.md, "Implement a custom tool")."""
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n")
    code, out = lint_cli(capsys, monkeypatch, *INPUTS, str(broken), "--format", "gitlab")
    assert code == 2 and not out.out.startswith("\ufeff")
    issues = json.loads(out.out)
    assert isinstance(issues, list) and len(issues) == len(expected.findings) + 1
    for issue in issues:
        assert isinstance(issue["description"], str) and issue["description"]
        assert isinstance(issue["check_name"], str) and issue["check_name"]
        assert issue["severity"] in {"info", "minor", "major", "critical", "blocker"}
        assert isinstance(issue["location"]["lines"]["begin"], int) and issue["location"]["lines"]["begin"] >= 1
        assert isinstance(issue["fingerprint"], str) and issue["fingerprint"]
    assert len({i["fingerprint"] for i in issues}) == len(issues), "GitLab shows issues with one fingerprint once"
    for issue, f in zip(issues, expected.findings):
        assert issue["check_name"] == f"{f.rule} {f.name}"
        assert issue["location"]["path"] == f.location.path and not Path(issue["location"]["path"]).is_absolute()
        assert issue["severity"] == {"error": "critical", "warning": "major", "info": "info"}[f.severity.value]
        if f.location.cell is None:
            assert issue["location"]["lines"]["begin"] == f.location.line
    notebook = next(i for i, f in zip(issues, expected.findings) if f.location.cell is not None)
    raw = (ROOT / FIXTURES / "bad_notebook.ipynb").read_text().splitlines()
    assert "clip_grad_norm_" in raw[notebook["location"]["lines"]["begin"] - 1]
    assert issues[-1]["check_name"] == "input-error" and issues[-1]["severity"] == "blocker"
    # the fingerprint survives code moving down a line (it names no line number)
    moved = tmp_path / "moved.py"
    source = (ROOT / INPUTS[0]).read_text()
    for text in (source, "\n" + source):
        moved.write_text(text)
        _, out = lint_cli(capsys, monkeypatch, "moved.py", "--format", "gitlab", cwd=tmp_path)
        prints = [i["fingerprint"] for i in json.loads(out.out)]
        if text == source:
            first = prints
    assert prints == first


def test_junit_xml_has_the_structure_ci_systems_parse(capsys, monkeypatch, expected, tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n")
    code, out = lint_cli(capsys, monkeypatch, *INPUTS, str(broken), "--format", "junit")
    assert code == 2 and out.out.startswith('<?xml version="1.0" encoding="UTF-8"?>')
    root = ET.fromstring(out.out.split("\n", 1)[1])
    assert root.tag == "testsuites" and root.get("name") == "amp-troubleshooter"
    suites = root.findall("testsuite")
    cases = root.findall("testsuite/testcase")
    for el, children in [(root, cases)] + [(s, s.findall("testcase")) for s in suites]:
        assert int(el.get("tests")) == len(children)
        assert int(el.get("failures")) == sum(1 for c in children if c.find("failure") is not None)
        assert int(el.get("errors")) == sum(1 for c in children if c.find("error") is not None)
    assert {s.get("name") for s in suites} == {f.location.path for f in expected.findings} | {str(broken)}
    for case in cases:
        assert case.get("name") and case.get("classname")
    failing = [c for c in cases if c.find("failure") is not None]
    assert len(failing) == sum(1 for f in expected.findings if f.severity.value != "info")
    for case in failing:
        failure = case.find("failure")
        assert failure.get("type") in {"error", "warning"} and failure.get("message").startswith(case.get("name")[:6])
        assert "fix: " in failure.text and "docs: https://" in failure.text
    infos = [c for c in cases if c.find("failure") is None and c.find("error") is None]
    assert len(infos) == sum(1 for f in expected.findings if f.severity.value == "info")
    assert all(c.find("system-out").text.startswith("info: ") for c in infos)
    (error,) = [c.find("error") for c in cases if c.find("error") is not None]
    assert "syntax error" in error.get("message")
    from troubleshooter.lint.engine import LintReport
    from troubleshooter.lint.junit import format_junit
    from troubleshooter.lint.source import LintError
    odd = format_junit(LintReport(errors=[LintError("odd\x0bname.py", "control \x01 character")]))
    assert ET.fromstring(odd.split("\n", 1)[1]).find("testsuite").get("name") == "odd\ufffdname.py"
    code, out = lint_cli(capsys, monkeypatch, f"{FIXTURES}/good_AMP101.py", "--format", "junit")
    clean = ET.fromstring(out.out.split("\n", 1)[1])
    assert code == 0 and clean.get("tests") == "1" and clean.get("failures") == "0"


def test_json_lines_concise_full_and_statistics(capsys, monkeypatch, expected):
    code, out = lint_cli(capsys, monkeypatch, *INPUTS, "--format", "json-lines")
    rows = [json.loads(line) for line in out.out.splitlines()]
    whole = json.loads(lint_cli(capsys, monkeypatch, *INPUTS, "--format", "json")[1].out)
    assert code == 1 and rows == whole["findings"]
    assert all(r["fixable"] == (r["fix"] is not None) for r in rows) and any(r["fixable"] for r in rows)
    _, text = lint_cli(capsys, monkeypatch, *INPUTS)
    _, full = lint_cli(capsys, monkeypatch, *INPUTS, "--format", "full")
    assert full.out == text.out
    _, concise = lint_cli(capsys, monkeypatch, *INPUTS, "--format", "concise")
    lines = concise.out.splitlines()
    assert len(lines) == len(expected.findings) + 2  # the summary and the fixable count
    assert lines[0].startswith(f"{INPUTS[0]}:13:9: AMP101 [error] [*] gradients are clipped")
    fixable = sum(1 for f in expected.findings if expected.fix_of(f))
    assert f"[*] {fixable} fixable with --fix" in text.out and text.out.count(" [*]\n") == fixable
    for rule in {f.rule for f in expected.findings}:
        assert rule_url(rule) in text.out
    code, stats = lint_cli(capsys, monkeypatch, *INPUTS, "--statistics", "--format", "json")
    table = json.loads(stats.out)
    counts = {}
    for f in expected.findings:
        counts[f.rule] = counts.get(f.rule, 0) + 1
    assert code == 1 and {r["code"]: r["count"] for r in table} == counts
    assert [r["count"] for r in table] == sorted(counts.values(), reverse=True)
    _, stats = lint_cli(capsys, monkeypatch, *INPUTS, "--statistics")
    first = stats.out.splitlines()[0].split("\t")
    assert (int(first[0]), first[1], first[2]) == (table[0]["count"], table[0]["code"], "[*]")


def test_sarif_links_every_rule_to_its_page_and_carries_safe_fixes(capsys, monkeypatch, expected):
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((ROOT / "tests" / "sarif-schema-2.1.0.json").read_text())
    _, out = lint_cli(capsys, monkeypatch, *INPUTS, "--format", "sarif")
    log = json.loads(out.out)
    jsonschema.Draft4Validator(schema).validate(log)
    run = log["runs"][0]
    assert run["columnKind"] == "unicodeCodePoints"
    for rule in run["tool"]["driver"]["rules"]:
        url = urlparse(rule["helpUri"])
        assert url.scheme == "https" and url.netloc and url.path.endswith(f"/{rule['id']}.md")
        assert (ROOT / "docs" / "rules" / f"{rule['id']}.md").is_file()
    with_fix = [(r, f) for r, f in zip(run["results"], expected.findings) if "fixes" in r]
    assert len(with_fix) == sum(1 for f in expected.findings if expected.fix_of(f) and f.location.cell is None)
    assert {f.rule for _, f in with_fix} == {"AMP101", "AMP106"}
    for result, finding in with_fix:
        (change,) = result["fixes"][0]["artifactChanges"]
        assert change["artifactLocation"] == result["locations"][0]["physicalLocation"]["artifactLocation"]
        source = (ROOT / finding.location.path).read_text()
        edits = expected.fix_of(finding).edits
        regions = [(r["deletedRegion"]["startLine"], r["deletedRegion"]["startColumn"], r["deletedRegion"]["endLine"],
                    r["deletedRegion"]["endColumn"], r["insertedContent"]["text"]) for r in change["replacements"]]
        assert regions == [(e.line, e.column, e.end_line, e.end_column, e.content) for e in edits]
        assert apply_edits(source, edits) != source
