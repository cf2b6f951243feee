"""The engine's `nan` check: the first non-finite module per precision, as findings."""
import json

import pytest
import torch
from torch import nn

from troubleshooter.engine.nanhunt import hunt_nonfinite
from troubleshooter.workload import Workload


def workload(build, loss_weight=1.0, scale=1.0, features=16, name="t"):
    def make_batch(bs, device, gen):
        x = torch.randn(bs, features, generator=gen) * scale
        y = torch.randint(0, 4, (bs,), generator=gen)
        return (x.to(device),), y.to(device)

    return Workload(name, build, make_batch, nn.functional.cross_entropy,
                    lambda p: torch.optim.SGD(p, lr=0.1), 8, loss_weight=loss_weight)


class Log(nn.Module):
    def forward(self, x):
        return torch.log(x)


class Sqrt(nn.Module):
    def forward(self, x):
        return torch.sqrt(x)


def overflow_at_2():
    m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    with torch.no_grad():
        m[2].weight.mul_(2e5)  # |output of '2'| ~ 1e5: fine in fp32/bf16, inf in float16
    return m


def by_rule(result):
    return sorted((f.rule, f.location.module, f.precision) for f in result["findings"])


def test_fp16_only_overflow_is_amp202_at_the_layer():
    r = hunt_nonfinite(workload(overflow_at_2), "cpu")
    assert by_rule(r) == [("AMP202", "2", "fp16")]
    fp16 = r["precisions"]["fp16"]["first_forward"]
    assert fp16["module"] == "2" and fp16["class"] == "Linear" and fp16["dtype"] == "float16"
    assert fp16["created"] and fp16["kind"] == "inf" and fp16["output_max_abs"] == ["inf"]
    assert r["precisions"]["fp32"]["first_forward"] is None and r["precisions"]["bf16"]["first_forward"] is None
    f = r["findings"][0]
    assert f.data["reference"]["precision"] == "fp32" and f.data["reference"]["max_abs"] > 65504


def test_nan_in_every_precision_is_amp205_in_each():
    build = lambda: nn.Sequential(nn.Linear(16, 32), Log(), nn.Linear(32, 4))  # noqa: E731
    r = hunt_nonfinite(workload(build), "cpu")
    assert by_rule(r) == [("AMP205", "1", "bf16"), ("AMP205", "1", "fp16"), ("AMP205", "1", "fp32")]
    for p, section in r["precisions"].items():
        ff = section["first_forward"]
        assert ff["class"] == "Log" and ff["kind"] == "nan" and ff["created"], p
        assert section["loss_finite"] is False and section["loss"] is None
        assert section["first_backward"]["caused_by_forward"] is True


def test_backward_only_nonfinite_is_amp206_at_the_module_whose_backward_makes_it():
    build = lambda: nn.Sequential(nn.Linear(16, 32), nn.ReLU(), Sqrt(), nn.Linear(32, 4))  # noqa: E731
    r = hunt_nonfinite(workload(build), "cpu")
    assert by_rule(r) == [("AMP206", "2", "bf16"), ("AMP206", "2", "fp16"), ("AMP206", "2", "fp32")]
    fb = r["precisions"]["fp32"]["first_backward"]
    assert fb["class"] == "Sqrt" and fb["grad_of"] == "input" and fb["kind"] == "inf"
    assert r["precisions"]["fp32"]["first_forward"] is None
    fp16 = r["precisions"]["fp16"]
    # the scaled backward (what a real fp16 run does) is reported apart from the unscaled one
    assert fp16["scaled_backward"]["loss_scale"] == 65536.0 and fp16["first_backward"]["loss_scale"] == 1.0


def test_scaled_only_backward_overflow_is_a_skip_not_a_finding():
    def build():
        m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
        with torch.no_grad():
            m[2].weight.mul_(300.0)  # loss ~1e3: x 65536 overflows float16 gradients, x 1 does not
        return m

    r = hunt_nonfinite(workload(build), "cpu")
    assert r["findings"] == []
    fp16 = r["precisions"]["fp16"]
    assert fp16["skipped_steps"] == 1 and fp16["scaled_backward"] is not None
    assert fp16["first_backward"] is None and fp16["first_forward"] is None


