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

    log = []

    class FakeEvent:
        def __init__(self, enable_timing=False):
            assert enable_timing
            self.t = None

        def record(self):
            log.append("record")
            self.t = len(log)

        def elapsed_time(self, end):
            assert log[-1] == "sync", "elapsed_time read before synchronising"
            return float(end.t - self.t)

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(timing, "synchronize", lambda device: log.append("sync"))
    timer = timing.StepTimer(torch.device("cuda"))
    timer.time(lambda: log.append("step"))
    timer.time(lambda: log.append("step"))
    assert "sync" not in log  # no host round trip per step
    assert timer.collect() == [2.0, 2.0]
    assert log == ["record", "step", "record"] * 2 + ["sync"]


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
    v = make_verdict({"fp32": 30.0, "bf16": 10.0}, spreads={"fp32": 0.02, "bf16": 0.4})
    assert v.level == "use_amp" and any("noisy (bf16 spread 40%" in r for r in v.reasons)
    quiet = make_verdict({"fp32": 30.0, "bf16": 10.0}, spreads={"fp32": 0.02, "bf16": 0.03})
    assert not any("noisy" in r for r in quiet.reasons)
