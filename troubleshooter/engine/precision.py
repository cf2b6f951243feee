"""One place that knows how each precision is run: autocast dtype, scaler, TF32 switches.

The engine's checks, the speedup check and the NaN hunt all go through these helpers so
"fp16" means the same thing everywhere (autocast float16 + GradScaler), as does "tf32"
(fp32 weights and math with TF32 tensor cores on for matmul and cuDNN).
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from ..errors import UserError

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
_AUTOCAST_DTYPE = {"fp16": torch.float16, "bf16": torch.bfloat16}


def check_precision(name: str) -> str:
    name = name.strip().lower()
    if name not in PRECISIONS:
        raise UserError(f"unknown precision {name!r}: choose from {', '.join(PRECISIONS)}")
    return name


def parse_precisions(text: str) -> list[str]:
    """'fp32,bf16' -> ['fp32', 'bf16'], each validated, order kept, duplicates dropped."""
    out: list[str] = []
    for part in text.split(","):
        if part.strip():
            p = check_precision(part)
            if p not in out:
                out.append(p)
    if not out:
        raise UserError("no precision given: choose from " + ", ".join(PRECISIONS))
    return out


def autocast_dtype(precision: str) -> torch.dtype | None:
    return _AUTOCAST_DTYPE.get(precision)


def uses_scaler(precision: str) -> bool:
    """Only float16 needs loss scaling; bfloat16 has float32's exponent range."""
    return precision == "fp16"


def resolve_device(spec: str | torch.device | None = "auto") -> torch.device:
    """'auto' -> cuda if present else cpu; validates 'cuda:N' against what the host has."""
    if isinstance(spec, torch.device):
        return spec
    spec = (spec or "auto").strip().lower()
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(spec)
    except RuntimeError:
        raise UserError(f"unknown device {spec!r}: use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"device {spec!r} asked for, but this host has no CUDA GPU (use --device cpu)")
        index = device.index or 0
        if index >= torch.cuda.device_count():
            raise UserError(f"device {spec!r} asked for, but this host has {torch.cuda.device_count()} CUDA GPU(s)")
    elif device.type == "mps":
        if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise UserError("device 'mps' asked for, but MPS is not available here")
    elif device.type != "cpu":
        raise UserError(f"unsupported device {spec!r}: use auto, cpu, cuda or cuda:N")
    return device


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The autocast region for a training step's forward pass (nullcontext for fp32/tf32)."""
    dtype = autocast_dtype(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def make_scaler(precision: str, device: torch.device, **kwargs) -> torch.amp.GradScaler:
    """A GradScaler that is active only for fp16, so one loop serves every precision."""
    return torch.amp.GradScaler(device.type, enabled=uses_scaler(precision), **kwargs)


def _new_tf32_api() -> bool:
    """torch >= 2.9 has per-backend `fp32_precision`; once anything sets it, reading the legacy
    `allow_tf32` flags raises, so we must go through the new API whenever it exists."""
    return hasattr(torch.backends.cuda.matmul, "fp32_precision") and hasattr(torch.backends.cudnn, "conv")


def _read(getter):
    """torch raises when legacy and new TF32 APIs were mixed; report that instead of failing."""
    try:
        return getter()
    except RuntimeError:
        return None


def tf32_settings() -> dict:
    """The current TF32 switches, read without tripping torch's legacy/new API mix check."""
    if _new_tf32_api():
        matmul = torch.backends.cuda.matmul.fp32_precision
        conv = torch.backends.cudnn.conv.fp32_precision
        global_precision = _read(torch.get_float32_matmul_precision)
        return {
            "matmul_allow_tf32": matmul == "tf32" or (matmul == "none" and global_precision not in (None, "highest")),
            "cudnn_allow_tf32": conv == "tf32",
            "matmul_fp32_precision": matmul,
            "cudnn_conv_fp32_precision": conv,
            "float32_matmul_precision": global_precision,
        }
    return {
        "matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }


@contextlib.contextmanager
def tf32_mode(enabled: bool) -> Iterator[None]:
    """Turn TF32 for matmul and cuDNN on or off for the block, restoring the previous settings."""
    if _new_tf32_api():
        backends = (torch.backends.cuda.matmul, torch.backends.cudnn.conv, torch.backends.cudnn.rnn)
        old = [b.fp32_precision for b in backends]
        for b in backends:
            b.fp32_precision = "tf32" if enabled else "ieee"
        try:
            yield
        finally:
            for b, value in zip(backends, old):
                b.fp32_precision = value
        return
    old = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


@contextlib.contextmanager
def precision_mode(precision: str, device: torch.device) -> Iterator[None]:
    """Global switches for a whole run in one precision: TF32 only for 'tf32', off otherwise."""
    with tf32_mode(precision == "tf32" and device.type == "cuda"):
        yield


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
