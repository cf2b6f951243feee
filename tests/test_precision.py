import pytest
import torch

from troubleshooter.engine import precision as P
from troubleshooter.errors import UserError


def test_parse_precisions_validates_and_dedups():
    assert P.parse_precisions("fp32, bf16,fp32") == ["fp32", "bf16"]
    with pytest.raises(UserError, match="unknown precision 'fp8'"):
        P.parse_precisions("fp32,fp8")
    with pytest.raises(UserError):
        P.parse_precisions(" , ")


def test_resolve_device_errors_are_readable():
    assert P.resolve_device("cpu").type == "cpu"
    with pytest.raises(UserError):
        P.resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="no CUDA GPU"):
            P.resolve_device("cuda:0")


def test_scaler_only_active_for_fp16():
    cpu = torch.device("cpu")
    assert P.make_scaler("fp16", cpu).is_enabled()
    assert not P.make_scaler("bf16", cpu).is_enabled()
    assert P.autocast_dtype("bf16") is torch.bfloat16 and P.autocast_dtype("fp32") is None


def test_tf32_mode_sets_and_restores_even_after_user_used_new_api():
    before = P.tf32_settings()
    with P.tf32_mode(True):
        assert P.tf32_settings()["matmul_allow_tf32"] and P.tf32_settings()["cudnn_allow_tf32"]
    with P.tf32_mode(False):
        assert not P.tf32_settings()["matmul_allow_tf32"]
    assert P.tf32_settings() == before
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        old = torch.backends.cuda.matmul.fp32_precision
        try:
            # A user on the new API makes torch's legacy getters raise; we must not.
            torch.backends.cuda.matmul.fp32_precision = "tf32"
            with P.tf32_mode(False):
                assert not P.tf32_settings()["matmul_allow_tf32"]
            assert P.tf32_settings()["matmul_allow_tf32"]
        finally:
            torch.backends.cuda.matmul.fp32_precision = old
