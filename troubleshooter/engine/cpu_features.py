"""CPU instruction-set features that decide whether bf16/fp16 are fast on a CPU.

bf16 autocast on a CPU without `avx512_bf16` or AMX is emulated by conversions and usually runs
slower than fp32; with them, bf16 matmuls are several times faster. Linux exposes the flags in
/proc/cpuinfo; the text is injectable so tests can describe any CPU.
"""
from __future__ import annotations

import platform
from typing import Any

# The flags we report, in the order shown; the Linux names.
FLAGS = ("avx512_bf16", "amx_bf16", "amx_tile", "avx512_fp16", "amx_fp16", "avx512f", "avx2")
BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # native bf16 dot products
FP16_FLAGS = ("amx_fp16", "avx512_fp16")  # native fp16 arithmetic
CPUINFO = "/proc/cpuinfo"


def parse_cpuinfo(text: str) -> tuple[str | None, set[str]]:
    """(model name, flags) from /proc/cpuinfo text (x86 `flags`, ARM `Features`)."""
    model, flags = None, set()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip().lower()
        if key == "model name" and model is None:
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = set(value.split())
    return model, flags


def cpu_features(cpuinfo_text: str | None = None) -> dict[str, Any]:
    """{"model", "flags": {flag: bool | None}, "source"}; flags are None where they cannot be read."""
    source = None
    if cpuinfo_text is None:
        try:
            with open(CPUINFO, encoding="utf-8", errors="replace") as fh:
                cpuinfo_text = fh.read()
            source = CPUINFO
        except OSError:
            cpuinfo_text = None
    else:
        source = "injected"
    if cpuinfo_text is None:
        return {"model": platform.processor() or None, "flags": {f: None for f in FLAGS}, "source": None,
                "machine": platform.machine()}
    model, flags = parse_cpuinfo(cpuinfo_text)
    return {"model": model or platform.processor() or None, "flags": {f: f in flags for f in FLAGS},
            "source": source, "machine": platform.machine()}


def torch_cpu_capability() -> str | None:
    """What PyTorch's CPU kernels dispatch to here: 'AVX512', 'AVX2', 'DEFAULT', ..."""
    try:
        import torch

        return torch.backends.cpu.get_cpu_capability()
    except Exception:  # noqa: BLE001 - older torch or an unusual build: just unknown
        return None
