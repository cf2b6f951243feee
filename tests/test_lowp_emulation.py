"""Half precision computed in float32 on a CPU without half instructions: the same numbers as
PyTorch's own CPU half kernels (to summation order), overflow kept, and the same findings."""
import json
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from troubleshooter.cli import main
from troubleshooter.engine import lowp_emulation
from troubleshooter.engine.lowp_emulation import HalfOnFloat32, half_on_float32, slow_half_dtypes

FIXTURES = Path(__file__).parent / "fixtures" / "check"
HALF = [torch.float16, torch.bfloat16]
EPS = {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}  # one unit in the last place, relative


def _step(model, x, dtype):
    """One autocast forward and backward: (output, gradients of the input and parameters)."""
    x = x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=dtype):
        out = model(x)
    out.float().square().mean().backward()
    grads = [x.grad] + [p.grad for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return out.detach(), grads


def _models():
    torch.manual_seed(0)
    return {
        "linear": (nn.Sequential(nn.Linear(48, 96), nn.GELU(), nn.Linear(96, 24)), torch.randn(4, 7, 48)),
        "conv": (nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 8, 3, stride=2)),
                 torch.randn(2, 3, 12, 12)),
        "attention": (nn.MultiheadAttention(32, 4, batch_first=True), torch.randn(2, 9, 32)),
    }


class _SelfAttention(nn.Module):
    def __init__(self, mha):
        super().__init__()
        self.mha = mha

    def forward(self, x):
        return self.mha(x, x, x, need_weights=False)[0]


@pytest.mark.parametrize("dtype", HALF, ids=["fp16", "bf16"])
@pytest.mark.parametrize("kind", ["linear", "conv", "attention"])
def test_emulated_products_match_the_native_half_kernels(kind, dtype):
    model, x = _models()[kind]
    if kind == "attention":
        model = _SelfAttention(model)
    out_native, grads_native = _step(model, x, dtype)
    with HalfOnFloat32([dtype]) as mode:
        out_emul, grads_emul = _step(model, x, dtype)
    assert mode.calls.get({torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype], 0) > 0
    assert out_emul.dtype == out_native.dtype == dtype
    for native, emul in zip([out_native] + grads_native, [out_emul] + grads_emul):
        assert emul.dtype == native.dtype and emul.shape == native.shape
        scale = native.float().abs().max().item()
        # the same inputs, float32 accumulation in both: a few units in the last place at most
        assert (emul.float() - native.float()).abs().max().item() <= 4 * EPS[dtype] * scale


def test_an_fp16_overflow_is_still_inf_forward_and_backward():
    torch.manual_seed(0)
    layer = nn.Linear(64, 8)
    with torch.no_grad():
        layer.weight.fill_(40.0)
    x = torch.full((2, 64), 40.0)  # 64 * 40 * 40 = 102400 > 65504
    out_native, _ = _step(layer, x, torch.float16)
    with HalfOnFloat32([torch.float16]):
        out_emul, grads_emul = _step(layer, x, torch.float16)
    assert torch.isinf(out_native).all() and torch.isinf(out_emul).all()
    assert not torch.isfinite(grads_emul[1]).all()  # the weight gradient sees the inf too


def test_other_dtypes_and_mixed_inputs_are_left_to_their_kernels():
    a16, b32 = torch.randn(4, 4).half(), torch.randn(4, 4)
    with HalfOnFloat32([torch.float16]) as mode:
        b32 @ b32
        torch.randn(4, 4).bfloat16() @ torch.randn(4, 4).bfloat16()  # bf16 not asked for
        with pytest.raises(RuntimeError):
            a16 @ b32  # the kernel's own error, not a silent float32 product
    assert mode.calls == {}


def test_which_half_dtypes_are_emulated_follows_the_cpu_flags():
    none = {"avx512_bf16": False, "amx_bf16": False, "avx512_fp16": False, "amx_fp16": False}
    assert slow_half_dtypes(none) == [torch.float16, torch.bfloat16]
    assert slow_half_dtypes({**none, "avx512_bf16": True}) == [torch.float16]
    assert slow_half_dtypes({**none, "amx_fp16": True, "amx_bf16": True}) == []
    with half_on_float32(torch.device("cuda")) as mode:  # a GPU's kernels are what is measured
        assert mode is None
    with half_on_float32(torch.device("cpu"), dtypes=[]) as mode:
        assert mode is None
    with half_on_float32(torch.device("cpu"), dtypes=[torch.float16]) as mode:
        assert lowp_emulation.emulated("fp16") and not lowp_emulation.emulated("bf16")
    assert not lowp_emulation.emulated("fp16")


def _check_json(capsys, *argv):
    # a budget no busy host reaches: what the tests assert must not depend on the machine's load
    code = main(["check", "--budget", "600", *argv, "--device", "cpu", "--format", "json"])
    return code, json.loads(capsys.readouterr().out)


def _seen(result):
    return sorted((f["rule"], f["severity"], f["module"], f["precision"]) for f in result["findings"])


@pytest.mark.parametrize("spec", ["overflow", "underflow"])
def test_planted_faults_give_the_same_findings_with_and_without_emulation(capsys, monkeypatch, overflow_spec,
                                                                          spec):
    path = str(overflow_spec if spec == "overflow" else FIXTURES / "underflow.yaml")
    monkeypatch.setattr(lowp_emulation, "slow_half_dtypes", lambda flags=None: [torch.float16, torch.bfloat16])
    code_emul, emul = _check_json(capsys, path, "--steps", "4", "--seed", "1", "--budget", "600")
    monkeypatch.setattr(lowp_emulation, "slow_half_dtypes", lambda flags=None: [])
    code_native, native = _check_json(capsys, path, "--steps", "4", "--seed", "1", "--budget", "600")
    assert emul["device"]["half_emulation"]["ops"]["fp16"] > 0
    assert "half_emulation" not in native["device"]
    assert code_emul == code_native == 1
    assert _seen(emul) == _seen(native)
    for key in ("skipped", "skip_rate", "final_scale"):
        assert emul["skiprate"]["summary"][key] == native["skiprate"]["summary"][key]
    assert ("AMP202" if spec == "overflow" else "AMP203") in {f["rule"] for f in emul["findings"]}


def test_the_report_says_half_precision_was_computed_in_float32(capsys, monkeypatch):
    monkeypatch.setattr(lowp_emulation, "slow_half_dtypes", lambda flags=None: [torch.float16])
    code = main(["check", "--preset", "mlp", "--device", "cpu", "--only", "nan", "--steps", "2"])
    text = capsys.readouterr().out
    assert code == 0 and "fp16 matrix products and convolutions were computed in float32" in text
    assert sys.modules["troubleshooter.engine.lowp_emulation"]._active == []  # left on exit
