"""What a GradScaler's skips over N fp16 steps mean (AMP204's thresholds), read from the per-step
series alone and without torch: the `skiprate` check judges its probe's steps with it, and `trace`
judges the traced script's steps with the same thresholds in its parent process, which never
imports torch.
"""
from __future__ import annotations

import math
from typing import Any

from .results import DEFAULT_INIT_SCALE

PERSISTENT_RATE = 0.10  # skipping more than 1 step in 10 after calibration is not noise
CALIBRATION_NOTE = 3  # this many skips before the first good step is worth a lower init_scale


def summarize(steps: list[dict[str, Any]], init_scale: float = DEFAULT_INIT_SCALE) -> tuple[dict, dict]:
    """(summary, recommendation) from the per-step series; pure, so it is tested on made-up series."""
    n = len(steps)
    calib = [s for s in steps if s["phase"] == "calibration"]
    after = [s for s in steps if s["phase"] == "training"]
    skipped_after = sum(s["skipped"] for s in after)
    nonfinite = sum(1 for s in steps if not math.isfinite(s["loss"]))
    final = steps[-1]["scale_after"] if steps else init_scale
    min_scale = min((s["scale_after"] for s in steps), default=init_scale)
    settled = after[0]["scale_before"] if after else None
    rate_after = skipped_after / len(after) if after else None
    summary = {
        "steps": n, "skipped": len(calib) + skipped_after,
        "skipped_calibration": len(calib), "skipped_after_calibration": skipped_after,
        "steps_after_calibration": len(after), "skip_rate": (len(calib) + skipped_after) / n if n else None,
        "skip_rate_after_calibration": rate_after, "calibration_ended": bool(after),
        "nonfinite_losses": nonfinite, "final_scale": final, "min_scale": min_scale,
        "settled_scale": settled,
    }
    if n and min_scale < 1:
        rec = {"action": "bf16", "severity": "error",
               "reason": f"the loss scale fell to {min_scale:g} (below 1): even unscaled, this model's "
                         "gradients or activations overflow float16"}
    elif n and nonfinite == n:
        rec = {"action": "bf16", "severity": "error",
               "reason": f"the fp16 loss was not finite on all {n} steps: the forward pass overflows "
                         "float16, which no loss scale can fix"}
    elif rate_after is not None and skipped_after >= 2 and rate_after > PERSISTENT_RATE:
        rec = {"action": "bf16", "severity": "warning",
               "reason": f"{skipped_after} of {len(after)} steps after calibration were skipped "
                         f"({rate_after:.0%}): float16 keeps overflowing at scale {final:g}"}
    elif n and not after:
        rec = {"action": "lower_init_scale", "severity": "warning", "init_scale": final,
               "reason": f"all {n} steps were skipped while the scale came down from {init_scale:g} "
                         f"to {final:g}; the scaler had not found a usable scale yet"}
    elif len(calib) >= CALIBRATION_NOTE:
        rec = {"action": "lower_init_scale", "severity": "info", "init_scale": settled,
               "reason": f"the first {len(calib)} steps were skipped while the scale came down "
                         f"from {init_scale:g} to {settled:g}"}
    else:
        rec = {"action": "fine", "severity": None,
               "reason": f"{len(calib)} calibration skip(s), {skipped_after} after; final scale {final:g}"}
    return summary, rec
