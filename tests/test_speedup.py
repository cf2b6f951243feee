"""The speedup measurement on CPU with tiny hand-built workloads and small budgets."""
import json
import math
import statistics
import time

import pytest
import torch
from torch import nn

from troubleshooter.engine import speedup as sp
from troubleshooter.engine.speedup import run_speedup, split_available
from troubleshooter.engine.verdict import level_for
from troubleshooter.errors import UserError
from troubleshooter.workload import Workload

_AMP_NAME = {torch.float16: "fp16", torch.bfloat16: "bf16"}


def _precision_now(device_type="cpu"):
    if torch.is_autocast_enabled(device_type):
        return _AMP_NAME[torch.get_autocast_dtype(device_type)]
    return "fp32"


def tiny(d=32, batch=16, fail_in=None, calls=None, flops=True, slow_in=None):
    """A 2-layer MLP; `fail_in` makes the loss raise in that precision; `calls` records the order."""

    def build():
        return nn.Sequential(nn.Linear(d, 2 * d), nn.ReLU(), nn.Linear(2 * d, 8))

    def make_batch(bs, device, gen):
        return (torch.randn(bs, d, generator=gen).to(device),), torch.randint(0, 8, (bs,), generator=gen).to(device)

    def loss_fn(out, target):
        now = _precision_now()
        if calls is not None:
            calls.append(now)
        if now == slow_in:
            time.sleep(1.0)
        if now == fail_in:
            raise RuntimeError(f"deliberate failure in {now}")
        return nn.functional.cross_entropy(out.float(), target)

    return Workload(name="tiny", build_model=build, make_batch=make_batch, loss_fn=loss_fn,
                    make_optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-3), batch_size=batch,
                    flops_per_step=6.0 * batch * (d * 2 * d + 2 * d * 8) if flops else None)


@pytest.fixture(scope="module")
def result():
    seen = []
    res = run_speedup(tiny(), device="cpu", budget_s=2.0, progress=lambda f, m: seen.append((f, m)))
    res["_progress"] = seen
    return res


def test_every_precision_has_numbers_and_tf32_is_unavailable_on_cpu(result):
    assert set(result["results"]) == {"fp32", "fp16", "bf16"}
    assert "tf32" not in result["results"] and "CPU" in result["unavailable"]["tf32"]
    for p, r in result["results"].items():
        assert r["median_ms"] > 0 and r["iqr_ms"] >= 0 and r["samples"] >= sp.MIN_ROUNDS
        assert len(r["samples_ms"]) == r["samples"]
        assert r["median_ms"] == pytest.approx(statistics.median(r["samples_ms"]))
        assert r["spread"] == pytest.approx(r["iqr_ms"] / r["median_ms"])
        assert r["throughput"] == pytest.approx(16 / (r["median_ms"] / 1000))
        assert r["throughput_unit"] == "samples/s"
        assert r["peak_memory_bytes"] > 0 and "profiler" in r["peak_memory_method"]
        assert r["achieved_tflops"] > 0 and r["peak_share"] is None
        assert math.isfinite(r["final_loss"]) and len(r["losses"]) == r["warmup_steps"] >= 1
        assert r["final_loss"] == r["losses"][r["loss_after_steps"] - 1]
    # the interleaved rounds give every precision the same number of samples
    assert len({r["samples"] for r in result["results"].values()}) == 1