def test_clean_model_with_inplace_relu_stays_clean_and_json_safe():
    build = lambda: nn.Sequential(nn.Linear(16, 32), nn.ReLU(inplace=True), nn.Linear(32, 4))  # noqa: E731
    r = hunt_nonfinite(workload(build), "cpu", steps=2)
    assert r["findings"] == [] and r["device"] == "cpu"
    for section in r["precisions"].values():
        assert section["loss_finite"] and section["first_forward"] is None and section["first_backward"] is None
        assert section["steps_run"] == 2
    json.dumps(r["precisions"], allow_nan=False)


def test_nonfinite_input_batch_is_reported_as_propagated():
    build = lambda: nn.Sequential(nn.Linear(16, 8), nn.Linear(8, 4))  # noqa: E731
    r = hunt_nonfinite(workload(build, scale=1e39), "cpu", precisions=("fp32",))
    ff = r["precisions"]["fp32"]["first_forward"]
    assert ff["module"] == "0" and not ff["created"] and "input batch" in ff["source"]
    assert by_rule(r) == [("AMP205", "0", "fp32")]
    json.dumps(r["precisions"], allow_nan=False)


def test_loss_only_nonfinite_and_failing_precision_do_not_crash():
    build = lambda: nn.Sequential(nn.Linear(16, 4))  # noqa: E731
    r = hunt_nonfinite(workload(build, loss_weight=float("inf")), "cpu", precisions=("fp32",))
    assert by_rule(r) == [("AMP205", None, "fp32")]
    # finite loss, but x1e8 its gradient w.r.t. the float16 model output overflows
    r = hunt_nonfinite(workload(build, loss_weight=1e8), "cpu")
    assert by_rule(r) == [("AMP206", "0", "fp16")]
    assert r["precisions"]["fp16"]["first_backward"]["grad_of"] == "loss"

    class Broken(nn.Linear):
        def forward(self, x):
            raise RuntimeError("kernel not implemented for this dtype")

    r = hunt_nonfinite(workload(lambda: Broken(16, 4)), "cpu", precisions=("fp32", "bf16"))
    assert "kernel not implemented" in r["precisions"]["fp32"]["error"] and r["findings"] == []


def test_bad_precision_is_a_user_error():
    from troubleshooter.errors import UserError

    with pytest.raises(UserError):
        hunt_nonfinite(workload(lambda: nn.Linear(16, 4)), "cpu", precisions=("fp8",))


SPEC = """
model:
  layers:
    - Linear: [32, 64]
    - ReLU
    - Linear: [64, 64]
    - {act}
    - Linear: [64, 10]
{weights}
input: {{shape: [16, 32]}}
target: {{kind: classes, num_classes: 10}}
loss: cross_entropy
"""


def test_yaml_specs_through_the_spec_loader(tmp_path):
    """The way the check is driven: a YAML layer stack, a weights file, module paths 0, 1, 2..."""
    from troubleshooter.spec import SpecSource, load_workload

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    with torch.no_grad():
        model[2].weight.mul_(1e5)  # layer '2' overflows float16 only
    torch.save(model.state_dict(), tmp_path / "big.pt")

    def run(act, weights=""):
        text = SPEC.format(act=act, weights=weights)
        return by_rule(hunt_nonfinite(load_workload(SpecSource.yaml_text(text, base_dir=tmp_path)), "cpu"))

    assert run("ReLU") == []
    assert run("ReLU", "weights: big.pt") == [("AMP202", "2", "fp16")]
    assert run("Threshold: [0.0, .nan]") == [("AMP205", "3", p) for p in ("bf16", "fp16", "fp32")]


# ---------------------------------------------------------------- NaN shared with fp32 (issue 11.3)
def _planted():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "check"))
    import nan_in_fp32_too

    return nan_in_fp32_too


