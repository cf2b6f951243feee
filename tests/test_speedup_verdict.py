"""The speedup verdict (pure) and the timing summary: thresholds, reasons, AMP209."""
import pytest

from troubleshooter.engine.timing import StepTimer, summarize
from troubleshooter.engine.verdict import level_for, make_verdict

CPU_FEATURES = {"avx512_bf16": False, "amx_bf16": False, "avx512_fp16": False, "amx_fp16": False}


@pytest.mark.parametrize("speedup,level", [
    (0.5, "stay_fp32"), (1.0, "stay_fp32"), (1.099, "stay_fp32"), (1.1, "modest"),
    (1.3, "modest"), (1.5, "modest"), (1.51, "use_amp"), (3.0, "use_amp"),
])
def test_level_follows_the_decision_matrix(speedup, level):
    assert level_for(speedup) == level
    v = make_verdict({"fp32": 10.0 * speedup, "bf16": 10.0}, device_type="cuda", device_name="NVIDIA A100")
    assert v.level == level
    assert v.speedup == pytest.approx(speedup)
    assert v.best_precision == "bf16"
    assert [f.rule for f in v.findings] == ([] if level == "use_amp" else ["AMP209"])


def test_recommendation_words():
    assert make_verdict({"fp32": 10.0, "fp16": 9.8}).recommendation.startswith("stay in fp32")
    modest = make_verdict({"fp32": 13.0, "fp16": 10.0}).recommendation
    assert modest.startswith("modest") and "check numerics" in modest
    use = make_verdict({"fp32": 30.0, "fp16": 10.0}, device_type="cuda").recommendation
    assert use.startswith("use AMP with fp16") and "GradScaler" in use
    slower = make_verdict({"fp32": 10.0, "bf16": 20.0}).recommendation
    assert "2.00x slower" in slower and "only" not in slower


def test_best_is_the_fastest_and_the_ratio_is_fp32_over_it():
    v = make_verdict({"fp32": 40.0, "tf32": 20.0, "fp16": 10.0, "bf16": 12.0}, device_type="cuda")
    assert v.best_precision == "fp16" and v.speedup == pytest.approx(4.0)
    assert v.to_dict()["speedup"] == pytest.approx(4.0)


def test_no_baseline_gives_no_verdict():
    v = make_verdict({"bf16": 5.0, "fp16": 4.0})
    assert v.level == "unknown" and v.speedup is None and "fp32" in v.recommendation
    assert not v.findings
    assert make_verdict({"fp32": 5.0}).level == "unknown"


def test_cpu_reasons_name_the_cpu_and_its_missing_features():
    v = make_verdict({"fp32": 10.0, "bf16": 20.0}, device_type="cpu", device_name="Xeon X",
                     cpu_features=CPU_FEATURES)
    assert "CPU numbers" in v.reasons[0] and "Xeon X" in v.reasons[0] and "amx_bf16 ✗" in v.reasons[0]
    finding = v.findings[0]
    assert finding.rule == "AMP209" and finding.name == "low-speedup"
    assert finding.severity.value == "info"  # expected on a CPU
    assert finding.data["reasons"] == v.reasons


def test_gpu_reasons_small_model_batch_alignment_and_hardware():
    v = make_verdict(
        {"fp32": 3.0, "fp16": 2.9, "bf16": 3.1}, device_type="cuda", device_name="Tesla V100",
        tensor_cores=True, bf16_native=False, flops_per_step=1e8, batch_size=4,
        misaligned=["0 out_features=1001 (pad to 1008)"], fp32_peak_share=0.02,
    )
    text = " | ".join(v.reasons)
    assert "no native bf16" in text
    assert "model is small" in text
    assert "batch is small (4)" in text
    assert "AMP201" in text and "1001" in text
    assert "memory-bound" in text
    assert v.findings[0].severity.value == "warning"  # a GPU with no AMP gain is worth a look


def test_launch_bound_reason_without_flops_and_pre_volta():
    v = make_verdict({"fp32": 1.0, "fp16": 0.98}, device_type="cuda", device_name="P100",
                     tensor_cores=False, batch_size=256)
    text = " | ".join(v.reasons)
    assert "no fp16 tensor cores" in text and "launch-bound" in text and "--compile" in text


def test_loss_difference_and_bf16_preference_notes():
    v = make_verdict({"fp32": 30.0, "fp16": 10.0, "bf16": 10.3}, device_type="cuda", bf16_native=True,
                     loss_rel_diff={"fp16": 0.2, "bf16": 0.001})
    assert v.level == "use_amp"
    text = " | ".join(v.reasons)
    assert "prefer bf16" in text
    assert "fp16 loss" in text and "20.0%" in text and "bf16 loss" not in text


