"""CheckReport: the typed check result (JSON only at the edge) and the one renderer of it."""
from __future__ import annotations

import copy
import json
import pickle
from pathlib import Path

import pytest

from troubleshooter.engine import check_render as render
from troubleshooter.engine.alignment import AlignmentRow
from troubleshooter.engine.capability import CapabilityReport
from troubleshooter.engine.check import CHECKS, check_report, check_source
from troubleshooter.engine.check_report import BudgetInfo, CheckError, CheckReport
from troubleshooter.engine.headroom import HeadroomResult
from troubleshooter.engine.skiprate import SkipRateResult
from troubleshooter.findings import Finding
from troubleshooter.spec import SpecSource

PRESET = "mlp:in_features=32,hidden=32,depth=2,batch_size=8"
MISALIGNED = Path(__file__).parent / "fixtures" / "check" / "misaligned.yaml"


@pytest.fixture(scope="module")
def full_result() -> dict:
    """Every check on a tiny preset (two fp16 steps), as the engine returns it."""
    return check_source(SpecSource.preset(PRESET), device="cpu", steps=2, budget_s=60)


def test_round_trip_gives_exactly_the_check_json(full_result):
    report = CheckReport.from_dict(copy.deepcopy(full_result))
    assert report.to_dict() == full_result
    assert list(report.to_dict()) == list(full_result)  # same key order as `check --format json`
    assert json.dumps(report.to_dict(), indent=2) == json.dumps(full_result, indent=2)
    # the sections are the engine's own result classes, not dicts
    assert isinstance(report.capability, CapabilityReport)
    assert all(isinstance(r, AlignmentRow) for r in report.alignment) and report.alignment
    assert isinstance(report.skiprate, SkipRateResult) and len(report.skiprate.steps) == 2
    assert isinstance(report.headroom, HeadroomResult)
    assert set(report.nan["precisions"]) == {"fp32", "fp16", "bf16"}
    assert all(isinstance(f, Finding) for f in report.findings)
    assert isinstance(report.budget, BudgetInfo) and report.budget.budget_s == 60
    assert report.exit_code == full_result["exit_code"]


def test_the_report_pickles_as_the_worker_sends_it(full_result):
    report = CheckReport.from_dict(full_result)
    again = pickle.loads(pickle.dumps(report))
    assert again == report and again.to_dict() == full_result


def test_skipped_checks_errors_and_unknown_keys_survive():
    """A run with only one check, a failed one, and keys a newer engine added: nothing is lost."""
    d = check_source(SpecSource.preset(PRESET), device="cpu", only="alignment", steps=1, budget_s=30)
    assert d["skipped"] and d["nan"] is None
    d["errors"] = {"nan": {"kind": "failed", "precisions": ["fp16"], "message": "the nan check failed: boom",
                           "hint": "new key"}}
    d = {"newer_engine_key": {"x": 1}, **d}  # where a newer engine might put a key
    d["skiprate"] = {"a shape": "this reader does not know"}
    report = CheckReport.from_dict(d)
    assert report.to_dict() == d and list(report.to_dict()) == list(d)
    assert report.skiprate == {"a shape": "this reader does not know"}  # kept as the engine wrote it
    assert report.errors["nan"] == CheckError("failed", "the nan check failed: boom", ["fp16"], {"hint": "new key"})
    assert set(report.failed_checks) == {"nan"}
    text = render.render_text(report)
    assert "NOT VERIFIED" in text and "boom" in text and "No findings: nothing to fix" not in text
    with pytest.raises(ValueError, match="not a check report"):
        CheckReport.from_dict({"findings": []})


def test_check_report_wrapper_is_the_typed_check_source():
    report = check_report(SpecSource.yaml_file(MISALIGNED), device="cpu", only="alignment", steps=1, budget_s=30)
    assert isinstance(report, CheckReport)
    assert report.spec["source"] and {f.rule for f in report.findings} == {"AMP201"}
    assert report.exit_code == 1


def test_markdown_sections_and_text_say_the_same(full_result):
    report = CheckReport.from_dict(full_result)
    text = render.render_text(report)
    for name in CHECKS:
        section = render.section_markdown(report, name)
        assert section.startswith(f"#### {render.TITLES[name]}")
        assert render.markdown_to_text(section).strip() in text  # the CLI prints the page's section
    assert render.headline(report).replace("**", "") in text
    # every finding is in both, with its fix
    for f in report.findings:
        assert f.rule in render.findings_markdown(report) and f.suggestion in text


def test_markdown_to_text_reads_tables_escapes_and_folds():
    md = ("#### Title\n\nA **bold** `<top level>` and \\_x\\_.\n\n| a | b |\n| --- | --- |\n"
          "| 1 | long \\| cell |\n\n<details><summary>more</summary>\n\n| hidden |\n\n</details>\n")
    assert render.markdown_to_text(md) == "== Title\n  A bold <top level> and _x_.\n  a  b\n  1  long | cell\n"


def test_a_nan_in_every_precision_round_trips_and_reads_the_same():
    """A real planted fault (padding rows normalised by a zero norm): non-finite values are the
    finding, travel as "nan" strings, and both renderings name the module that makes them."""
    import sys

    sys.path.insert(0, str(MISALIGNED.parent))
    import nan_in_fp32_too as planted

    from troubleshooter.engine.check import run_check

    d = run_check(planted.zero_row_workload(), device="cpu", only="nan,headroom", budget_s=30)
    report = CheckReport.from_dict(json.loads(json.dumps(d)))
    assert report.to_dict() == d and isinstance(report.headroom, HeadroomResult)
    assert report.headroom.first_nonfinite == "0" and report.exit_code == 1
    nan_md = render.section_markdown(report, "nan")
    assert "NON-FINITE" in nan_md and "ZeroRowNormalise" in nan_md and "creates the nan" in nan_md
    assert render.markdown_to_text(nan_md).strip() in render.render_text(report)
    assert "max |x|" in render.render_text(report)  # escapes undone for the terminal


def test_a_cut_run_says_how_to_ask_for_more_in_each_surfaces_words(full_result):
    """Issue 28: the first answer lists what its budget cut and the budget that would fit the
    rest: an option on the command line, the page's control, the API's parameter."""
    cut = copy.deepcopy(full_result)
    cut["budget"] = {"budget_s": 9.0, "cut": ["skiprate: not run (its first step would not fit)"],
                     "exceeded_s": None, "suggested_s": 80.0, "more": "run again with --budget 80 to measure the rest"}
    report = CheckReport.from_dict(cut)
    assert report.to_dict()["budget"] == cut["budget"]
    assert "suggested_s" not in CheckReport.from_dict(full_result).to_dict()["budget"]  # nothing cut: as before
    cli, page, api = (render.budget_markdown(report, s) for s in ("cli", "page", "api"))
    assert "Time budget 9 s" in cli and "skiprate: not run" in page
    assert "`--budget 80`" in cli and "--" not in page.replace("(raise --budget)", "")
    assert "**Time budget (s), shared by the checks** to 80" in page and "budget_s=80" in api
    assert render.budget_markdown(report, "page") in render.status_markdown(report, "page")
