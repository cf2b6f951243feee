"""Turn a report into plain JSON types once, in one place.

Reports carry floats that may be inf/NaN (a diverged loss, an overflowing activation), tensors
and dtypes; `json.dumps` would write invalid JSON for the first and fail on the rest. Each report
keeps its documented convention for non-finite numbers: strings ("inf", "-inf", "nan") where the
value itself is the finding (check), null where it only means "no number" (speedup).
"""
from __future__ import annotations

import math
from typing import Any, Literal


def jsonable(obj: Any, nonfinite: Literal["string", "null"] = "string") -> Any:
    """Plain JSON types only: dict keys as strings, tuples as lists, one-element tensors as
    numbers, anything else as its `str`; non-finite floats per `nonfinite`."""
    if isinstance(obj, bool) or obj is None or isinstance(obj, (str, int)):
        return obj
    if isinstance(obj, float):
        if math.isfinite(obj):
            return obj
        if nonfinite == "null":
            return None
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {str(k): jsonable(v, nonfinite) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v, nonfinite) for v in obj]
    if hasattr(obj, "numel") and hasattr(obj, "item") and obj.numel() == 1:  # a torch scalar tensor
        return jsonable(obj.item(), nonfinite)
    return str(obj)


def number(x: float) -> float | str:
    """A JSON-safe number: finite floats as floats (6 significant digits), else 'inf'/'nan'."""
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return float(f"{x:.6g}")
