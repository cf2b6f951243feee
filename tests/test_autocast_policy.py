"""CUDA autocast's dtype policy emulated on a CPU host (engine/autocast_policy.py): the op lists
come from torch itself, match PyTorch's documented CUDA lists op by op, and change what a check
answers; the host's own policy stays one option away."""
import json
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from troubleshooter.engine import autocast_policy as ap
from troubleshooter.engine.lowp_emulation import HalfOnFloat32

DOCS = json.loads((Path(__file__).parent / "fixtures" / "autocast" / "cuda_op_reference.json").read_text())


def _h(*shape):
    return torch.randn(*shape).half()


def _f(*shape):
    return torch.randn(*shape)


# one call per documented name; inputs in float32 for the float16 list, in float16 for the float32
# list (autocast would otherwise have nothing to change)
FLOAT16_CALLS = {
    "__matmul__": lambda: _f(3, 4) @ _f(4, 5),
    "addbmm": lambda: torch.addbmm(_f(3, 5), _f(2, 3, 4), _f(2, 4, 5)),
    "addmm": lambda: torch.addmm(_f(3, 5), _f(3, 4), _f(4, 5)),
    "addmv": lambda: torch.addmv(_f(3), _f(3, 4), _f(4)),
    "addr": lambda: torch.addr(_f(3, 4), _f(3), _f(4)),
    "baddbmm": lambda: torch.baddbmm(_f(2, 3, 5), _f(2, 3, 4), _f(2, 4, 5)),
    "bmm": lambda: torch.bmm(_f(2, 3, 4), _f(2, 4, 5)),
    "multi_dot": lambda: torch.linalg.multi_dot([_f(3, 4), _f(4, 5), _f(5, 2)]),
    "conv1d": lambda: F.conv1d(_f(1, 2, 8), _f(3, 2, 3)),
    "conv2d": lambda: F.conv2d(_f(1, 2, 6, 6), _f(3, 2, 3, 3)),
    "conv3d": lambda: F.conv3d(_f(1, 2, 4, 4, 4), _f(3, 2, 3, 3, 3)),
    "conv_transpose1d": lambda: F.conv_transpose1d(_f(1, 2, 8), _f(2, 3, 3)),
    "conv_transpose2d": lambda: F.conv_transpose2d(_f(1, 2, 5, 5), _f(2, 3, 3, 3)),
    "conv_transpose3d": lambda: F.conv_transpose3d(_f(1, 2, 3, 3, 3), _f(2, 3, 2, 2, 2)),
    "GRUCell": lambda: nn.GRUCell(4, 5)(_f(3, 4)),
    "linear": lambda: F.linear(_f(3, 4), _f(5, 4)),
    "LSTMCell": lambda: nn.LSTMCell(4, 5)(_f(3, 4))[0],
    "matmul": lambda: torch.matmul(_f(3, 4), _f(4, 5)),
    "mm": lambda: torch.mm(_f(3, 4), _f(4, 5)),
    "mv": lambda: torch.mv(_f(3, 4), _f(4)),
    "prelu": lambda: F.prelu(_f(2, 3, 4), _f(3)),
    "RNNCell": lambda: nn.RNNCell(4, 5)(_f(3, 4)),
}
_T = lambda: torch.tensor([1, 0, 2])  # noqa: E731 - class targets
FLOAT32_CALLS = {
    "__pow__": lambda: _h(3, 4) ** 2,
    "__rdiv__": lambda: _h(3, 4).__rdiv__(2.0),
    "__rpow__": lambda: 2.0 ** _h(3, 4),
    "__rtruediv__": lambda: 2.0 / _h(3, 4),
    "acos": lambda: torch.acos(_h(3, 4).clamp(-1, 1)),
    "asin": lambda: torch.asin(_h(3, 4).clamp(-1, 1)),
    "binary_cross_entropy_with_logits": lambda: F.binary_cross_entropy_with_logits(_h(3, 4), _h(3, 4).sigmoid()),
    "cosh": lambda: torch.cosh(_h(3, 4)),
    "cosine_embedding_loss": lambda: F.cosine_embedding_loss(_h(3, 4), _h(3, 4), torch.ones(3)),
    "cdist": lambda: torch.cdist(_h(3, 4), _h(5, 4)),
    "cosine_similarity": lambda: F.cosine_similarity(_h(3, 4), _h(3, 4)),
    "cross_entropy": lambda: F.cross_entropy(_h(3, 4), _T()),
    "cumprod": lambda: torch.cumprod(_h(3, 4), 1),
    "cumsum": lambda: torch.cumsum(_h(3, 4), 1),
    "dist": lambda: torch.dist(_h(3, 4), _h(3, 4)),
    "erfinv": lambda: torch.erfinv(_h(3, 4).clamp(-0.9, 0.9)),
    "exp": lambda: torch.exp(_h(3, 4)),
    "expm1": lambda: torch.expm1(_h(3, 4)),
    "group_norm": lambda: F.group_norm(_h(2, 4, 3), 2),
    "hinge_embedding_loss": lambda: F.hinge_embedding_loss(_h(3, 4), torch.ones(3, 4)),
    "kl_div": lambda: F.kl_div(_h(3, 4), _h(3, 4).abs(), reduction="batchmean"),
    "l1_loss": lambda: F.l1_loss(_h(3, 4), _h(3, 4)),
    "layer_norm": lambda: F.layer_norm(_h(3, 4), (4,)),
    "log": lambda: torch.log(_h(3, 4).abs() + 1),
    "log_softmax": lambda: F.log_softmax(_h(3, 4), -1),
    "log10": lambda: torch.log10(_h(3, 4).abs() + 1),
    "log1p": lambda: torch.log1p(_h(3, 4).abs()),
    "log2": lambda: torch.log2(_h(3, 4).abs() + 1),
    "margin_ranking_loss": lambda: F.margin_ranking_loss(_h(3), _h(3), torch.ones(3)),
    "mse_loss": lambda: F.mse_loss(_h(3, 4), _h(3, 4)),
    "multilabel_margin_loss": lambda: F.multilabel_margin_loss(_h(3, 4), torch.tensor([[1, -1, 0, 0]] * 3)),
    "multi_margin_loss": lambda: F.multi_margin_loss(_h(3, 4), _T()),
    "nll_loss": lambda: F.nll_loss(_h(3, 4), _T()),
    "norm": lambda: torch.norm(_h(3, 4)),
    "normalize": lambda: F.normalize(_h(3, 4), dim=-1),
    "pdist": lambda: F.pdist(_h(3, 4)),
    "poisson_nll_loss": lambda: F.poisson_nll_loss(_h(3, 4), _h(3, 4).abs()),
    "pow": lambda: torch.pow(_h(3, 4), 3),
    "prod": lambda: torch.prod(_h(3, 4)),
    "reciprocal": lambda: torch.reciprocal(_h(3, 4)),
    "rsqrt": lambda: torch.rsqrt(_h(3, 4).abs() + 1),
    "sinh": lambda: torch.sinh(_h(3, 4)),
    "smooth_l1_loss": lambda: F.smooth_l1_loss(_h(3, 4), _h(3, 4)),
    "soft_margin_loss": lambda: F.soft_margin_loss(_h(3, 4), torch.ones(3, 4)),
    "softmax": lambda: F.softmax(_h(3, 4), -1),
    "softmin": lambda: F.softmin(_h(3, 4), -1),
    "softplus": lambda: F.softplus(_h(3, 4)),
    "sum": lambda: torch.sum(_h(3, 4)),
    "renorm": lambda: torch.renorm(_h(3, 4), 2, 0, 1.0),
    "tan": lambda: torch.tan(_h(3, 4)),
    "triplet_margin_loss": lambda: F.triplet_margin_loss(_h(3, 4), _h(3, 4), _h(3, 4)),
}


