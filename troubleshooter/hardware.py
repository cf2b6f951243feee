"""Facts about GPU architectures and devices, read from `data/gpus.yaml`.

Kept as data so a new GPU is one line in the YAML file, and pure (no torch) so the
questionnaire can reason about a GPU the user names without having one.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import yaml


# Tensor cores want GEMM dimensions in multiples of 16 bytes: 8 float16/bfloat16 elements.
# Vocabulary sizes (embedding rows, LM heads) do best as multiples of 64.
HALF_MULTIPLE = 8
VOCAB_MULTIPLE = 64


def padded_size(value: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is >= value: the size to pad a dimension to."""
    return -(-int(value) // multiple) * multiple


@dataclass(frozen=True)
class Architecture:
    name: str
    min_cc: tuple[int, int]
    fp16_tensor_cores: bool
    bf16: bool
    tf32: bool
    fp8: bool


@dataclass(frozen=True)
class GpuModel:
    name: str
    match: tuple[str, ...]
    cc: tuple[int, int]
    memory_gb: float
    peak_tflops: dict
    approximate: bool = False

    @property
    def architecture(self) -> Architecture:
        return architecture_for(self.cc)


def parse_cc(value) -> tuple[int, int]:
    """'8.6' or (8, 6) or 8.6 -> (8, 6)."""
    if isinstance(value, (tuple, list)):
        return int(value[0]), int(value[1])
    major, _, minor = str(value).partition(".")
    return int(major), int(minor or 0)


@lru_cache(maxsize=1)
def _data() -> dict:
    text = resources.files("troubleshooter.data").joinpath("gpus.yaml").read_text(encoding="utf-8")
    return yaml.safe_load(text)


@lru_cache(maxsize=1)
def architectures() -> tuple[Architecture, ...]:
    archs = [
        Architecture(
            name=a["name"], min_cc=parse_cc(a["min_cc"]), fp16_tensor_cores=a["fp16_tensor_cores"],
            bf16=a["bf16"], tf32=a["tf32"], fp8=a["fp8"],
        )
        for a in _data()["architectures"]
    ]
    return tuple(sorted(archs, key=lambda a: a.min_cc))


@lru_cache(maxsize=1)
def gpu_models() -> tuple[GpuModel, ...]:
    return tuple(
        GpuModel(
            name=g["name"], match=tuple(g["match"]), cc=parse_cc(g["cc"]), memory_gb=g["memory_gb"],
            peak_tflops=dict(g["peak_tflops"]), approximate=bool(g.get("approximate", False)),
        )
        for g in _data()["gpus"]
    )


def architecture_for(cc) -> Architecture:
    """The newest architecture whose first compute capability is <= cc."""
    cc = parse_cc(cc)
    found = architectures()[0]
    for arch in architectures():
        if arch.min_cc <= cc:
            found = arch
    return found


def find_gpu(name: str) -> GpuModel | None:
    """Match a device name ('NVIDIA H100 80GB HBM3', 'rtx 4090', 'T4') to a known GPU model."""
    needle = f" {name.strip().lower()}"
    for gpu in gpu_models():
        if any(m in needle for m in gpu.match) or needle.strip() == gpu.name.lower():
            return gpu
    return None


def peak_tflops(device_name: str, precision: str) -> float | None:
    """Dense peak TFLOP/s for a precision (fp32/tf32/fp16/bf16/fp8), None when unknown."""
    gpu = find_gpu(device_name)
    if gpu is None:
        return None
    return gpu.peak_tflops.get(precision)