def test_summarize_median_and_iqr():
    s = summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s.median, s.q1, s.q3) == (3.0, 2.0, 4.0)
    assert s.iqr == 2.0 and s.spread == pytest.approx(2 / 3)
    one = summarize([7.0])
    assert one.iqr == 0 and one.spread == 0
    with pytest.raises(ValueError):
        summarize([])


def test_step_timer_on_cpu_times_each_call():
    import time

    import torch

    timer = StepTimer(torch.device("cpu"))
    timer.time(lambda: time.sleep(0.02))
    timer.time(lambda: None)
    slow, fast = timer.collect()
    assert slow >= 19.0 and fast < slow
    assert timer.collect() == []


def test_step_timer_on_cuda_reads_events_only_after_a_synchronize(monkeypatch):
    """No GPU here: fake events check the order (record, step, record; sync; elapsed_time)."""
    import torch

    from troubleshooter.engine import timing

    log, streams = [], []

    class FakeEvent:
        def __init__(self, enable_timing=False):
            assert enable_timing
            self.t = None

        def record(self, stream=None):
            log.append("record")
            streams.append(stream)
            self.t = len(log)

        def elapsed_time(self, end):
            assert log[-1] == "sync", "elapsed_time read before synchronising"
            return float(end.t - self.t)

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: f"stream of {device}")
    monkeypatch.setattr(timing, "synchronize", lambda device: log.append("sync"))
    timer = timing.StepTimer(torch.device("cuda"))
    timer.time(lambda: log.append("step"))
    timer.time(lambda: log.append("step"))
    assert "sync" not in log  # no host round trip per step
    assert timer.collect() == [2.0, 2.0]
    assert log == ["record", "step", "record"] * 2 + ["sync"]
    # the events go on the timed device's stream, not the current device's (cuda:0 by default)
    streams.clear()
    timing.StepTimer(torch.device("cuda:1")).time(lambda: None)
    assert streams == ["stream of cuda:1"] * 2


def test_describe_a_cuda_device_from_injected_facts(monkeypatch):
    import torch

    from troubleshooter.engine import speedup as sp

    class Props:
        total_memory = 80 * 2**30

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "Tesla T4")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: Props())
    info = sp.describe_device(torch.device("cuda"))
    assert info["architecture"] == "Turing" and info["compute_capability"] == "7.5"
    assert info["tensor_cores"] is True and info["bf16_native"] is False and info["tf32"] is False
    assert info["cpu_numbers"] is False and "sm_75" in info["summary"]
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    avail, unavailable = sp.split_available(["fp32", "tf32", "fp16", "bf16"], torch.device("cuda"), info)
    assert avail == ["fp32", "fp16", "bf16"] and "sm_75" in unavailable["tf32"]
    assert sp._native("bf16", info) is False and sp._native("fp16", info) is True


def test_noisy_timings_are_called_out():
    v = make_verdict({"fp32": 30.0, "bf16": 10.0}, spreads={"fp32": 0.02, "bf16": 0.15})
    assert v.level == "use_amp" and any("noisy (bf16 spread 15%" in r for r in v.reasons)
    too_noisy = make_verdict({"fp32": 30.0, "bf16": 10.0}, spreads={"fp32": 0.02, "bf16": 0.4})
    assert too_noisy.level == "inconclusive" and "bf16 spread 40%" in too_noisy.recommendation
    quiet = make_verdict({"fp32": 30.0, "bf16": 10.0}, spreads={"fp32": 0.02, "bf16": 0.03})
    assert not any("noisy" in r for r in quiet.reasons)


# ---------------------------------------------------------------- evidence behind a verdict (issue 11.1)
def _verdict_from_samples(samples, native=None):
    """What run_speedup does with its per-round samples, without timing anything."""
    from troubleshooter.engine.speedup_stats import paired_speedups
    from troubleshooter.engine.timing import summarize as summ

    paired = {p: ps.to_dict() for p, ps in paired_speedups(samples, seed=0).items()}
    medians = {p: summ(s).median for p, s in samples.items()}
    spreads = {p: summ(s).spread for p, s in samples.items()}
    return make_verdict(medians, device_type="cpu", cpu_features=CPU_FEATURES, spreads=spreads,
                        paired=paired, native=native or {})