def test_ratios_and_verdict_are_consistent_with_the_step_times(result):
    """speedup_vs_fp32 is the median of the paired per-round ratios (robust to one slow round);
    the ratio of the medians is kept beside it."""
    from troubleshooter.engine.speedup_stats import paired_speedup

    res = result["results"]
    fp32 = res["fp32"]["median_ms"]
    for p, r in res.items():
        assert r["speedup_vs_fp32_medians"] == pytest.approx(fp32 / r["median_ms"])
        assert "speedup_vs_tf32" not in r
        if p != "fp32":
            ps = paired_speedup(res["fp32"]["samples_ms"], r["samples_ms"], seed=0)
            assert r["speedup_vs_fp32"] == pytest.approx(ps.median)
            assert r["speedup_vs_fp32_ci"] == (None if ps.low is None else pytest.approx([ps.low, ps.high]))
    v = result["verdict"]
    best = max((p for p in res if p != "fp32"), key=lambda p: res[p]["speedup_vs_fp32"])
    assert v["best_precision"] == best
    assert v["speedup"] == pytest.approx(res[best]["speedup_vs_fp32"], rel=1e-3)
    if v["level"] != "inconclusive":  # a busy test host or a 2 s budget may well make it so
        lo, hi = v["speedup_ci"]
        assert v["level"] == level_for(v["speedup"]) == level_for(lo) == level_for(hi)
        assert any("CPU numbers" in r for r in v["reasons"]) or v["level"] == "use_amp"
    else:
        assert v["inconclusive_because"] and "clean measurement" in v["recommendation"]


def test_same_initial_weights_give_close_losses(result):
    res = result["results"]
    assert res["fp32"]["loss_rel_diff_vs_fp32"] == 0
    for p in ("fp16", "bf16"):
        # step 1 runs on identical weights: only rounding separates the losses
        assert res[p]["losses"][0] == pytest.approx(res["fp32"]["losses"][0], rel=0.02)
        assert res[p]["loss_rel_diff_vs_fp32"] < 0.05


def test_json_schema_and_cpu_honesty(result):
    text = json.dumps({k: v for k, v in result.items() if k != "_progress"}, allow_nan=False)
    back = json.loads(text)
    assert {"device", "spec", "settings", "results", "unavailable", "errors", "verdict", "findings"} <= set(back)
    assert back["device"]["type"] == "cpu" and back["device"]["cpu_numbers"] is True
    assert "CPU numbers" in back["device"]["note"] and "amx_bf16" in back["device"]["cpu_features"]
    assert {"recommendation", "best_precision", "speedup", "reasons"} <= set(back["verdict"])
    assert back["spec"]["name"] == "tiny" and back["spec"]["parameters"] == 32 * 64 + 64 + 64 * 8 + 8
    assert back["settings"]["stopped_because"] in ("spread", "budget", "max_samples")
    for f in back["findings"]:
        assert f["rule"] == "AMP209" and f["name"] == "low-speedup"


def test_progress_reports_fractions_up_to_one(result):
    seen = result["_progress"]
    fractions = [f for f, _ in seen]
    assert fractions and all(0 <= f <= 1 for f in fractions) and fractions[-1] == 1.0
    assert any("warming up" in m for _, m in seen) and any(m.startswith("round") for _, m in seen)


def test_budget_is_honoured(result):
    # the fixture paid the process's one-time costs (first autograd/optimizer step); a tiny model's
    # warm-up plus rounds then stay near the budget (slack for a loaded 2-core CI box)
    st = run_speedup(tiny(), device="cpu", budget_s=1.5)["settings"]
    assert st["stopped_because"] in ("budget", "spread", "max_samples")
    assert st["elapsed_s"] < st["budget_s"] + 3.0
    assert 0 < st["warmup_s"] <= st["elapsed_s"]


def test_precisions_are_interleaved_round_by_round():
    calls = []
    res = run_speedup(tiny(calls=calls), device="cpu", precisions="fp32,bf16,fp16", budget_s=2.0)
    warm = [res["results"][p]["warmup_steps"] for p in ("fp32", "bf16", "fp16")]
    assert calls[:sum(warm)] == ["fp32"] * warm[0] + ["bf16"] * warm[1] + ["fp16"] * warm[2]
    timed = calls[sum(warm):]
    rounds = res["settings"]["rounds"]
    assert len(timed) == 3 * rounds
    # each round runs every precision once, in a seeded shuffled order (fp32 is not always first)
    got = [timed[3 * i:3 * i + 3] for i in range(rounds)]
    assert all(sorted(r) == ["bf16", "fp16", "fp32"] for r in got)
    assert got[:5] == res["settings"]["first_round_orders"]