def test_sqrt_at_zero_in_backward_is_a_model_bug_in_every_precision_not_a_bf16_cure():
    from troubleshooter.engine.nanhunt import hunt_nonfinite

    out = hunt_nonfinite(_planted().sqrt_norm_workload(), "cpu")
    found = {(f.rule, f.location.module, f.precision): f for f in out["findings"]}
    assert set(found) == {("AMP206", "1", "fp32"), ("AMP206", "1", "fp16"), ("AMP206", "1", "bf16")}
    for f in found.values():
        assert f.data["precision_problem"] is False
        assert "bf16" not in f.suggestion.replace("bf16 or keeping", "")  # no half-precision cure
        assert "model or data bug" in f.suggestion
    assert found[("AMP206", "1", "fp16")].data["also_in_fp32"] == {"precision": "fp32", "pass": "backward", "module": "1"}


def test_padding_rows_normalised_by_zero_norm_are_a_model_bug():
    from troubleshooter.engine.nanhunt import hunt_nonfinite

    out = hunt_nonfinite(_planted().zero_row_workload(), "cpu")
    found = {(f.rule, f.location.module, f.precision): f for f in out["findings"]}
    assert set(found) == {("AMP205", "0", "fp32"), ("AMP205", "0", "fp16"), ("AMP205", "0", "bf16")}
    assert all("not a precision problem" in f.message or f.precision == "fp32" for f in found.values())
    assert all("prefer bf16" not in f.suggestion and "Train in bf16" not in f.suggestion for f in found.values())


def test_an_fp16_only_nan_keeps_its_precision_advice():
    import check_workloads as cw  # noqa: F401 - on the path through _planted()
    from troubleshooter.engine.nanhunt import hunt_nonfinite

    _planted()
    out = hunt_nonfinite(cw.mlp((32, 64, 64, 10), batch_size=16, blow_up={2: 1e5}), "cpu")
    (f,) = [f for f in out["findings"] if f.precision == "fp16"]
    assert f.rule == "AMP202" and "bf16" in f.suggestion and "also_in_fp32" not in f.data


class LogOfZero(nn.Module):
    """log(relu(x) * 0) = log(0) = -inf on every element: a -inf, not an overflow."""
    def forward(self, x):
        return torch.log(torch.relu(x) * 0)


def test_minus_inf_is_reported_as_minus_inf_in_the_event_the_finding_and_the_text():
    from troubleshooter.engine.check_render import where
    from troubleshooter.engine.nanhunt import format_event

    build = lambda: nn.Sequential(nn.Linear(16, 32), LogOfZero(), nn.Linear(32, 4))  # noqa: E731
    r = hunt_nonfinite(workload(build), "cpu", precisions=("fp32",))
    ff = r["precisions"]["fp32"]["first_forward"]
    assert ff["module"] == "1" and ff["kind"] == "inf" and ff["value"] == "-inf"
    msg = r["findings"][0].message
    assert "-inf" in msg and " inf " not in msg.replace("-inf", "")
    assert "outputs -inf" in format_event({"step": 0, "forward": ff})
    assert where(ff).startswith("'1'") and " -inf" in where(ff)  # the page's and the CLI's wording


def test_plus_and_minus_inf_values_from_min_and_max():
    from troubleshooter.engine.nanhooks import combined_value, nonfinite_value

    inf = float("inf")
    assert nonfinite_value(-inf, 3.0) == "-inf" and nonfinite_value(1.0, inf) == "inf"
    assert nonfinite_value(-inf, inf) == "inf and -inf" and nonfinite_value(float("nan"), 1.0) == "nan"
    assert combined_value(["-inf", "inf"]) == "inf and -inf" and combined_value(["-inf", "nan"]) == "nan"


def test_nanhunt_under_inference_mode_localises_instead_of_crashing():
    """Inference tensors keep no version counter: reading it raised 'Inference tensors do not track
    version counter' from inside the hooks. They are now reduced without trusting a version."""
    import torch

    from troubleshooter.engine.nanhunt import nanhunt

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    with torch.no_grad():
        model[0].weight[0, 0] = float("inf")
    with torch.inference_mode(), nanhunt(model) as hunt:
        model(torch.ones(2, 4))
        found = hunt.step()
    assert found["forward"]["module"] == "0" and found["forward"]["class"] == "Linear"