def _rounds(n, fp32_ms, ratios, jitter, seed=1):
    """n rounds: round load multiplies every precision alike (paired), plus per-step jitter."""
    import random

    rng = random.Random(seed)
    out = {"fp32": []}
    out.update({p: [] for p in ratios})
    for _ in range(n):
        load = 1.0 + rng.expovariate(1.0) * jitter  # a busy host: some rounds several times slower
        out["fp32"].append(fp32_ms * load * (1 + rng.uniform(-0.01, 0.01)))
        for p, r in ratios.items():
            out[p].append(fp32_ms / r * load * (1 + rng.uniform(-0.01, 0.01)))
    return out


def test_clean_samples_give_the_right_verdict_with_an_interval():
    v = _verdict_from_samples(_rounds(30, 100.0, {"bf16": 2.0, "fp16": 1.6}, jitter=0.0))
    assert v.level == "use_amp" and v.best_precision == "bf16"
    assert v.interval[0] <= v.speedup <= v.interval[1] and v.interval[0] > 1.9 and v.interval[1] < 2.1
    slow = _verdict_from_samples(_rounds(30, 100.0, {"bf16": 0.7}, jitter=0.0))
    assert slow.level == "stay_fp32" and slow.speedup == pytest.approx(0.7, rel=0.02)


def test_noisy_unpaired_samples_are_inconclusive_and_say_how_to_measure_cleanly():
    """Independent noise per step (not per round): the ratio spread is huge, no verdict."""
    import random

    rng = random.Random(3)
    samples = {"fp32": [100 * (1 + 3 * rng.random()) for _ in range(20)],
               "bf16": [60 * (1 + 3 * rng.random()) for _ in range(20)]}
    v = _verdict_from_samples(samples)
    assert v.level == "inconclusive" and not v.findings
    assert "clean measurement" in v.recommendation and v.inconclusive_because
    assert v.to_dict()["level"] == "inconclusive"


def test_an_interval_straddling_a_threshold_is_inconclusive():
    import random

    rng = random.Random(5)
    fp32 = [100.0 * (1 + 0.05 * rng.random()) for _ in range(40)]
    bf16 = [x / (1.1 + rng.uniform(-0.06, 0.06)) for x in fp32]  # ratios 1.04 .. 1.16 around 1.1
    v = _verdict_from_samples({"fp32": fp32, "bf16": bf16})
    assert v.level == "inconclusive" and any("straddles the 1.1x" in d for d in v.inconclusive_because)


def test_round_load_cancels_in_paired_ratios():
    """A busy host slows whole rounds: raw medians are noisy, paired ratios are not."""
    samples = _rounds(40, 100.0, {"bf16": 1.3}, jitter=0.08)
    v = _verdict_from_samples(samples)
    assert v.level == "modest" and v.speedup == pytest.approx(1.3, rel=0.02)


def test_a_precision_without_a_fast_path_needs_clean_timings():
    samples = _rounds(30, 100.0, {"fp16": 1.8}, jitter=0.0)
    ok = _verdict_from_samples(samples, native={"fp16": False})
    assert ok.level == "use_amp" and any("no fast path" in r for r in ok.reasons)
    import random

    rng = random.Random(9)  # the same gain measured with 15% noise per step
    noisy = {"fp32": [x * (1 + rng.uniform(-0.15, 0.15)) for x in samples["fp32"]],
             "fp16": [x * (1 + rng.uniform(-0.15, 0.15)) for x in samples["fp16"]]}
    v = _verdict_from_samples(noisy, native={"fp16": False})
    assert v.level == "inconclusive" and any("no fast path" in d for d in v.inconclusive_because)


def test_too_few_rounds_give_no_interval_and_no_verdict():
    v = _verdict_from_samples(_rounds(3, 100.0, {"bf16": 2.0}, jitter=0.0))
    assert v.level == "inconclusive" and v.interval is None


def test_bootstrap_is_deterministic_and_covers_the_median():
    from troubleshooter.engine.speedup_stats import bootstrap_median_ci, quantile

    data = [1.0, 1.2, 0.9, 1.1, 1.05, 0.95, 1.3, 1.0, 1.15, 0.98]
    assert bootstrap_median_ci(data, seed=0) == bootstrap_median_ci(data, seed=0)
    lo, hi = bootstrap_median_ci(data, seed=0)
    assert lo <= statistics_median(data) <= hi
    assert quantile([1, 2, 3, 4, 5], 0.1) == pytest.approx(1.4)


