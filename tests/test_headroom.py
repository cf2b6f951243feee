"""AMP202/AMP203/AMP210 from one fp32 reference step and half-precision forwards."""
import math
import sys
from pathlib import Path

import pytest
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


def test_scale_window_lifts_small_gradients_out_of_flush_to_zero_and_respects_the_largest():
    hist = [0] * (hr._BINS + 2)
    hist[-30 - hr._LO] = 1000  # 1000 gradients in [2**-30, 2**-29)
    w = hr._scale_window(hist, max_abs=2.0 ** -29)
    assert w["min_loss_scale"] == 2.0 ** 6 and w["fits"] is True  # to 2**-24, not to the subnormals' 2**-14
    assert w["max_loss_scale"] == 2.0 ** math.floor(math.log2(65504 * 2 ** 29))
    assert hr._scale_window(hist, max_abs=2.0 ** 12)["fits"] is False  # 2**6 * 2**12 ... only 2**3 fits
    assert "no single loss scale fits" in hr.window_text(hr._scale_window(hist, max_abs=2.0 ** 14))


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


def _real_gradscaler_loss(workload):
    """Independent of the engine: one fp32 step, then one fp16 autocast step through a real
    torch.amp.GradScaler with its defaults; the share of nonzero fp32 gradient elements that come
    out exactly zero after unscale_, and the gradient's relative error."""
    torch.manual_seed(0)
    model = workload.build_model()
    batch = workload.batch(torch.device("cpu"), seed=0)
    torch.manual_seed(0)
    workload.loss(model, batch).backward()
    ref = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    scaler = torch.amp.GradScaler("cpu")
    torch.manual_seed(0)
    with torch.autocast("cpu", dtype=torch.float16):
        loss = workload.loss(model, batch)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    nonzero = sum(int((r != 0).sum()) for r in ref)
    lost = sum(int(((r != 0) & (p.grad == 0)).sum()) for r, p in zip(ref, model.parameters()))
    err = math.sqrt(sum(float((p.grad - r).pow(2).sum()) for r, p in zip(ref, model.parameters()))
                    / sum(float(r.pow(2).sum()) for r in ref))
    return lost / nonzero, err


def test_default_gradscaler_figure_matches_real_fp16_gradscaler_steps():
    """Loss x 1e-6: the default scale 65536 loses ~0.01% (no warning; it used to say init_scale 2**20);
    loss x 1e-10: it loses most of them (a warning, with a scale that is measured to keep them)."""
    for weight, warns in ((1e-6, False), (1e-10, True)):
        wl = cw.mlp((128, 256, 10), batch_size=64, loss_weight=weight)
        r = hr.check_headroom(wl)
        real_lost, real_err = _real_gradscaler_loss(wl)
        d = r.gradient_summary["default_scaler"]
        assert d["scale"] == 65536.0 and d["lost_share"] == pytest.approx(real_lost, abs=2e-3)
        assert d["gradient_relative_error"] == pytest.approx(real_err, rel=0.1, abs=2e-3)
        found = [f for f in r.findings if f.rule == "AMP203"]
        assert len(found) <= 1  # one per model, never one per module
        assert bool(found and found[0].severity.value == "warning") is warns
        assert (real_lost >= hr.LOST_WARN) is warns
    f = found[0]
    assert f.location.module in {"0", "2"} and {m["module"] for m in f.data["modules"]} == {"0", "2"}
    sug = r.gradient_summary["suggested_scaler"]
    assert sug["fits"] and sug["lost_share"] < hr.LOST_OK and f"init_scale={sug['tried_scale']:.0f}" in f.suggestion
    assert "GradScaler('cpu', init_scale=" in f.suggestion and "'cuda'" not in f.suggestion  # the device it ran on


def test_gradients_autocast_keeps_in_float32_are_not_counted_lost():
    """LayerNorm runs in float32 under autocast: its tiny gradients are not lost to fp16."""

    def build():
        return nn.Sequential(nn.Linear(32, 64), nn.LayerNorm(64), nn.Linear(64, 10))

    wl = Workload("ln", build, cw._classes_batch(32, 10), nn.functional.cross_entropy,
                  lambda p: torch.optim.SGD(p, lr=0.1), 32, loss_weight=1e-6)
    r = hr.check_headroom(wl)
    grads = {g["module"]: g for g in r.gradients}
    assert grads["1"]["lost_with_default_scaler"] == 0
    assert not [f for f in r.findings if f.severity.value == "warning"]


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
    r = hr.check_headroom(cw.mlp((32, 64, 10), batch_size=16, loss_weight=1e-7))
    assert r.gradient_summary["flush_to_zero_share"] > 0.9  # without a scaler nearly all would be lost
    assert r.gradient_summary["default_scaler"]["lost_share"] < 0.01
    assert [(f.rule, f.severity.value) for f in r.findings] == [("AMP203", "info")]
