"""AMP204: real fp16 steps with GradScaler; skips read from the public scale only."""
import json
import sys
from pathlib import Path

import pytest
import torch
from matplotlib.figure import Figure
from torch import nn

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "check"))
import check_workloads as cw  # noqa: E402

from troubleshooter.engine.check import jsonable  # noqa: E402
from troubleshooter.engine.skiprate import check_skiprate, summarize  # noqa: E402
from troubleshooter.engine.skiprate_plot import plot_skiprate  # noqa: E402
from troubleshooter.workload import Workload  # noqa: E402


def _series(skips, init=65536.0, loss=1.0):
    """A made-up per-step series: halve on a skip, keep the scale otherwise."""
    out, scale, calibrating = [], init, True
    for i, s in enumerate(skips):
        after = scale / 2 if s else scale
        calibrating = calibrating and s
        out.append({"step": i, "loss": loss, "scale_before": scale, "scale_after": after, "skipped": s,
                    "phase": "calibration" if calibrating else "training"})
        scale = after
    return out


def test_no_skips_is_fine():
    summary, rec = summarize(_series([False] * 10))
    assert rec["action"] == "fine" and rec["severity"] is None
    assert summary["skipped"] == 0 and summary["final_scale"] == 65536.0


def test_long_calibration_suggests_the_settled_scale():
    summary, rec = summarize(_series([True] * 5 + [False] * 10))
    assert summary["skipped_calibration"] == 5 and summary["skipped_after_calibration"] == 0
    assert rec == {**rec, "action": "lower_init_scale", "severity": "info", "init_scale": 2048.0}


def test_persistent_skipping_after_calibration_means_bf16():
    summary, rec = summarize(_series([True] + [False, True] * 6))
    assert summary["skipped_calibration"] == 1 and summary["skipped_after_calibration"] == 6
    assert rec["action"] == "bf16" and rec["severity"] == "warning"


def test_a_scale_below_one_means_bf16():
    _, rec = summarize(_series([True] * 18))
    assert rec["action"] == "bf16" and rec["severity"] == "error" and "below 1" in rec["reason"]


def test_still_calibrating_when_every_step_skipped_above_scale_one():
    summary, rec = summarize(_series([True] * 4))
    assert not summary["calibration_ended"]
    assert rec["action"] == "lower_init_scale" and rec["severity"] == "warning" and rec["init_scale"] == 4096.0


def test_non_finite_loss_on_every_step_means_bf16():
    _, rec = summarize(_series([True] * 4, loss=float("inf")))
    assert rec["action"] == "bf16" and "forward pass overflows" in rec["reason"]


def test_clean_model_trains_without_skips_and_is_reproducible():
    a = check_skiprate(cw.mlp((32, 64, 10), batch_size=16), steps=4, seed=3)
    b = check_skiprate(cw.mlp((32, 64, 10), batch_size=16), steps=4, seed=3)
    assert not a.findings and a.recommendation["action"] == "fine"
    assert [s["scale_after"] for s in a.steps] == [65536.0] * 4
    assert [s["loss"] for s in a.steps] == [s["loss"] for s in b.steps]
    assert a.steps[0]["loss"] != a.steps[1]["loss"]  # a new synthetic batch every step
    c = check_skiprate(cw.mlp((32, 64, 10), batch_size=16), steps=2, seed=4)
    assert c.steps[0]["loss"] != a.steps[0]["loss"]


def test_overflowing_model_skips_every_step_and_is_told_to_use_bf16():
    r = check_skiprate(cw.mlp((32, 64, 64, 10), batch_size=16, blow_up={2: 1e6}), steps=5)
    assert all(s["skipped"] and s["scale_after"] == s["scale_before"] / 2 for s in r.steps)
    (f,) = r.findings
    assert f.rule == "AMP204" and f.precision == "fp16" and f.severity.value == "error"
    assert r.recommendation["action"] == "bf16"
    d = r.to_dict()
    assert d["summary"]["nonfinite_losses"] == 5 and len(d["steps"]) == 5
    json.dumps(jsonable(d), allow_nan=False)


def test_steps_must_be_positive():
    with pytest.raises(ValueError):
        check_skiprate(cw.mlp(), steps=0)