def statistics_median(xs):
    import statistics

    return statistics.median(xs)


@pytest.mark.parametrize("name", ["mlp_busy_host", "mlp_wide_busy_host"])
def test_recorded_busy_host_samples_are_inconclusive(name):
    """Real sample sets recorded on this shared 2-core host (spreads of 13-65%): the old rule
    (ratio of medians, noise only noted) gave a verdict; now there is none, and it says why."""
    import json
    from pathlib import Path

    rec = json.loads((Path(__file__).parent / "fixtures" / "check" / "speedup_samples" / f"{name}.json").read_text())
    samples = {p: s for p, s in rec["samples_ms"].items() if rec["timed_from"][p] == "interleaved rounds"}
    v = _verdict_from_samples(samples, native=rec["native"])
    assert v.level == "inconclusive" and v.inconclusive_because and not v.findings
    from troubleshooter.engine.timing import summarize as summ

    old = make_verdict({p: summ(s).median for p, s in samples.items()})
    assert old.level in ("stay_fp32", "modest", "use_amp")


def test_a_ratio_that_drifts_during_the_run_widens_the_interval():
    """The host changes mid-run (another job starts): the first half measures bf16 at 1.25x, the
    second at 0.95x, each tight. A bootstrap over rounds alone gives a narrow interval around the
    pooled median; the interval must cover the thirds and so straddle 1.1x: inconclusive."""
    from troubleshooter.engine.speedup_stats import paired_speedup, segment_medians

    fp32 = _rounds(60, 100.0, {"bf16": 1.25}, jitter=0.0)["fp32"]
    bf16 = [x / (1.25 if i < 30 else 0.95) for i, x in enumerate(fp32)]
    ps = paired_speedup(fp32, bf16)
    thirds = segment_medians([a / b for a, b in zip(fp32, bf16)])
    assert len(thirds) == 3 and thirds[0] == pytest.approx(1.25, rel=0.01) and thirds[2] == pytest.approx(0.95, rel=0.01)
    assert ps.low <= 0.96 and ps.high >= 1.24
    v = _verdict_from_samples({"fp32": fp32, "bf16": bf16})
    assert v.level == "inconclusive" and any("straddles" in d for d in v.inconclusive_because)


def test_a_steady_ratio_keeps_its_tight_interval():
    from troubleshooter.engine.speedup_stats import bootstrap_median_ci, paired_speedup

    samples = _rounds(60, 100.0, {"bf16": 1.3}, jitter=0.05)
    ratios = [a / b for a, b in zip(samples["fp32"], samples["bf16"])]
    ps = paired_speedup(samples["fp32"], samples["bf16"])
    assert (ps.low, ps.high) == pytest.approx(bootstrap_median_ci(ratios), rel=0.01)
    assert ps.high - ps.low < 0.05


def test_a_speedup_from_warm_up_steps_only_is_inconclusive():
    """Issue 28: a busy host's budget left bf16 one warm-up step and fp32 no round beside it; the
    1.9x ratio of two steps timed apart gave "use AMP". Timed so, it is "too few rounds"."""
    medians = {"fp32": 5236.0, "bf16": 2780.0}
    assert make_verdict(medians, device_type="cpu").level == "use_amp"  # what the ratio alone says
    v = make_verdict(medians, device_type="cpu", warmup_only={"bf16": 1, "fp32": 3})
    assert v.level == "inconclusive" and not v.findings
    assert "too few rounds" in v.inconclusive_because[0] and "bf16 from 1 warm-up step" in v.recommendation
    other = make_verdict(medians, device_type="cpu", warmup_only={"fp16": 1})  # not the compared pair
    assert other.level == "use_amp"


def test_a_precision_timed_from_its_cold_first_step_is_not_ranked():
    """The first H200 run (GPT-2 small, 20 s budget, a fresh process): fp16 and bf16 got one step
    each, 1.8 and 1.6 s of kernel loading and autotuning for steps that then took 84 and 79 ms;
    the verdict named tf32 the best. Those two are left out of the ranking and the reason said."""
    medians = {"fp32": 304.0, "tf32": 121.0, "fp16": 1823.0, "bf16": 1604.0}
    warm = {"fp32": 2, "tf32": 2, "fp16": 1, "bf16": 1}
    v = make_verdict(medians, device_type="cuda", warmup_only=warm, first_step_only=["fp16", "bf16"])
    assert v.level == "inconclusive" and v.best_precision == "tf32"
    assert any("fp16 and bf16 were timed from their first step only" in d for d in v.inconclusive_because)
    assert "not compared" in v.recommendation
    # measured in rounds, bf16 wins and fp16's cold step is only a note beside the verdict
    v = make_verdict({"fp32": 304.0, "bf16": 79.0, "fp16": 1823.0}, device_type="cuda",
                     first_step_only=["fp16"])
    assert v.level == "use_amp" and v.best_precision == "bf16"
    assert any("fp16 was timed from its first step only" in r for r in v.reasons)
    # every alternative cold: ranked among themselves, never a verdict
    v = make_verdict({"fp32": 304.0, "bf16": 1604.0}, device_type="cuda", warmup_only={"bf16": 1},
                     first_step_only=["bf16"])
    assert v.level == "inconclusive" and v.best_precision == "bf16"