def _promote(mixed: bool):
    """One call per documented promote op: an float32 input among float16 ones when `mixed`."""
    a = (lambda *s: _f(*s)) if mixed else _h
    idx = torch.tensor([0, 2])
    return {
        "addcdiv": lambda: torch.addcdiv(a(3), _h(3), _h(3).abs() + 1),
        "addcmul": lambda: torch.addcmul(a(3), _h(3), _h(3)),
        "atan2": lambda: torch.atan2(a(3), _h(3)),
        "bilinear": lambda: F.bilinear(_h(2, 3), _h(2, 4), a(5, 3, 4)),
        "cross": lambda: torch.cross(a(2, 3), _h(2, 3), dim=1),
        "dot": lambda: torch.dot(a(3), _h(3)),
        "grid_sample": lambda: F.grid_sample(a(1, 2, 4, 4), _h(1, 3, 3, 2).clamp(-1, 1), align_corners=False),
        "index_put": lambda: a(4).index_put((idx,), _h(2)),
        "scatter_add": lambda: a(4).scatter_add(0, idx, _h(2)),
        "tensordot": lambda: torch.tensordot(a(3, 4), _h(4, 5), dims=1),
    }


def _dtypes(calls: dict, policy: str) -> dict:
    out = {}
    with ap.autocast_policy("cpu", policy), torch.autocast("cpu", dtype=torch.float16):
        for name, call in calls.items():
            torch.manual_seed(0)
            try:
                out[name] = call().dtype
            except NotImplementedError:  # the host's own lists: no half kernel on this CPU
                out[name] = None
    return out


