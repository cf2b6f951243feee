"""The check's result classes, without torch: a report crosses from the worker to the app's server
by pickle, and unpickling it imports the modules that define its classes. Defined in the engine's
torch modules, they made the server import torch (about 3 s and 250 MiB) on its first check."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..findings import Finding
from ..hardware import padded_size

WARN_SHARE = 0.05  # a misaligned dimension touching >= 5% of the FLOPs is worth fixing
DEFAULT_INIT_SCALE = 65536.0  # GradScaler's default init_scale: where the skip-rate probe starts
FP16_MAX = 65504.0


@dataclass
class AlignmentRow:
    module: str
    cls: str
    dimension: str
    value: int
    multiple: int
    flops_share: float | None = None  # share of forward FLOPs in the layer this size shapes
    note: str | None = None  # why a misaligned size is only informational
    shapes_gemm: bool = True  # False: no GEMM has this size as such (a finding would be wrong)

    @property
    def aligned(self) -> bool:
        return self.value % self.multiple == 0

    @property
    def padded(self) -> int:
        return padded_size(self.value, self.multiple)

    @property
    def significant(self) -> bool:
        """Misaligned in a way worth a warning: material FLOP share and no mitigating note."""
        return (not self.aligned and self.note is None and self.flops_share is not None
                and self.flops_share >= WARN_SHARE)

    def to_dict(self) -> dict[str, Any]:
        return {
            "module": self.module, "class": self.cls, "dimension": self.dimension,
            "value": self.value, "multiple": self.multiple, "aligned": self.aligned,
            "padded": self.padded,
            "flops_share": None if self.flops_share is None else round(self.flops_share, 6),
            "note": self.note,
        }


@dataclass
class SkipRateResult:
    steps: list[dict[str, Any]]
    summary: dict[str, Any]
    recommendation: dict[str, Any]
    findings: list[Finding] = field(default_factory=list)
    device: str = "cpu"
    seed: int = 0
    init_scale: float = DEFAULT_INIT_SCALE

    def to_dict(self) -> dict[str, Any]:
        """The `skiprate` section of the check JSON (findings go to the top-level list)."""
        return {"device": self.device, "precision": "fp16", "seed": self.seed,
                "init_scale": self.init_scale, "summary": self.summary,
                "recommendation": self.recommendation, "steps": self.steps}


@dataclass
class HeadroomResult:
    activations: list[dict[str, Any]]
    gradients: list[dict[str, Any]]
    gradient_summary: dict[str, Any]
    relative_error: dict[str, dict[str, Any]]
    reference_loss: float | None
    input_max_abs: float | None
    first_overflow: str | None
    first_nonfinite: str | None = None  # the fp32 reference itself is NaN/Inf here (the nan check's case)
    findings: list[Finding] = field(default_factory=list)
    device: str = "cpu"
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The `headroom` section of the check JSON (findings go to the top-level list)."""
        return {
            "device": self.device, "seed": self.seed, "fp16_max": FP16_MAX,
            "reference_loss": self.reference_loss, "input_max_abs": self.input_max_abs,
            "first_overflow": self.first_overflow, "first_nonfinite_fp32": self.first_nonfinite,
            "activations": self.activations,
            "gradient_summary": self.gradient_summary, "gradients": self.gradients,
            "relative_error": self.relative_error,
        }
