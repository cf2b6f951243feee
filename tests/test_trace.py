"""trace: runnable fixture scripts under tests/fixtures/trace, each run once in a child process.

Every run is a real `python train.py ARGS` on CPU (fp16/bf16 autocast and GradScaler work there)
for a few steps; each expected rule must fire with its path in the file where the offending call
ran, and the clean script must give no error or warning.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from troubleshooter.errors import UserError
from troubleshooter.trace import exit_code, render_markdown, render_text, trace_script
from troubleshooter.trace.report import render_github

FIX = Path(__file__).parent / "fixtures" / "trace"


def trace(folder: str, *args: str, **kw) -> dict:
    kw.setdefault("steps", 5)
    kw.setdefault("timeout_s", 90)
    report = trace_script(FIX / folder / "train.py", list(args), **kw)
    json.dumps(report)  # the contract: JSON-serialisable as returned
    return report


def by_rule(report: dict, rule: str) -> dict:
    hits = [f for f in report["findings"] if f["rule"] == rule]
    assert hits, f"{rule} not found in {[(f['rule'], f['message']) for f in report['findings']]}"
    return hits[0]


def problems(report: dict) -> list[tuple[str, str]]:
    return [(f["rule"], f["message"]) for f in report["findings"] if f["severity"] in ("error", "warning")]


# -- protocol mistakes in a helper module, behind an argparse option -----------------------
def test_several_protocol_mistakes_located_in_the_helper(tmp_path):
    r = trace("helpers", "--mistake", "clip_before_unscale,save_no_scaler,step_in_autocast,backward_in_autocast",
              "--ckpt", str(tmp_path / "ckpt.pt"))
    assert r["exit"]["status"] == "stopped" and r["steps_observed"] == 5
    assert set(r) >= {"script", "argv", "device", "steps_observed", "exit", "findings", "timeline", "scale",
                      "skipped_steps", "nan", "headroom"}
    expected = {"AMP101": ("error", "clip_grad_norm_"), "AMP110": ("warning", "torch.save"),
                "AMP105": ("warning", "optimizer step"), "AMP104": ("warning", "backward()")}
    for rule, (severity, text) in expected.items():
        f = by_rule(r, rule)
        assert f["path"].endswith("helpers/amp_utils.py"), f
        assert f["severity"] == severity and text in f["message"]
        assert f["data"]["seen"] == "seen at run time"
    assert by_rule(r, "AMP101")["line"] == 36  # the clip_grad_norm_ call in amp_utils.py
    assert by_rule(r, "AMP101")["step"] == 0 and by_rule(r, "AMP110")["step"] == 2
    assert len(r["scale"]) == 5 and all(s == 65536.0 for s in r["scale"])
    assert exit_code(r) == 1
    assert r["argv"][1:3] == ["--mistake", "clip_before_unscale,save_no_scaler,step_in_autocast,backward_in_autocast"]
    kinds = [e["kind"] for e in r["timeline"][0]["events"]]
    assert kinds[:2] == ["autocast", "backward"] and "scaler.step" in kinds and "scaler.update" in kinds


@pytest.mark.parametrize("mistake, rule, extra", [
    ("direct_step", "AMP116", []),
    ("no_scaler", "AMP103", []),
    ("unscaled_backward", "AMP115", []),
    ("update_per_microbatch", "AMP109", ["--accum", "2"]),
    ("step_without_update", "AMP113", []),
])
def test_each_protocol_rule_in_the_helper(mistake, rule, extra):
    r = trace("helpers", "--mistake", mistake, *extra)
    f = by_rule(r, rule)
    assert f["path"].endswith("helpers/amp_utils.py") and f["severity"] == "error"
    assert {x[0] for x in problems(r)} <= {rule, "AMP290"}, problems(r)  # nothing else blamed


def test_unscale_twice_is_found_and_the_exception_explained():
    r = trace("helpers", "--mistake", "unscale_twice")
    assert r["exit"]["status"] == "raised"
    exc = r["exit"]["exception"]
    assert exc["type"] == "RuntimeError" and "unscale_() has already been called" in exc["message"]
    assert exc["path"].endswith("helpers/amp_utils.py") and exc["explain"]
    assert by_rule(r, "AMP112")["line"] == exc["line"]
    raised = by_rule(r, "AMP290")
    assert raised["severity"] == "error" and raised["data"]["related_rule"] == "AMP112"
    assert "Traceback" in render_text(r)


def test_scheduler_stepping_on_skipped_steps_and_skip_rate():
    r = trace("helpers", "--mistake", "sched_on_skip", "--init-scale", "1e38")
    assert r["skipped_steps"] == [0, 1, 2, 3, 4]
    f = by_rule(r, "AMP107")
    assert f["severity"] == "warning" and f["path"].endswith("helpers/amp_utils.py")
    skip = by_rule(r, "AMP204")
    assert skip["data"]["scale_trajectory"][0] == pytest.approx(1e38, rel=1e-6) and skip["data"]["skipped_steps"] == [0, 1, 2, 3, 4]
    assert r["scale"][0] == pytest.approx(1e38, rel=1e-6) and r["scale"][-1] < r["scale"][0] / 8


def test_a_fused_optimizers_skipped_steps_are_counted():
    """GradScaler calls a fused optimizer's step() even on inf/NaN gradients (the kernel skips the
    update): the trace counted such steps as taken ("skipped steps: none" beside a halving scale)
    and missed the scheduler stepping on them. The scale's backoff in update() now tells them."""
    r = trace("helpers", "--mistake", "sched_on_skip", "--init-scale", "1e38", "--optimizer", "adamw_fused")
    assert r["skipped_steps"] == [0, 1, 2, 3, 4]
    assert by_rule(r, "AMP107")["severity"] == "warning"


