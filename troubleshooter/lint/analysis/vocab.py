"""The linter's vocabularies and deprecated-API table, read from data/*.json (data, not code)."""
from __future__ import annotations

import json
import re
from pathlib import Path

from ..lazy_re import lazy

_DATA = Path(__file__).parent / "data"
_V = json.loads((_DATA / "vocabulary.json").read_text())

CLIP_NAMES = frozenset(_V["clip_names"])
# Receivers whose clip/backward/save do the AMP bookkeeping themselves.
MANAGED_RE = lazy(_V["managed_receiver_pattern"], re.I)
OPTIMIZER_CLASSES = frozenset(_V["optimizer_classes"])
OPT_NAME_RE = lazy(_V["optimizer_name_pattern"], re.I)
SCHED_NAME_RE = lazy(_V["scheduler_name_pattern"], re.I)
EVAL_FUNC_RE = lazy(_V["eval_function_pattern"], re.I)
SKLEARN_SCALER_RE = lazy(_V["sklearn_scaler_pattern"])
ZEROING = frozenset(_V["grad_zeroing_methods"])
FP16_DTYPES = frozenset(_V["dtypes"]["fp16"])
BF16_DTYPES = frozenset(_V["dtypes"]["bf16"])
FP32_DTYPES = frozenset(_V["dtypes"]["fp32"])
DEPRECATED: dict[str, str] = {k: v for k, v in json.loads((_DATA / "deprecated_api.json").read_text()).items()
                              if not k.startswith("_")}