def test_round_orders_are_shuffled_and_seeded(monkeypatch):
    """_timed_rounds alone, with steps that only record: every round has each precision once,
    the orders vary (fp32 is not always first) and the same seed gives the same orders."""

    class Fake:
        def __init__(self, name, log):
            self.name, self.log = name, log

        def step(self, batch):
            self.log.append(self.name)

    monkeypatch.setattr(sp, "MIN_SAMPLES", 10_000)  # never stop on spread: run MAX_SAMPLES rounds
    monkeypatch.setattr(sp, "MAX_SAMPLES", 12)
    runs = []
    for _ in range(2):
        log = []
        runners = {p: Fake(p, log) for p in ("fp32", "fp16", "bf16")}
        _, why, rounds, orders = sp._timed_rounds(runners, [None], torch.device("cpu"), time.perf_counter(),
                                                  60.0, {}, None, seed=7)
        assert why == "max_samples" and rounds == 12
        assert [log[3 * i:3 * i + 3] for i in range(12)] == orders
        runs.append(orders)
    assert runs[0] == runs[1] and len({o[0] for o in runs[0]}) > 1


def test_a_precision_that_fails_is_an_error_and_the_others_still_report():
    res = run_speedup(tiny(fail_in="fp16"), device="cpu", precisions=["fp32", "fp16", "bf16"], budget_s=0.5)
    assert "deliberate failure in fp16" in res["errors"]["fp16"]
    assert set(res["results"]) == {"fp32", "bf16"}
    assert res["verdict"]["best_precision"] == "bf16"


def test_flops_are_estimated_when_the_workload_does_not_know_them():
    res = run_speedup(tiny(flops=False), device="cpu", precisions="fp32,bf16", budget_s=0.3)
    exact = 6.0 * 16 * (32 * 64 + 64 * 8)
    assert res["spec"]["flops_method"].startswith("estimated")
    assert res["spec"]["flops_per_step"] == pytest.approx(exact, rel=0.05)
    assert res["results"]["fp32"]["achieved_tflops"] > 0


def test_failing_baseline_leaves_no_verdict_but_other_numbers():
    res = run_speedup(tiny(fail_in="fp32"), device="cpu", precisions=["fp32", "bf16"], budget_s=0.3)
    assert "fp32" in res["errors"] and set(res["results"]) == {"bf16"}
    assert res["results"]["bf16"]["speedup_vs_fp32"] is None
    assert res["verdict"]["level"] == "unknown" and "fp32 failed" in res["verdict"]["recommendation"]


def test_bad_options_are_user_errors():
    with pytest.raises(UserError, match="budget"):
        run_speedup(tiny(), device="cpu", budget_s=0)
    with pytest.raises(UserError, match="precision"):
        run_speedup(tiny(), device="cpu", precisions="fp32,fp8")
    with pytest.raises(UserError):
        run_speedup(tiny(), device="tpu")


def test_tf32_unavailable_before_ampere_with_an_injected_gpu():
    info = {"type": "cuda", "name": "Tesla T4", "compute_capability": "7.5", "tf32": False}
    avail, unavailable = split_available(["fp32", "tf32"], torch.device("cuda"), info)
    assert avail == ["fp32"] and "Ampere" in unavailable["tf32"] and "sm_75" in unavailable["tf32"]
    assert sp._native("bf16", {"type": "cuda", "bf16_native": False}) is False
    assert sp._native("fp16", {"type": "cuda", "tensor_cores": True}) is True


def test_text_report_names_the_cpu_and_every_precision(result):
    text = sp.format_text(result)
    assert "CPU numbers" in text and "tf32: unavailable" in text and "Verdict:" in text
    for p in ("fp32", "fp16", "bf16"):
        assert any(line.startswith(p) for line in text.splitlines())


