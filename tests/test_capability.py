"""Capability: the precision decision from injected device profiles, and the live CPU report."""
import json

import pytest

from troubleshooter.cli import main
from troubleshooter.engine import cpu_features
from troubleshooter.engine.capability import detect, host_profile, report_from_profile
from troubleshooter.findings import Severity, has_problems

TF32_DEFAULT = {"matmul_allow_tf32": False, "cudnn_allow_tf32": True, "float32_matmul_precision": "highest"}


def gpu(name, cc, native=None, default=True, memory_gb=16):
    return {"device": "cuda:0", "name": name, "compute_capability": cc, "memory_bytes": memory_gb * 1024 ** 3,
            "bf16_supported_native": native, "bf16_supported_default": default, "tf32": dict(TF32_DEFAULT),
            "torch_version": "2.5.0", "cuda_version": "12.4"}


def cpu(*flags, model="Test CPU"):
    text = f"model name\t: {model}\nflags\t\t: fpu sse2 {' '.join(flags)}\n"
    feats = cpu_features.cpu_features(text)
    return {"device": "cpu", "cpu": feats, "torch_version": "2.5.0", "mps_available": False}


@pytest.mark.parametrize("profile, precision, arch, dtypes, summary", [
    (gpu("Tesla V100-SXM2-16GB", "7.0", native=False, default=True), "fp16", "Volta", ["fp16"],
     "Tesla V100-SXM2-16GB · sm_70 · bf16 ✗ fp16 ✓ tf32 ✗"),
    (gpu("Tesla T4", "7.5", native=False), "fp16", "Turing", ["fp16"], "Tesla T4 · sm_75 · bf16 ✗ fp16 ✓ tf32 ✗"),
    (gpu("NVIDIA A100-SXM4-80GB", (8, 0), native=True, memory_gb=80), "bf16", "Ampere", ["fp16", "bf16", "tf32"],
     "NVIDIA A100-SXM4-80GB · sm_80 · bf16 ✓ fp16 ✓ tf32 ✓"),
    (gpu("NVIDIA GeForce RTX 4090", "8.9", native=True, memory_gb=24), "bf16", "Ada",
     ["fp16", "bf16", "tf32", "fp8"], "NVIDIA GeForce RTX 4090 · sm_89 · bf16 ✓ fp16 ✓ tf32 ✓"),
    (gpu("NVIDIA H100 80GB HBM3", "9.0", native=True, memory_gb=80), "bf16", "Hopper",
     ["fp16", "bf16", "tf32", "fp8"], "NVIDIA H100 80GB HBM3 · sm_90 · bf16 ✓ fp16 ✓ tf32 ✓"),
])
def test_gpu_profiles(profile, precision, arch, dtypes, summary):
    r = report_from_profile(profile)
    d = r.to_dict()
    assert r.recommended_precision == precision and d["architecture"] == arch
    assert d["tensor_core_dtypes"] == dtypes
    assert r.summary_line() == summary
    assert not has_problems(r.findings)  # GPUs with tensor cores: nothing to warn about by default
    rules = {f.rule for f in r.findings}
    assert ("AMP207" in rules) == (precision != "bf16")
    assert r.reason and d["peak_tflops"]["fp16"] > 0
    json.dumps(d)


def test_v100_bf16_emulation_is_not_trusted():
    r = report_from_profile(gpu("Tesla V100-PCIE-32GB", "7.0", native=None, default=True))
    assert r.bf16_native is False and r.to_dict()["bf16"]["emulated"] is True
    (f,) = [f for f in r.findings if f.rule == "AMP207"]
    assert "counts emulation" in f.message and f.precision == "bf16"
    assert any("including_emulation=False" in n for n in r.notes)
    # asking to train in bf16 on it turns the finding into a warning
    assert [x.severity for x in r.findings_for("bf16") if x.rule == "AMP207"] == [Severity.WARNING]
    assert [x.severity for x in r.findings_for("fp16") if x.rule == "AMP207"] == [Severity.INFO]


def test_pascal_has_no_fast_half_precision():
    r = report_from_profile(gpu("NVIDIA GeForce GTX 1080 Ti", "6.1", native=False))
    assert r.recommended_precision == "fp32" and has_problems(r.findings)
    (f,) = [f for f in r.findings if f.rule == "AMP208"]
    assert f.severity is Severity.WARNING and f.name == "no-fast-half-precision"
    assert "slow fp16" in f.message
    unknown = report_from_profile(gpu("Quadro P9999", "6.1", native=False))
    assert unknown.recommended_precision == "fp32" and any("not in the GPU table" in n for n in unknown.notes)


