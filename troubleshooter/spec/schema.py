"""The YAML spec's schema (pydantic): types, allowed values and the cross-field rules.

Shape-dependent rules (does the target fit the output?) need the model and live in `yamlspec`.
"""
from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

from .optim import OPTIMIZERS, OptimizerConfig

_DTYPES = {"float32": "float32", "float": "float32", "torch.float32": "float32", "fp32": "float32",
           "int64": "int64", "long": "int64", "torch.int64": "int64", "torch.long": "int64"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InputSpec(_Strict):
    shape: list[StrictInt] = Field(min_length=1)
    dtype: Literal["float32", "int64"] = "float32"
    scale: float = 1.0
    high: StrictInt | None = None

    @field_validator("dtype", mode="before")
    @classmethod
    def _dtype(cls, v: Any) -> Any:
        if isinstance(v, str) and v.strip().lower() in _DTYPES:
            return _DTYPES[v.strip().lower()]
        if isinstance(v, str):
            raise ValueError(f"dtype must be float32 (real-valued input) or int64 (token ids), got {v!r}")
        return v

    @field_validator("shape")
    @classmethod
    def _shape(cls, v: list[int]) -> list[int]:
        bad = [s for s in v if s < 1]
        if bad:
            raise ValueError(f"every dimension must be at least 1, got {v}")
        return v

    @field_validator("scale")
    @classmethod
    def _scale(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("scale must be a finite number")
        return v

    @model_validator(mode="after")
    def _high(self) -> "InputSpec":
        if self.dtype == "int64" and self.high is None:
            raise ValueError("int64 input needs `high`: token ids are drawn from [0, high), e.g. the vocabulary size")
        if self.dtype == "int64" and self.high is not None and self.high < 1:
            raise ValueError("high must be at least 1")
        if self.dtype == "float32" and self.high is not None:
            raise ValueError("`high` applies only to int64 input (use `scale` for float input)")
        return self

    @property
    def batch_size(self) -> int:
        return self.shape[0]


class TargetSpec(_Strict):
    kind: Literal["classes", "regression", "none"] = "classes"
    num_classes: StrictInt | None = None

    @model_validator(mode="after")
    def _classes(self) -> "TargetSpec":
        if self.num_classes is not None and self.kind != "classes":
            raise ValueError(f"num_classes applies only to kind 'classes', not {self.kind!r}")
        if self.num_classes is not None and self.num_classes < 2:
            raise ValueError("num_classes must be at least 2")
        return self


class OptimizerSpec(_Strict):
    name: str = "adamw"
    lr: float = Field(1e-3, gt=0)
    weight_decay: float | None = Field(None, ge=0)
    momentum: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0)

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, v: Any) -> Any:
        if isinstance(v, str) and v.strip().lower() in OPTIMIZERS:
            return v.strip().lower()
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {v!r}")

    @model_validator(mode="after")
    def _fields(self) -> "OptimizerSpec":
        if self.name != "sgd" and self.momentum:
            raise ValueError(f"momentum applies only to sgd (use betas for {self.name})")
        return self

    def config(self) -> OptimizerConfig:
        return OptimizerConfig(name=self.name, lr=self.lr, weight_decay=self.weight_decay,
                               momentum=self.momentum, betas=tuple(self.betas), eps=self.eps)


class ModelSpec(BaseModel):
    """Either `layers:` (a list) or `preset:` with the preset's parameters beside it."""

    model_config = ConfigDict(extra="allow")
    layers: list[Any] | None = None
    preset: str | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> "ModelSpec":
        extra = sorted((self.model_extra or {}).keys())
        if self.layers is not None and self.preset is not None:
            raise ValueError("give either `layers` or `preset`, not both")
        if self.layers is None and self.preset is None:
            raise ValueError("needs `layers` (a list of torch.nn layers) or `preset` (e.g. preset: gpt)")
        if self.layers is not None and extra:
            raise ValueError(f"unknown key(s) {', '.join(extra)} beside `layers` "
                             "(parameters beside the model belong to a preset)")
        if self.layers is not None and not self.layers:
            raise ValueError("`layers` is empty")
        return self

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class Spec(_Strict):
    name: str | None = None
    model: ModelSpec
    weights: str | None = None
    input: InputSpec | None = None
    target: TargetSpec | None = None
    loss: Literal["cross_entropy", "mse"] | None = None
    loss_weight: float = 1.0
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec)

    @field_validator("optimizer", mode="before")
    @classmethod
    def _optimizer_shorthand(cls, v: Any) -> Any:
        return {"name": v} if isinstance(v, str) else v

    @field_validator("target", mode="before")
    @classmethod
    def _target_shorthand(cls, v: Any) -> Any:
        return {"kind": v.strip().lower()} if isinstance(v, str) else v

    @field_validator("loss", mode="before")
    @classmethod
    def _loss(cls, v: Any) -> Any:
        if isinstance(v, str):
            key = v.strip().lower().replace("-", "_")
            key = {"ce": "cross_entropy", "crossentropy": "cross_entropy", "mse_loss": "mse"}.get(key, key)
            if key not in ("cross_entropy", "mse"):
                raise ValueError(f"loss must be cross_entropy or mse, got {v!r}")
            return key
        return v

    @field_validator("loss_weight")
    @classmethod
    def _loss_weight(cls, v: float) -> float:
        if not math.isfinite(v) or v <= 0:
            raise ValueError(f"loss_weight must be a positive finite number, got {v}")
        return v

    @model_validator(mode="after")
    def _stack_needs_input(self) -> "Spec":
        if self.model.layers is not None and self.input is None:
            raise ValueError("a `layers` model needs `input:` (shape, dtype) to make batches")
        if self.model.preset is not None:
            given = [k for k in ("input", "target", "loss") if getattr(self, k) is not None]
            if given:
                raise ValueError(f"{', '.join(given)} cannot be set beside a preset, which makes its own "
                                 "batches and loss (set batch_size / seq_len as preset parameters)")
        return self