def test_every_documented_cuda_op_has_a_call_here():
    assert set(DOCS["float16"]) == set(FLOAT16_CALLS)
    assert set(DOCS["float32"]) == set(FLOAT32_CALLS)
    assert set(DOCS["promote"]) == set(_promote(True))


def test_documented_cuda_float16_ops_run_in_float16():
    got = _dtypes(FLOAT16_CALLS, "cuda")
    assert {k for k, v in got.items() if v is not torch.float16} == set(), got


def test_documented_cuda_float32_ops_run_in_float32_and_the_host_policy_keeps_cpus_lists():
    cuda = _dtypes(FLOAT32_CALLS, "cuda")
    assert {k for k, v in cuda.items() if v is not torch.float32} == set(), cuda
    host = _dtypes(FLOAT32_CALLS, "host")
    # CPU autocast leaves these in float16: what made CPU hosts report overflows a GPU never has
    assert {"exp", "__pow__", "sum", "softmax", "layer_norm", "cumsum", "norm"} <= {
        k for k, v in host.items() if v is torch.float16}


def test_documented_promote_ops_run_in_the_widest_input_type():
    mixed = _dtypes(_promote(True), "cuda")
    assert {k for k, v in mixed.items() if v is not torch.float32} == set(), mixed
    half = _dtypes(_promote(False), "cuda")
    assert {k for k, v in half.items() if v is not torch.float16} == set(), half


@pytest.mark.skipif(not os.path.exists(ap.header_path()), reason="this torch has no ATen headers installed")
def test_the_lists_are_read_from_torchs_own_header_and_the_fallback_table_matches_it():
    lists = ap.cuda_op_lists()
    assert lists.from_torch and "autocast_mode.h" in lists.source
    parsed = ap.parse_header(Path(ap.header_path()).read_text())
    if torch.__version__.split("+")[0] != ap.TABLE_TORCH:
        pytest.skip(f"the fallback table is torch {ap.TABLE_TORCH}'s; this is {torch.__version__}")
    for policy, names in ap._TABLE.items():
        extra = ap._CPP_LOWER if policy == "lower_precision_fp" else ()
        assert parsed[policy] == names + extra, policy


def test_without_the_header_the_table_stands_in_and_says_so(monkeypatch):
    monkeypatch.setattr(ap, "_LISTS", None)
    monkeypatch.setattr(ap, "header_path", lambda: "/nonexistent/autocast_mode.h")
    lists = ap.cuda_op_lists()
    assert not lists.from_torch and ap.TABLE_TORCH in lists.source
    assert lists.policy_of("exp") == "fp32" and lists.policy_of("sum.dim_IntList") == "fp32_set_opt_dtype"
    monkeypatch.setattr(ap, "_LISTS", None)


def test_the_emulation_is_removed_and_composes_with_the_half_gemm_emulation():
    x = torch.randn(4, 8, requires_grad=True)
    w = torch.randn(8, 8, requires_grad=True)
    with HalfOnFloat32([torch.float16]) as gemm, ap.autocast_policy("cpu") as run, \
            torch.autocast("cpu", dtype=torch.float16):
        h = x @ w
        loss = h.exp().sum()
        bce = F.binary_cross_entropy(torch.sigmoid(h), torch.ones_like(h))
    loss.backward()  # the casts are recorded by autograd, as CUDA autocast's are
    assert h.dtype is torch.float16 and loss.dtype is torch.float32 and x.grad.dtype is torch.float32
    assert gemm.calls.get("fp16", 0) >= 1  # the matmul ran through the GEMM emulation below
    assert run.ops["exp"] == 1 and run.banned == {"binary_cross_entropy": 1} and bce.dtype is torch.float32
    described = ap.describe(run)
    assert described["label"] == "CUDA autocast policy emulated on CPU" and described["banned"]
    (f,) = ap.banned_findings(described)  # on a GPU that line raises: said at the line
    assert (f.rule, f.severity.value) == ("AMP213", "error") and f.location.path == __file__
    assert "binary_cross_entropy_with_logits" in f.suggestion
    with torch.autocast("cpu", dtype=torch.float16):
        assert (x @ w).exp().dtype is torch.float16  # CPU's own kernels are back


def test_policy_option_is_validated():
    assert ap.check_policy(" HOST ") == "host" and ap.check_policy(None) == "cuda"
    with pytest.raises(Exception, match="unknown autocast policy"):
        ap.check_policy("gpu")
    assert ap.describe(None, "host")["label"] == "host CPU policy"
