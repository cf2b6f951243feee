"""`lint --format sarif`: valid SARIF 2.1.0 that code scanning can place on the right line.

tests/sarif-schema-2.1.0.json is the OASIS SARIF 2.1.0 schema (errata 01), copied unchanged from
github.com/oasis-tcs/sarif-spec, sarif-2.1/schema/sarif-schema-2.1.0.json (commit a560296).
"""
import json
from pathlib import Path

import pytest

from troubleshooter.cli import main
from troubleshooter.lint import all_rules, lint_paths, lint_text
from troubleshooter.lint.sarif import notebook_line_index, to_sarif

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is a dev dependency (requirements-dev.txt)")

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "lint"
SCHEMA = json.loads((ROOT / "tests" / "sarif-schema-2.1.0.json").read_text())


def validate(log: dict) -> None:
    """The official schema, plus what GitHub code scanning adds: every result has a start line."""
    jsonschema.Draft4Validator(SCHEMA).validate(log)
    for r in log["runs"][0]["results"]:
        assert r["locations"][0]["physicalLocation"]["region"]["startLine"] >= 1


def sarif_cli(capsys, monkeypatch, cwd: Path, *paths: str) -> tuple[int, dict]:
    monkeypatch.chdir(cwd)
    code = main(["lint", *paths, "--format", "sarif", "--isolated"])
    return code, json.loads(capsys.readouterr().out)


def test_schema_file_is_the_official_one():
    assert SCHEMA["id"].startswith("https://docs.oasis-open.org/sarif/sarif/v2.1.0/")
    assert SCHEMA["properties"]["version"]["enum"] == ["2.1.0"]


def test_findings_become_valid_results_with_rule_ids_and_relative_locations(capsys, monkeypatch):
    code, log = sarif_cli(capsys, monkeypatch, ROOT, "tests/fixtures/lint/bad_AMP101.py",
                          "tests/fixtures/lint/bad_AMP106.py")
    validate(log)
    assert code == 1
    assert log["version"] == "2.1.0" and "sarif-schema-2.1.0" in log["$schema"]
    run = log["runs"][0]
    driver = run["tool"]["driver"]
    assert driver["name"] == "amp-troubleshooter" and driver["version"] and driver["informationUri"].startswith("https://")
    expected = lint_paths(["tests/fixtures/lint/bad_AMP101.py", "tests/fixtures/lint/bad_AMP106.py"])
    got = [(r["ruleId"], r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"],
            r["locations"][0]["physicalLocation"]["region"]["startLine"],
            r["locations"][0]["physicalLocation"]["region"]["startColumn"]) for r in run["results"]]
    assert got == [(f.rule, f.location.path, f.location.line, f.location.column) for f in expected.findings]
    assert ("AMP101", "tests/fixtures/lint/bad_AMP101.py", 13, 9) in got
    for r in run["results"]:
        assert r["locations"][0]["physicalLocation"]["artifactLocation"]["uriBaseId"] == "%SRCROOT%"
        assert driver["rules"][r["ruleIndex"]]["id"] == r["ruleId"]
        assert r["level"] == {"error": "error", "warning": "warning", "info": "note"}[
            next(f for f in expected.findings if f.rule == r["ruleId"]).severity.value]
    assert run["originalUriBaseIds"]["%SRCROOT%"]["uri"] == ROOT.as_uri() + "/"
    assert run["invocations"][0]["executionSuccessful"] is True