def test_compile_failure_is_reported_per_precision(monkeypatch):
    calls = []

    def fake_compile(model):
        calls.append(model)
        if len(calls) == 2:  # the second precision's compile fails, the first one's works

            def broken(*args):
                raise RuntimeError("inductor compile boom")

            return broken
        return model

    monkeypatch.setattr(sp.torch, "compile", fake_compile)
    res = run_speedup(tiny(), device="cpu", precisions="fp32,bf16,fp16", budget_s=0.5, compile=True)
    assert len(calls) == 3 and res["settings"]["compile"] is True
    assert res["errors"]["bf16"].startswith("torch.compile failed") and "--compile" in res["errors"]["bf16"]
    assert set(res["results"]) == {"fp32", "fp16"}


def test_a_precision_too_slow_for_the_budget_is_timed_from_its_warm_up():
    res = run_speedup(tiny(slow_in="fp16"), device="cpu", precisions="fp32,fp16", budget_s=2.5)
    fp16 = res["results"]["fp16"]
    assert fp16["timed_from"] == "warm-up" and fp16["samples"] == 1 and fp16["median_ms"] >= 1000
    assert "share of the budget" in fp16["note"]
    assert res["results"]["fp32"]["timed_from"] == "interleaved rounds"
    assert res["results"]["fp32"]["samples"] == res["settings"]["rounds"] >= 3
    assert fp16["speedup_vs_fp32"] == pytest.approx(res["results"]["fp32"]["median_ms"] / fp16["median_ms"])
    assert fp16["speedup_vs_fp32_paired"] is None
    assert res["settings"]["elapsed_s"] < 2.5 + 3.0


def test_time_spent_adds_up_to_the_elapsed_time(result):
    """The breakdown an inconclusive verdict points to covers the whole run, part by part."""
    st = result["settings"]
    spent = st["time_spent_s"]
    assert set(spent) == {"start_up", "model_builds", "first_steps", "warm_up_steps", "rounds", "other"}
    assert all(v >= 0 for v in spent.values())
    assert spent["rounds"] > 0 and spent["first_steps"] > 0
    assert sum(spent.values()) == pytest.approx(st["elapsed_s"], abs=0.01)
    assert "time spent: " in sp.format_text(result) and "interleaved rounds" in sp.format_text(result)


def test_a_budget_spent_in_warm_up_says_where_it_went():
    """A verdict left inconclusive for want of rounds names the costs that ate the budget."""
    res = run_speedup(tiny(slow_in="bf16"), device="cpu", precisions="fp32,bf16", budget_s=1.0)
    assert res["verdict"]["level"] == "inconclusive"
    where = [r for r in res["verdict"]["reasons"] if r.startswith("where the budget went: ")]
    assert len(where) == 1 and "first steps" in where[0]


def test_a_slow_round_seen_lately_keeps_the_next_round_from_overrunning_the_deadline(monkeypatch):
    """On a busy host rounds alternate fast and slow; a round is never cut short once started, so
    the next one is predicted from the slowest of the last few, not the last alone (which let a
    slow round start right after a fast one and end seconds past the budget)."""
    clock = [0.0]
    durations = iter([1.0, 1.0, 1.0, 3.0] + [1.0, 3.0] * 20)

    class Fake:
        def step(self, batch):
            clock[0] += next(durations)

    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(sp, "MIN_SAMPLES", 10_000)
    _, why, rounds, _ = sp._timed_rounds({"fp32": Fake()}, [None], torch.device("cpu"), 0.0, 100.0, {}, None,
                                         deadline=9.5)
    # rounds end at 1, 2, 3, 6 and 7; after 7 the last round alone (1 s) predicts an end at 8, but
    # the slow one (3 s) two rounds back says 10, past the deadline: it stops at 7
    assert why == "budget" and rounds == 5 and clock[0] == 7.0
