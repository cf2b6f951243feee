"""trace's steady state: after STEADY_AFTER identical clean steps the loss watch and the
output-gradient keeper stand down, and any deviation arms them again from the next step.

The child-process runs use tests/fixtures/trace/steady, a clean loop that deviates on the steps it
is told to: a loss op making log(0), gradients GradScaler must skip, autocast turning float16.
With STEADY_AFTER 3, steps 4 on run in steady state until something deviates; a skip lowers the
loss scale, so the step after it is not clean either."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from troubleshooter.trace import render_text, trace_script
from troubleshooter.trace.numerics import Numerics
from troubleshooter.trace.patches import install
from troubleshooter.trace.recorder import STEADY_AFTER, Recorder, _same_pattern

FIX = Path(__file__).parent / "fixtures" / "trace" / "steady"
LOSS_LOG_LINE = 7  # losses.py: the torch.log that meets 0 on a planted step
BACKWARD_LINE = 37  # train.py: scaler.scale(loss).backward()


def _trace(*args: str, steady: bool = True) -> dict:
    report = trace_script(FIX / "train.py", list(args), steps=20, timeout_s=90, steady=steady)
    json.dumps(report)
    return report


def _steady_steps(report: dict) -> list[int]:
    return [t["step"] for t in report["timeline"] if t.get("instruments") == "steady" and "loss" in t]


def _where(report: dict) -> set[tuple]:
    return {(f["rule"], Path(f["path"]).name if f["path"] else None, f["line"]) for f in report["findings"]}


# -- in process: what stands down, and what arms it again ------------------------------------
def _loop(rec: Recorder, num: Numerics, steps: int, extra_clip_at: int = -1) -> list[tuple[int, bool]]:
    """A small scaled loop; per step (ops the loss watch recorded, an output gradient kept)."""
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    x, y = torch.ones(2, 3), torch.zeros(2, 1)
    seen = []
    for step in range(steps):
        loss = ((model(x) - y) ** 2).mean()
        recorded = len(num.outside.records)
        scaler.scale(loss).backward()
        seen.append((recorded, bool(num._out_grads)))
        if step == extra_clip_at:  # a call the steps before did not make: a deviation
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    return seen


def _traced_loop(steady_after: int, **kw) -> tuple[Recorder, list]:
    rec = Recorder(steps=100, steady_after=steady_after)
    num = Numerics(rec, nan=False, headroom=False)
    rec.on_step = num.on_step
    installed = install(rec)
    try:
        seen = _loop(rec, num, **kw)
    finally:
        installed.remove()
        num.close()
    return rec, seen


def test_after_identical_clean_steps_the_loss_watch_and_gradient_keeper_stand_down():
    rec, seen = _traced_loop(STEADY_AFTER, steps=8)
    # steps 0-2 set the pattern (step 0's window differs: no previous update in it), 3 is the
    # third equal one, so 4 on run in steady state
    assert seen[:4] == [(3, True)] * 4 and seen[4:] == [(0, False)] * 4
    assert [t.get("instruments") for t in rec.timeline[:8]] == [None] * 4 + ["steady"] * 4
    assert rec.steady_steps == 4 and [bool(s.get("steady")) for s in rec.series] == [False] * 4 + [True] * 4
    # the record a steady step leaves is the full one: same events, same places
    strip = [[{k: v for k, v in e.items() if k not in ("scale_before", "scale_after")} for e in t["events"]]
             for t in rec.timeline[1:8]]
    assert all(events == strip[0] for events in strip)


def test_a_deviation_arms_everything_from_the_next_step_and_no_steady_keeps_it_armed():
    rec, seen = _traced_loop(STEADY_AFTER, steps=12, extra_clip_at=6)
    # step 6 (steady) makes an extra call: 7 is fully armed, and 7, 8, 9 are the three equal
    # clean steps that make 10 steady again
    assert [s[0] > 0 for s in seen] == [True] * 4 + [False] * 3 + [True] * 3 + [False] * 2
    assert rec.timeline[6].get("instruments") == "steady" and "instruments" not in rec.timeline[7]
    rec, seen = _traced_loop(0, steps=8)
    assert seen == [(3, True)] * 8 and rec.steady_steps == 0
    assert not any("instruments" in t for t in rec.timeline)


def test_a_grown_loss_scale_is_the_same_pattern_a_different_call_is_not():
    update = {"kind": "scaler.update", "path": "t.py", "line": 3, "function": "f"}
    a = [{**update, "scale_before": 2.0, "scale_after": 2.0}, (0, 1)]
    assert _same_pattern(a, [{**update, "scale_before": 2.0, "scale_after": 4.0}, (0, 1)])
    assert not _same_pattern(a, [{**update, "line": 4, "scale_before": 2.0, "scale_after": 2.0}, (0, 1)])
    assert not _same_pattern(a, [{**update, "scale_before": 2.0, "scale_after": 2.0}, (0, 2)])  # autocast count


# -- child processes: findings are not lost ------------------------------------------------------
@pytest.fixture(scope="module")
def planted() -> dict:
    """One run of each mode over the same deviations, each on a steady step: a non-finite loss op
    at step 5 (once; GradScaler skips it), a skip at step 10, autocast float16 from step 15."""
    args = ("--nan-at", "5", "--skip-at", "10", "--fp16-from", "15")
    return {"steady": _trace(*args), "full": _trace(*args, steady=False)}


def test_a_non_finite_loss_op_once_on_a_steady_step_is_reported_and_said_unlocalised(planted):
    full, steady = planted["full"], planted["steady"]
    assert ("AMP205", "losses.py", LOSS_LOG_LINE) in _where(full)  # the full tracer names the op
    assert not any("instruments" in t for t in full["timeline"]) and full["steady"]["enabled"] is False
    hit = [f for f in steady["findings"] if f["rule"] == "AMP205"]
    assert len(hit) == 1 and hit[0]["step"] == 5 and hit[0]["severity"] == "error"
    assert (Path(hit[0]["path"]).name, hit[0]["line"]) == ("train.py", BACKWARD_LINE)  # its step's backward()
    assert hit[0]["data"]["localised"] is False and hit[0]["data"]["instruments"] == "steady"
    assert "not localised" in hit[0]["message"] and "named from the next such step on" in hit[0]["message"]
    assert "--no-steady" in hit[0]["suggestion"]
    assert steady["nan"]["steady_unlocalised"][0]["step"] == 5
    assert {f["rule"] for f in steady["findings"]} == {f["rule"] for f in full["findings"]}


def test_a_skip_and_a_dtype_change_on_steady_steps_arm_everything_from_the_next_step(planted):
    steady, full = planted["steady"], planted["full"]
    timeline = {t["step"]: t for t in steady["timeline"]}
    assert timeline[10]["skipped"] and timeline[10].get("instruments") == "steady"  # the skip: steady
    assert "instruments" not in timeline[11]  # re-armed
    autocast = [e["dtype"] for e in timeline[15]["events"] if e["kind"] == "autocast"]
    assert autocast == ["float16"] and timeline[15].get("instruments") == "steady"
    assert "instruments" not in timeline[16]  # the new dtype is a new pattern: 15, 16, 17 set it
    assert _steady_steps(steady) == [4, 5, 10, 15, 18, 19]
    assert steady["skipped_steps"] == full["skipped_steps"] == [5, 10]
    # every finding of the full tracer but the op's line is given, at the same place
    assert _where(full) - {("AMP205", "losses.py", LOSS_LOG_LINE)} == \
        _where(steady) - {("AMP205", "train.py", BACKWARD_LINE)}
    text = render_text(steady)
    assert "Steady state: 6 of 20 steps ran with the loss watch" in text
    assert "Steady state" not in render_text(full)


def test_a_non_finite_loss_op_that_comes_back_is_named_where_the_full_tracer_names_it():
    steady = _trace("--nan-at", "5,6")
    hit = [f for f in steady["findings"] if f["rule"] == "AMP205"]
    assert [(Path(f["path"]).name, f["line"], f["step"]) for f in hit] == [("losses.py", LOSS_LOG_LINE, 6)]
    assert hit[0]["data"]["first_seen"] == {"step": 5, "instruments": "steady", "localised": False}
    assert "first seen at step 5" in hit[0]["message"]


def test_a_module_that_overflows_on_a_steady_step_is_named_on_that_step_as_before():
    # the forward's inputs are kept in steady state too: GradScaler's skip re-runs the forward
    # with the hooks, so a module's float16 overflow is localised on its first occurrence
    args = ("--fp16-from", "0", "--overflow-at", "5")
    steady, full = _trace(*args), _trace(*args, steady=False)
    assert {t["step"]: t.get("instruments") for t in steady["timeline"]}[5] == "steady"

    def nonfinite(report):
        return [(f["rule"], f["module"], f["step"], f["message"]) for f in report["findings"]
                if f["rule"] in ("AMP202", "AMP205", "AMP206")]

    assert nonfinite(steady) == nonfinite(full) and nonfinite(full)[0][1:3] == ("0", 5)
    assert steady["nan"]["steady_unlocalised"] == []