def test_rule_catalogue_carries_descriptions_help_and_default_level():
    log = to_sarif(lint_text("x = 1\n", path="clean.py"))
    validate(log)
    rules = log["runs"][0]["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules] == [r.id for r in all_rules()]
    for descriptor, rule in zip(rules, all_rules()):
        assert descriptor["name"] == rule.name
        assert descriptor["shortDescription"]["text"] == rule.summary and descriptor["fullDescription"]["text"]
        assert rule.fix in descriptor["help"]["text"] and descriptor["help"]["markdown"].startswith(f"# {rule.id}")
        assert descriptor["defaultConfiguration"]["level"] == {"error": "error", "warning": "warning",
                                                              "info": "note"}[str(rule.severity)]
    assert log["runs"][0]["results"] == []


def test_notebook_finding_points_at_its_cell_line_in_the_ipynb_file(capsys, monkeypatch):
    code, log = sarif_cli(capsys, monkeypatch, FIXTURES, "bad_notebook.ipynb")
    validate(log)
    results = log["runs"][0]["results"]
    assert results and code == 1
    raw_lines = (FIXTURES / "bad_notebook.ipynb").read_text().splitlines()
    for r in results:
        where = r["properties"]
        assert f"(cell {where['cell']}, line {where['cellLine']})" in r["message"]["text"]
        region = r["locations"][0]["physicalLocation"]["region"]
        cell_source = [c for c in json.loads((FIXTURES / "bad_notebook.ipynb").read_text())["cells"]
                       if c["cell_type"] == "code"][where["cell"] - 1]["source"]
        cell_line = "".join(cell_source).splitlines()[where["cellLine"] - 1]
        at_file = raw_lines[region["startLine"] - 1][region["startColumn"] - 1:]
        assert at_file.startswith(json.dumps(cell_line[where["cellColumn"] - 1:])[1:-1][:20])
    assert any(r["ruleId"] == "AMP101" and r["properties"]["cell"] == 3 for r in results)


def test_notebook_index_steps_over_markdown_cells_and_escapes():
    nb = {"cells": [{"cell_type": "markdown", "metadata": {}, "source": ["# x = 1\n"]},
                    {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                     "source": ["s = \"é\\t\"; y = f(s)\n", "z = 2"]}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    for ascii_only in (True, False):
        raw = json.dumps(nb, indent=1, ensure_ascii=ascii_only)
        lines = raw.splitlines()
        index = notebook_line_index(raw)
        first, second = index[(1, 1)], index[(1, 2)]
        assert lines[first.file_line - 1].strip().startswith('"s = ') and lines[second.file_line - 1].strip() == '"z = 2"'
        col = 'y = f(s)'
        at = first.file_column(len('s = "é\\t"; ') + 1)
        assert lines[first.file_line - 1][at - 1:].startswith(col)


@pytest.mark.parametrize("indent", [1, None], ids=["one-string-source", "minified"])
def test_notebook_in_another_layout_points_at_its_cells_source(tmp_path, capsys, monkeypatch, indent):
    """Code scanning needs a line on every result: where the cell's source starts, else line 1."""
    src = "import torch\nscaler = torch.cuda.amp.GradScaler()\n"
    nb = {"cells": [{"cell_type": "markdown", "metadata": {}, "source": "# notes"},
                    {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": src}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    text = json.dumps(nb, indent=indent)
    (tmp_path / "one.ipynb").write_text(text)
    line = next(i for i, t in enumerate(text.splitlines(), 1) if '"source": "import torch' in t)
    assert line > 1 if indent else line == 1
    _, log = sarif_cli(capsys, monkeypatch, tmp_path, "one.ipynb")
    validate(log)
    results = log["runs"][0]["results"]
    assert results, "the deprecated GradScaler spelling is a finding"
    for r in results:
        physical = r["locations"][0]["physicalLocation"]
        assert physical["artifactLocation"]["uri"] == "one.ipynb"
        assert physical["region"] == {"startLine": line}
        assert "(cell 1, line 2)" in r["message"]["text"]


def test_unreadable_inputs_are_notifications_not_results(tmp_path, capsys, monkeypatch):
    (tmp_path / "broken.py").write_text("def f(:\n")
    code, log = sarif_cli(capsys, monkeypatch, tmp_path, "broken.py", "missing.py")
    validate(log)
    assert code == 2
    run = log["runs"][0]
    assert run["results"] == [] and run["invocations"][0]["executionSuccessful"] is False
    notes = run["invocations"][0]["toolExecutionNotifications"]
    assert [n["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for n in notes] == ["broken.py", "missing.py"]
    assert notes[0]["locations"][0]["physicalLocation"]["region"]["startLine"] == 1


def test_paths_outside_the_working_folder_become_file_uris(tmp_path, capsys, monkeypatch):
    inside = tmp_path / "cwd"
    inside.mkdir()
    code, log = sarif_cli(capsys, monkeypatch, inside, str(FIXTURES / "bad_AMP101.py"))
    validate(log)
    uri = log["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]
    assert uri == {"uri": (FIXTURES / "bad_AMP101.py").as_uri()}


def test_realistic_clean_scripts_give_an_empty_but_valid_log(capsys, monkeypatch):
    code, log = sarif_cli(capsys, monkeypatch, FIXTURES, "good_script_nanogpt.py", "good_script_timm.py",
                          "good_script_trainer.py", "good_notebook.ipynb")
    validate(log)
    assert code == 0
    assert [r["level"] for r in log["runs"][0]["results"]] == ["note"] * len(log["runs"][0]["results"])
