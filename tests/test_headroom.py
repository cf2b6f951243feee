"""AMP202/AMP203/AMP210 from one fp32 reference step and half-precision forwards."""
import math
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "check"))
import check_workloads as cw  # noqa: E402

from troubleshooter.engine import headroom as hr  # noqa: E402
from troubleshooter.workload import Workload  # noqa: E402


def _rules(result):
    return {(f.rule, f.location.module, f.precision, f.severity.value) for f in result.findings}


def test_exponent_histogram_counts_exactly():
    g = torch.tensor([0.0, 0.0, 2.0 ** -30, 2.0 ** -20, 3.0, float("inf"), -(2.0 ** -20)])
    hist = hr.exponent_histogram([g], torch.device("cpu")).tolist()
    assert hist[hr._BINS] == 2 and hist[hr._BINS + 1] == 1  # zeros, non-finite
    assert hist[-30 - hr._LO] == 1 and hist[-20 - hr._LO] == 2 and hist[1 - hr._LO] == 1
    nonzero, flushed = hr._share_below(hist, hr.FLUSH_EXP)
    assert (nonzero, flushed) == (4, 1)
    assert hr._share_below(hist, hr.SUBNORMAL_EXP)[1] == 3


def test_scale_window_lifts_small_gradients_and_respects_the_largest():
    hist = [0] * (hr._BINS + 2)
    hist[-30 - hr._LO] = 1000  # 1000 gradients in [2**-30, 2**-29)
    w = hr._scale_window(hist, max_abs=2.0 ** -29)
    assert w["min_loss_scale"] == 2.0 ** 16 and w["fits"] is True
    assert w["max_loss_scale"] == 2.0 ** math.floor(math.log2(65504 * 2 ** 29))
    assert hr._scale_window(hist, max_abs=1.0)["fits"] is False  # 2**16 * 1.0 overflows


def test_overflow_is_reported_at_the_first_layer_past_65504_and_only_for_fp16():
    r = hr.check_headroom(cw.mlp((32, 64, 64, 10), batch_size=16, blow_up={2: 1e5}))
    assert r.first_overflow == "2"
    assert ("AMP202", "2", "fp16", "error") in _rules(r)
    assert not [f for f in r.findings if f.precision == "bf16" or f.severity.value != "error" and f.rule == "AMP202"]
    act = {a["module"]: a for a in r.activations}
    assert act["2"]["headroom_bits"] < 0 < act["0"]["headroom_bits"]
    assert r.relative_error["fp16"]["loss"] != r.relative_error["fp16"]["loss"] or \
        not math.isfinite(r.relative_error["fp16"]["loss"])  # inf/nan under fp16
    assert r.relative_error["bf16"]["loss"] < hr.BF16_INFO


def test_tiny_loss_weight_underflows_every_layer_in_fp16():
    r = hr.check_headroom(cw.mlp((32, 64, 10), batch_size=16, loss_weight=1e-7))
    assert {("AMP203", "0", "fp16", "warning"), ("AMP203", "2", "fp16", "warning")} <= _rules(r)
    s = r.gradient_summary
    assert s["flush_to_zero_share"] > 0.9 and s["min_loss_scale"] > 65536 and s["fits"]
    assert "init_scale=" in r.findings[0].suggestion


def test_clean_model_has_headroom_and_no_warnings():
    r = hr.check_headroom(cw.mlp((32, 64, 10), batch_size=16))
    assert not [f for f in r.findings if f.severity.value != "info"]
    assert r.first_overflow is None and min(a["headroom_bits"] for a in r.activations) > 10
    assert r.gradient_summary["flush_to_zero_share"] < 0.01
    assert r.relative_error["bf16"]["loss"] < 0.01 and r.relative_error["fp16"]["loss"] < 0.01
    again = hr.check_headroom(cw.mlp((32, 64, 10), batch_size=16))
    assert again.to_dict() == r.to_dict()  # seeded: the same numbers every run


def test_large_offset_regression_loses_precision_in_bf16():
    """Outputs near 1000 come in steps of 4 in bf16; an MSE against targets 0.01 away falls apart."""

    def build():
        lin = nn.Linear(16, 16)
        with torch.no_grad():
            lin.weight.copy_(torch.eye(16))
            lin.bias.fill_(1000.0)
        return nn.Sequential(lin)

    def batch(n, device, gen):
        x = torch.randn(n, 16, generator=gen)
        return (x.to(device),), (1000.0 + x + 0.01 * torch.randn(n, 16, generator=gen)).to(device)

    wl = Workload("offset", build, batch, nn.functional.mse_loss, lambda p: torch.optim.SGD(p, lr=0.1), 16)
    r = hr.check_headroom(wl)
    f = [f for f in r.findings if f.rule == "AMP210"]
    assert f and f[0].precision == "bf16" and f[0].severity.value == "warning"


def test_large_values_from_an_fp32_module_overflow_where_they_are_cast_to_fp16():
    """Embeddings stay fp32 under autocast: the overflow happens in the Linear that reads them."""

    def build():
        model = nn.Sequential(nn.Embedding(32, 16), nn.Linear(16, 8))
        with torch.no_grad():
            model[0].weight.mul_(1e5)
            model[1].weight.mul_(0.01)
        return model

    def batch(n, device, gen):
        return (torch.randint(0, 32, (n, 4), generator=gen).to(device),), None

    wl = Workload("emb", build, batch, lambda out, target: out.float().pow(2).mean(),
                  lambda p: torch.optim.SGD(p, lr=0.1), 8)
    r = hr.check_headroom(wl)
    act = {a["module"]: a for a in r.activations}
    assert act["0"]["max_abs"] > 65504 and not act["0"]["fp16_output"]
    assert r.first_overflow == "1" and ("AMP202", "1", "fp16", "error") in _rules(r)


def test_underflow_that_gradscalers_default_scale_fixes_is_only_info():
    r = hr.check_headroom(cw.mlp((32, 64, 10), batch_size=16, loss_weight=1e-4))
    assert r.gradient_summary["min_loss_scale"] <= 65536
    assert [(f.rule, f.severity.value) for f in r.findings] == [("AMP203", "info")]