def test_a_precision_whose_step_cannot_end_in_time_is_not_started():
    import time

    from troubleshooter.engine.budget import StepCosts
    from troubleshooter.engine.speedup import _no_room_for

    costs = StepCosts(None, "cpu")
    costs.record("fp16", 12.0)
    why = _no_room_for("fp16", costs, time.perf_counter() + 5.0, budget_s=20.0)
    assert why and "12.0 s" in why and "--budget" in why
    assert _no_room_for("fp16", costs, time.perf_counter() + 15.0, budget_s=20.0) is None  # it fits
    costs.record("fp16", 0.5)  # cheap work is done even past the deadline: every precision gets a number
    assert _no_room_for("fp16", costs, time.perf_counter() - 1.0, budget_s=20.0) is None


def test_no_speedup_is_stated_over_a_cold_fp32_step():
    """The app on an H200 (cnn, a 5 s budget): fp32 got one step, its cold first one, and bf16 two;
    the verdict said "bf16 measured 84.37x over fp32" for a model whose warm bf16 runs at 0.8x fp32.
    A ratio over a first-step-only baseline measures the one-time costs: none is stated."""
    v = make_verdict({"fp32": 422.0, "bf16": 5.0}, device_type="cuda", warmup_only={"fp32": 1, "bf16": 2},
                     first_step_only=["fp32"])
    assert v.level == "inconclusive" and v.speedup is None and v.best_precision == "bf16"
    assert "84" not in v.recommendation and "x over fp32" not in v.recommendation
    assert "fp32, the baseline, was timed from its first step only" in v.inconclusive_because[0]
    assert "fp32 422.0 ms from 1 warm-up step; bf16 5.0 ms from 2 warm-up steps" in v.recommendation
    assert v.to_dict()["speedup"] is None and not v.findings
    # both cold (the second app run): still no ratio; a best timed in rounds is named as such
    v = make_verdict({"fp32": 9.0, "bf16": 4.9}, warmup_only={"fp32": 1, "bf16": 1},
                     first_step_only=["fp32", "bf16"])
    assert v.level == "inconclusive" and v.speedup is None
    v = make_verdict({"fp32": 900.0, "bf16": 80.0}, warmup_only={"fp32": 1}, first_step_only=["fp32"])
    assert "bf16 80.0 ms in interleaved rounds" in v.recommendation


def test_the_table_gives_no_ratio_over_a_cold_fp32_step():
    """`_results`: with fp32 timed from its first step only, no precision's speedup_vs_fp32 is filled
    in (the table, the plot and the API read it), and the step times still are."""
    from types import SimpleNamespace

    from troubleshooter.engine.speedup import _results

    def runner(seconds, too_slow):
        return SimpleNamespace(losses=[2.0] * len(seconds), peak_memory_bytes=None, memory_method="-",
                               too_slow=too_slow, no_rounds=too_slow, warmup_seconds=seconds, skipped_steps=0)

    workload = SimpleNamespace(items_per_step=8, samples_unit="samples")
    info = {"type": "cpu", "name": "cpu"}
    cold = {"fp32": runner([0.42], True), "bf16": runner([0.3, 0.005], True)}
    out = _results(cold, {"fp32": [420.0], "bf16": [5.0]}, workload, info, None)
    assert out["fp32"]["first_step_only"] and out["bf16"]["speedup_vs_fp32"] is None
    assert out["bf16"]["median_ms"] == 5.0
    warm = {"fp32": runner([0.42, 0.01], True), "bf16": runner([0.3, 0.005], True)}
    out = _results(warm, {"fp32": [10.0], "bf16": [5.0]}, workload, info, None)
    assert out["bf16"]["speedup_vs_fp32"] == 2.0  # fp32 from a warm step: the ratio stands