def test_a_scheduler_a_framework_stepped_on_a_fused_skip_is_amp145():
    from troubleshooter.trace.framework_report import adjust

    raw = {"framework": {"frameworks": [{"framework": "accelerate", "scaler": True}], "framework_schedulers": 3,
                         "framework_scalers": 1},
           "precision": {"scalers": [1]},
           "series": [{"step": 0, "skipped": True, "fused_step": True}, {"step": 1, "skipped": True}],
           "violations": [{"rule": "AMP107", "message": "stepped", "data": {"skipped_step": s}} for s in (0, 1)]}
    rules = [v["rule"] for v in adjust(raw)["violations"]]
    assert rules == ["AMP145", "AMP133"]  # the fused skip is Accelerate's blind spot; the other, the script's


# -- mistakes in another file: a trainer class, a make_model() that calls .half() ------------
def test_trainer_class_in_another_file():
    r = trace("trainer")
    f = by_rule(r, "AMP101")
    assert f["path"].endswith("trainer/trainer.py") and f["line"] == 21


def test_half_model_made_in_make_model():
    r = trace("halfmodel")
    f = by_rule(r, "AMP111")
    assert f["path"].endswith("halfmodel/models.py") and f["line"] == 8
    assert f["data"]["dtype"] == "float16" and f["data"]["half_params"] == 4


# -- numerics ----------------------------------------------------------------------------
def test_fp16_overflow_localised_without_nan_flag():
    r = trace("numerics", "--kind", "overflow")
    f = by_rule(r, "AMP202")
    assert f["module"] == "block" and f["precision"] == "fp16"
    assert f["path"].endswith("numerics/model.py") and f["line"] == 14  # Amplify.forward
    assert by_rule(r, "AMP204")["severity"] == "error"
    assert f["data"]["step"] == 0 and r["nan"]["mode"] == "on-demand" and r["nan"]["reruns"] >= 1


def test_nan_in_forward_localised():
    r = trace("numerics", "--kind", "nan", nan=True)
    f = by_rule(r, "AMP205")
    assert f["module"] == "block" and f["data"]["step"] == 0 and f["path"].endswith("numerics/model.py")


@pytest.mark.parametrize("kind, rule", [("nan", "AMP205"), ("backward", "AMP206")])
def test_bf16_nonfinite_localised_on_the_failing_step_without_nan_flag(kind, rule):
    # no GradScaler: the optimizer would write NaN into the weights, so the failing step itself is
    # re-run with hooks before the optimizer step, and the culprit is 'block', not the first layer
    r = trace("numerics", "--kind", kind, "--precision", "bf16")
    f = by_rule(r, rule)
    assert f["module"] == "block" and f["precision"] == "bf16" and f["data"]["step"] == 0
    assert f["path"].endswith("numerics/model.py") and "re-run" in f["data"]["localised_by"]
    assert [x[0] for x in problems(r)] == [rule]


# -- clean, raises, never stops, reads sys.argv ----------------------------------------------
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_clean_script_has_no_error_or_warning(precision):
    calls = []
    r = trace("clean", "--precision", precision, headroom=precision == "fp16",
              progress=lambda fraction, message: calls.append((fraction, message)))
    assert problems(r) == [] and exit_code(r) == 0
    assert calls[0][0] == 0.0 and calls[-1] == (1.0, "trace finished")
    assert all(0.0 <= f <= 1.0 for f, _ in calls)
    assert r["exit"]["status"] == "stopped" and r["steps_observed"] == 5
    if precision == "fp16":
        assert len(r["headroom"]["steps"]) == 5 and r["scale"][0] == 65536.0
    else:
        assert r["scale"] == [None] * 5
    assert "No findings" in render_markdown(r) or "Seen at run time" in render_markdown(r)
    # what tracing cost, measured in the run: 5 steps give 4 step-to-step intervals
    cost = r["overhead"]
    assert cost["steps_timed"] == 4 and 0 < cost["per_step_ms"] < cost["step_ms"] and cost["share"] > 0
    assert f"Tracing added about {cost['per_step_ms']:.3g} ms per step" in render_text(r)
    assert "Tracing added about" in render_markdown(r)