def test_plot_marks_skips_and_calibration():
    section = {"init_scale": 65536.0, "summary": summarize(_series([True] * 3 + [False] * 3))[0],
               "recommendation": {"action": "lower_init_scale", "init_scale": 8192.0},
               "steps": _series([True] * 3 + [False] * 3)}
    fig = plot_skiprate(jsonable(section))
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert ax.get_yscale() == "log" and "3/6 steps skipped" in ax.get_title()
    labels = ax.get_legend_handles_labels()[1]
    assert any("skipped step (3)" in s for s in labels) and any("calibration (3 steps)" in s for s in labels)
    empty = plot_skiprate({"steps": []})
    assert isinstance(empty, Figure)
    collapsed = {"steps": _series([True] * 20, loss=float("nan"))}
    assert "scale 1 (no scaling)" in plot_skiprate(jsonable(collapsed)).axes[0].get_legend_handles_labels()[1]


def test_a_model_that_is_nan_in_fp32_is_not_blamed_on_fp16():
    r = check_skiprate(cw.mlp((16, 32, 10), batch_size=8, blow_up={0: float("nan")}), steps=2)
    assert r.recommendation["action"] == "fix_model" and not r.findings


def test_budget_stops_a_slow_probe_only_after_calibration_and_some_training(monkeypatch):
    """A time budget must not cut calibration short: that would hide a persistent overflow."""
    from troubleshooter.engine import skiprate as sr

    clock = iter(range(0, 10_000, 100))  # every step "takes" 100 s: always over a 1 s budget
    monkeypatch.setattr(sr.time, "perf_counter", lambda: next(clock))
    result = sr.check_skiprate(_budget_workload(), "cpu", steps=20, seed=0, budget_s=1.0)
    s = result.summary
    assert s["stopped_by_budget"] and s["steps_requested"] == 20
    assert s["steps"] == s["skipped_calibration"] + sr.MIN_STEPS_AFTER_CALIBRATION
    unbudgeted = sr.check_skiprate(_budget_workload(), "cpu", steps=6, seed=0, budget_s=None)
    assert unbudgeted.summary["steps"] == 6 and not unbudgeted.summary["stopped_by_budget"]


def _budget_workload():
    import torch
    from torch import nn

    from troubleshooter.workload import Workload

    def make_batch(n, device, gen):
        return (torch.randn(n, 16, generator=gen).to(device),), torch.randint(0, 8, (n,), generator=gen).to(device)

    return Workload(name="tiny", build_model=lambda: nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)),
                    make_batch=make_batch, loss_fn=nn.functional.cross_entropy,
                    make_optimizer=lambda p: torch.optim.SGD(p, lr=0.01), batch_size=8)


# ---------------------------------------------------------------- no precision cure for a model bug (issue 11.3)
def _planted():
    sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "check"))
    import nan_in_fp32_too

    return nan_in_fp32_too


def test_nan_gradients_that_fp32_shares_are_a_model_bug_not_a_lower_scale_or_bf16():
    r = check_skiprate(_planted().sqrt_norm_workload(), steps=4)
    assert r.summary["skipped"] == 4
    assert r.recommendation["action"] == "fix_model" and r.recommendation["fp32_finite"] is False
    assert not r.findings


def test_with_few_steps_no_smaller_init_scale_is_suggested_when_no_scale_works():
    """Output gradients of 1e5: past float16's 65504 even unscaled, finite in fp32."""

    def build():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 8))

    def batch(n, device, gen):
        return (torch.randn(n, 8, generator=gen).to(device),), None

    wl = Workload("big-grad", build, batch, lambda out, t: out.float().pow(2).mean() * 1e6,
                  lambda ps: torch.optim.SGD(ps, lr=0.0), 4)
    r = check_skiprate(wl, steps=3)
    assert r.summary["skipped"] == 3 and not r.summary["calibration_ended"]
    assert r.recommendation["action"] == "bf16" and r.recommendation["severity"] == "error"
    assert "init_scale" not in r.recommendation and "no loss scale works" in r.recommendation["reason"]


def test_a_lower_init_scale_is_suggested_for_this_device_when_one_works():
    r = check_skiprate(cw.mlp((16, 32, 10), batch_size=8, loss_weight=1e3), steps=3)
    assert r.recommendation["action"] == "lower_init_scale" and r.recommendation["fp32_finite"] is True
    assert "GradScaler('cpu', init_scale=8192)" in r.findings[0].suggestion