def test_p100_fp16_without_tensor_cores():
    r = report_from_profile(gpu("Tesla P100-PCIE-16GB", "6.0", native=False))
    assert r.recommended_precision == "fp16" and "2x" in r.reason
    assert not has_problems(r.findings) and {f.rule for f in r.findings} == {"AMP207", "AMP208"}


def test_tf32_note_on_ampere_only_when_off():
    off = report_from_profile(gpu("NVIDIA A100-SXM4-40GB", "8.0", native=True))
    assert any("TF32 is off" in n for n in off.notes)
    on = gpu("NVIDIA A100-SXM4-40GB", "8.0", native=True)
    on["tf32"] = {"matmul_allow_tf32": True, "cudnn_allow_tf32": True, "float32_matmul_precision": "high"}
    assert not any("TF32 is off" in n for n in report_from_profile(on).notes)
    assert report_from_profile(on).to_dict()["tf32_settings"]["matmul_allow_tf32"] is True


def test_cpu_with_amx():
    r = report_from_profile(cpu("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "avx512_fp16",
                                model="Intel Xeon Platinum 8480+"))
    assert r.recommended_precision == "bf16" and r.findings == []
    assert r.summary_line() == "CPU (no GPU) · avx512_bf16 ✓ amx_bf16 ✓"
    assert "amx_bf16" in r.reason


def test_cpu_without_bf16():
    r = report_from_profile(cpu("avx2", "avx512f"))
    assert r.recommended_precision == "fp32"
    assert r.summary_line() == "CPU (no GPU) · avx512_bf16 ✗ amx_bf16 ✗"
    assert {f.rule for f in r.findings} == {"AMP207", "AMP208"}
    assert all(f.severity is Severity.INFO for f in r.findings)  # a CPU host is not a mistake


def test_cpu_flags_unreadable():
    r = report_from_profile({"device": "cpu", "cpu": {"flags": {}}})
    assert r.recommended_precision == "fp32" and "could not be read" in r.reason
    assert "?" in r.summary_line()


def test_mps_profile():
    r = report_from_profile({"device": "mps", "mps_bf16": False})
    assert r.recommended_precision == "fp16" and {f.rule for f in r.findings} == {"AMP207"}


def test_parse_cpuinfo_arm_and_x86():
    model, flags = cpu_features.parse_cpuinfo("processor : 0\nFeatures : fp asimd bf16\n")
    assert model is None and "bf16" in flags
    model, flags = cpu_features.parse_cpuinfo("model name : X\nflags : avx2 amx_bf16\nflags : other\n")
    assert model == "X" and flags == {"avx2", "amx_bf16"}


def test_live_host_report_and_cli(capsys):
    profile = host_profile("cpu")
    assert profile["device"] == "cpu" and "float32_matmul_precision" in profile["tf32"]
    r = detect("cpu")
    assert r.kind == "cpu" and r.recommended_precision in ("bf16", "fp32")
    assert main(["capability", "--device", "cpu", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["device"] == "cpu" and "recommended_precision" in data and "findings" in data
    assert main(["capability", "--device", "cpu"]) == 0
    assert "Recommended precision:" in capsys.readouterr().out


def test_host_profile_cuda_branch_with_a_simulated_v100(monkeypatch):
    """The CUDA probing code, wired to a fake V100 (no GPU here): bf16 must come from
    including_emulation=False, not from the default that counts emulation."""
    import contextlib
    import types

    import torch

    calls = []

    def is_bf16_supported(including_emulation=True):
        calls.append(including_emulation)
        return including_emulation  # what torch answers on a V100

    props = types.SimpleNamespace(name="Tesla V100-SXM2-32GB", major=7, minor=0, total_memory=32 * 1024 ** 3,
                                  multi_processor_count=80)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    monkeypatch.setattr(torch.cuda, "device", lambda i: contextlib.nullcontext())
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 90100)
    profile = host_profile("cuda:0")
    assert profile["device"] == "cuda:0" and profile["compute_capability"] == [7, 0]
    assert profile["bf16_supported_native"] is False and profile["bf16_supported_default"] is True
    assert False in calls
    r = report_from_profile(profile)
    assert r.recommended_precision == "fp16" and not r.bf16_native and r.to_dict()["gpu_model"] == "V100"
    assert r.to_dict()["memory_gb"] == 32 and r.to_dict()["cudnn_version"] == 90100


def test_asking_for_a_missing_gpu_is_a_user_error():
    import torch

    from troubleshooter.errors import UserError

    if torch.cuda.is_available():
        pytest.skip("this host has a GPU")
    with pytest.raises(UserError, match="no CUDA GPU"):
        detect("cuda")