def test_script_that_raises_in_its_own_code():
    r = trace("raises")
    assert r["exit"]["status"] == "raised" and r["steps_observed"] == 1
    f = by_rule(r, "AMP290")
    assert f["path"].endswith("raises/train.py") and f["line"] == 10
    assert "dtype" in f["message"] and exit_code(r) == 1
    assert render_github(r).startswith("::error file=")


@pytest.mark.fresh_trace_child  # the launch as users get it: a fresh interpreter, stopped and cleaned up
def test_script_that_never_stops_hits_the_time_limit():
    r = trace("forever", timeout_s=8)
    assert r["exit"]["status"] == "timeout" and r["steps_observed"] == 0
    f = by_rule(r, "AMP291")
    assert f["path"].endswith("forever/train.py") and f["line"] == 8
    assert exit_code(r) == 1


def test_script_reading_argv_runs_as_python_script_args_from_a_worker(tmp_path):
    from troubleshooter.worker import run_in_worker

    r = run_in_worker(trace_script, FIX / "argv" / "train.py", ["--lr", "0.5"], steps=20,
                      cwd=str(tmp_path), timeout_s=120)
    assert r["exit"]["status"] == "finished", r["exit"]
    assert r["steps_observed"] == 3 and problems(r) == []
    assert f"cwd {tmp_path}" in r["exit"]["stdout_tail"] and "lr 0.5" in r["exit"]["stdout_tail"]


# -- bad input: clear errors, no child ------------------------------------------------------
def test_bad_input_raises_user_error(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        trace_script(tmp_path / "missing.py")
    bad = tmp_path / "bad.py"
    bad.write_text("def f(:\n")
    with pytest.raises(UserError, match="syntax error at line 1"):
        trace_script(bad)
    ok = tmp_path / "ok.py"
    ok.write_text("pass\n")
    with pytest.raises(UserError, match="steps"):
        trace_script(ok, steps=0)
    with pytest.raises(UserError, match="unknown device"):
        trace_script(ok, device="tpu")
    with pytest.raises(UserError, match="list of strings"):
        trace_script(ok, args="--lr 1")


@pytest.mark.fresh_trace_child  # the launch as users get it: a fresh interpreter, stopped and cleaned up
def test_nothing_the_script_starts_outlives_the_trace(tmp_path):
    """A setsid() child and a double-forked daemon escape the script's process group; the trace
    still stops them (they re-parent to it as a subreaper)."""
    pid_file = tmp_path / "pids"
    script = tmp_path / "train.py"
    script.write_text(
        "import os, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True)\n"
        "r, w = os.pipe()\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    daemon = os.fork()\n"
        "    if daemon == 0:\n"
        "        time.sleep(600)\n"
        "    os.write(w, str(daemon).encode()); os._exit(0)\n"
        "os.wait()\n"
        f"open({str(pid_file)!r}, 'w').write(f'{{child.pid}} {{os.read(r, 32).decode()}}')\n")
    r = trace_script(script, steps=1, timeout_s=60)
    assert r["exit"]["status"] == "finished", r["exit"]
    pids = [int(p) for p in pid_file.read_text().split()]
    assert len(pids) == 2 and not [p for p in pids if os.path.exists(f"/proc/{p}")]


def test_two_fused_optimizers_on_one_scaler_each_have_their_own_skip(tmp_path):
    """One update() lowers the scale when either optimizer found inf/NaN, but GradScaler skips only
    that optimizer's update: each fused step's own found_inf says which one was skipped."""
    script = tmp_path / "gan.py"
    script.write_text(
        "import torch\n"
        "torch.manual_seed(0)\n"
        "g, d = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)\n"
        "opt_g = torch.optim.AdamW(g.parameters(), lr=1e-3, fused=True)\n"
        "opt_d = torch.optim.AdamW(d.parameters(), lr=1e-3, fused=True)\n"
        "scaler = torch.amp.GradScaler('cpu', init_scale=1024.0)\n"
        "for step in range(3):\n"
        "    x = torch.randn(8, 4)\n"
        "    with torch.autocast('cpu', dtype=torch.float16):\n"
        "        loss_d = d(x).float().mean()\n"
        "        loss_g = g(x).float().pow(2).mean()\n"
        "    scaler.scale(loss_d).backward()\n"
        "    scaler.scale(loss_g).backward()\n"
        "    d.weight.grad[0, 0] = float('inf')  # only the discriminator overflows\n"
        "    scaler.step(opt_d)\n"
        "    scaler.step(opt_g)\n"
        "    scaler.update()\n"
        "    opt_d.zero_grad(); opt_g.zero_grad()\n")
    from troubleshooter.trace import trace_script

    r = trace_script(script, [], steps=6, timeout_s=90)
    taken = [(s["step"], s["skipped"]) for s in r["timeline"] if "skipped" in s]
    assert taken == [(0, True), (1, False), (2, True), (3, False), (4, True), (5, False)], taken
