import json

import pytest

from troubleshooter.findings import (
    Finding, Location, Severity, findings_to_json, findings_to_markdown, has_problems, worst_severity,
)


def _f(sev, **loc):
    return Finding("AMP101", "clip-before-unscale", sev, "clipped scaled grads", "unscale first",
                   Location(**loc))


def test_json_shape_has_contract_keys():
    payload = json.loads(findings_to_json([_f("error", path="t.py", line=3, column=5)], errors=[]))
    row = payload["findings"][0]
    for key in ("path", "line", "column", "rule", "name", "severity", "message", "suggestion",
                "module", "precision", "data"):
        assert key in row
    assert row["severity"] == "error" and row["line"] == 3 and payload["errors"] == []


def test_round_trip():
    f = Finding("AMP202", "fp16-overflow", "warning", "m", "s", Location(module="layers.3"),
                precision="fp16", data={"max_abs": 7e4})
    assert Finding.from_dict(f.to_dict()) == f


def test_severity_parsing_and_ranking():
    assert Severity.parse("ERROR") is Severity.ERROR
    with pytest.raises(ValueError):
        Severity.parse("fatal")
    assert worst_severity([_f("info"), _f("warning")]) is Severity.WARNING
    assert not has_problems([_f("info")])
    assert has_problems([_f("info"), _f("warning")])
    assert worst_severity([]) is None


def test_markdown_table_escapes_pipes_and_orders_by_severity():
    md = findings_to_markdown([_f("info", path="a.py", line=1), _f("error", path="a.py", line=9)], "Lint")
    rows = [line for line in md.splitlines() if line.startswith("| ") and "AMP" in line]
    assert "error" in rows[0] and "info" in rows[1]
    assert "a.py:9" in rows[0]
    assert "No findings" in findings_to_markdown([])


def test_location_describe():
    assert Location(path="t.py", line=3, column=1).describe() == "t.py:3:1"
    assert Location(path="n.ipynb", cell=2, line=4).describe() == "n.ipynb [cell 2] 4"
    assert Location(module="0").describe() == "module '0'"


def test_text_line_and_format_bytes():
    from troubleshooter.units import format_bytes

    assert _f("warning").text_line() == "warning AMP101 clip-before-unscale: clipped scaled grads -> unscale first"
    assert format_bytes(None) == "n/a" and format_bytes(None, "—") == "—"
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(3 * 1024**3) == "3.0 GiB"


def test_short_times_never_read_as_zero_seconds():
    """A check cut by the budget said "expected to take about 0 s ... more than its 0 s share"."""
    import time

    from troubleshooter.engine.check import _cut_entry
    from troubleshooter.units import format_seconds

    assert [format_seconds(s) for s in (12.34, 1.0, 0.48, 0.1, 0.0312, 0.0)] == \
        ["12.3 s", "1.0 s", "0.48 s", "0.10 s", "31 ms", "0 ms"]
    cut = _cut_entry("headroom", 0.48, time.perf_counter() + 0.3)["message"]
    assert "about 0.48 s" in cut and "s share of the time budget" in cut and " 0 s" not in cut
    spent = _cut_entry("nan", 0.32, time.perf_counter() - 1.0)["message"]
    assert "about 0.32 s" in spent and "its share of the time budget was already spent" in spent


def test_jsonable_keeps_each_reports_nonfinite_convention():
    import torch

    from troubleshooter.jsonsafe import jsonable

    data = {"loss": float("inf"), 3: (float("nan"), -float("inf"), 1.5), "t": torch.tensor(2.0),
            "dtype": torch.float16, "ok": True, "n": None}
    assert jsonable(data) == {"loss": "inf", "3": ["nan", "-inf", 1.5], "t": 2.0, "dtype": "torch.float16",
                              "ok": True, "n": None}
    assert jsonable(data, nonfinite="null")["3"] == [None, None, 1.5]
    json.dumps(jsonable(data, nonfinite="null"), allow_nan=False)
