"""The check's answers on a CPU host are the GPU's: CUDA autocast's policy emulated, one finding at
the module whose own code made an overflow, and silent fp16 collapses named down to the op
(tests/fixtures/check/planted_faults.py)."""
import sys
from pathlib import Path

import pytest
import torch

from troubleshooter.engine.autocast_policy import autocast_policy
from troubleshooter.engine.check import _tagged, merge_findings
from troubleshooter.engine.headroom import check_headroom
from troubleshooter.engine.lowp_emulation import half_on_float32
from troubleshooter.engine.nanhunt import hunt_nonfinite

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "check"))
from planted_faults import workload  # noqa: E402

FIXTURE = "planted_faults.py"


def _hunt(kind, square="mul", policy="cuda"):
    """The nan check as `check` runs it on a CPU (fp32 and fp16 only: the faults are fp16's)."""
    with autocast_policy("cpu", policy), half_on_float32(torch.device("cpu")):
        return hunt_nonfinite(workload(kind, square), "cpu", precisions=("fp32", "fp16"))


def test_an_overflow_made_by_an_mlps_own_code_is_one_finding_at_the_mlp_with_an_mlp_fix():
    nan = _hunt("mlp")["findings"]
    with autocast_policy("cpu"), half_on_float32(torch.device("cpu")):
        head = check_headroom(workload("mlp"), "cpu").findings
    merged = merge_findings([_tagged(f, "nan") for f in nan] + [_tagged(f, "headroom") for f in head])
    serious = [f for f in merged if f.severity.value in ("error", "warning") and f.precision == "fp16"
               and f.rule in ("AMP202", "AMP205", "AMP206")]
    assert [(f.rule, f.location.module) for f in serious] == [("AMP202", "mixer")], merged
    (f,) = serious
    assert set(f.data["confirmed_by"]) == {"nan", "headroom"}  # the two checks agree on one module
    assert f.data["first_nonfinite_output"] == "mixer.down" and "own forward() code" in f.message
    assert "silu(gate) * up" in f.suggestion and "attention" not in f.suggestion


def test_an_in_place_attention_bias_overflow_is_amp202_at_the_attention():
    (f,) = _hunt("attn")["findings"]
    assert (f.rule, f.location.module, f.precision) == ("AMP202", "mixer", "fp16")
    assert f.data["reference"]["precision"] == "fp32" and "scores" in f.suggestion


def test_a_norm_whose_mean_of_squares_overflows_collapses_silently_and_the_op_is_named():
    r = _hunt("qk", "mul")
    (f,) = r["findings"]
    assert (f.rule, f.location.module, f.precision) == ("AMP212", "mixer.q_norm", "fp16")
    assert r["precisions"]["fp16"]["loss_finite"] and r["precisions"]["fp16"]["first_forward"] is None
    op = f.data["op"]
    assert op["op"] == "Tensor.mul" and op["kind"] == "overflow" and op["where"]["path"].endswith(FIXTURE)
    assert f.data["collapse"]["zero"] and "all zeros" in f.message and "float32" in f.suggestion


@pytest.mark.parametrize("kind,square", [("qk", "pow"), ("softmax_pool", "mul")])
def test_ops_cuda_keeps_in_float32_fail_only_under_the_hosts_own_policy(kind, square):
    # x.pow(2) and exp(s): float16 in CPU autocast, float32 in CUDA's; the GPU answer is clean
    assert _hunt(kind, square, "cuda")["findings"] == []
    host = _hunt(kind, square, "host")["findings"]
    assert [f.rule for f in host] == (["AMP212"] if kind == "qk" else ["AMP202"])
    if kind == "qk":
        assert host[0].data["op"]["op"] == "Tensor.pow"
