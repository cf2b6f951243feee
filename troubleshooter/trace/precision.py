"""What the traced steps really computed in: the autocast regions the script entered (device,
dtype, enabled), the GradScalers it made (enabled as asked, enabled in effect), and the dtype
and device of the parameters its optimizer updates.

Why: a script written for a GPU often turns its own mixed precision off on another host.
nanoGPT's train.py uses no autocast on a CPU and its `torch.cuda.amp.GradScaler` disables itself
without CUDA, so every step is float32; a trace that found no protocol mistake must not read as
"AMP works here" when no mixed precision ran at all.
"""
from __future__ import annotations

import math
from typing import Any

from ..findings import Finding, Location, Severity
from .locate import short_path

NOT_IN_EFFECT = ("AMP292", "amp-not-in-effect")
HALF = ("float16", "bfloat16")


def _at(site: dict) -> str:
    return f"{short_path(site['path'])}:{site['line']}" if site.get("path") else "(outside your files)"


def in_effect(raw: dict) -> dict[str, Any]:
    """The report's "precision" section: `compute` (e.g. "float16 autocast", "float32"),
    `mixed` (any half-precision compute seen), what was seen, and a one-line `summary`."""
    seen = raw.get("precision") or {}
    device_type = (raw.get("device") or {}).get("type")
    steps = int(raw.get("steps_observed") or 0)
    autocast = list(seen.get("autocast") or [])
    scalers = list(seen.get("scalers") or [])
    param_dtype = seen.get("param_dtype")
    active = [a for a in autocast if a.get("enabled") and a.get("dtype") in HALF
              and (device_type is None or a.get("device") == device_type)]
    model_half = _half_weights(seen.get("model_param_dtypes"))
    if active:
        compute = "/".join(sorted({a["dtype"] for a in active})) + " autocast"
    elif param_dtype in HALF:
        compute = f"{param_dtype} weights, no autocast"
    elif model_half is not None:  # half weights, float32 master copies in the optimizer
        compute = f"{model_half[0]} weights, no autocast"
    elif param_dtype:
        compute = param_dtype
    else:
        compute = "unknown: no optimizer step was seen"
    mixed = bool(active) or param_dtype in HALF or model_half is not None
    on = [s for s in scalers if s.get("enabled")]
    parts = [f"{compute}" + (f" on {device_type}" if device_type else "")]
    by_hand = model_half is not None and param_dtype not in HALF and not active
    if by_hand:
        parts.append(f"{model_half[1]:.0%} of the model's parameters are {model_half[0]}; the optimizer updates "
                     f"{param_dtype or 'float32'} master copies (hand-written mixed precision)")
    if seen.get("loss_multiplier") and not on:
        scale = float(seen["loss_multiplier"])
        parts.append(f"the loss is multiplied by 2**{math.log2(scale):.4g} = {scale:.6g} before backward() "
                     "(hand-written loss scaling)")
    if active:
        parts += [f"{a['count']} {a['dtype']} autocast regions entered, the first at {_at(a)}" for a in active[:2]]
    policy = raw.get("autocast_policy") or {}
    if any(a.get("device") == "cpu" for a in active) and policy.get("label"):
        parts.append(f"autocast op lists: {policy['label']}")
    if on:
        parts.append("GradScaler enabled (" + ", ".join(_at(s) for s in on[:2]) + ")")
    elif scalers:
        parts.append("GradScaler made but disabled (" + ", ".join(_at(s) for s in scalers[:2]) + ")")
    return {"compute": compute, "mixed": mixed, "device": device_type, "param_dtype": param_dtype,
            "master_weights": param_dtype if by_hand else None,
            "loss_scale_by_hand": seen.get("loss_multiplier") if not on else None,
            "steps": steps, "autocast": autocast, "scalers": scalers, "summary": "; ".join(parts),
            "autocast_policy": policy.get("policy")}


def _half_weights(counts: dict | None) -> tuple[str, float] | None:
    """(half dtype, share) when most parameter elements of the model that ran the forward are in
    one half dtype, else None."""
    total = sum((counts or {}).values())
    if not total:
        return None
    dtype, n = max(((d, n) for d, n in counts.items() if d in HALF), key=lambda x: x[1], default=(None, 0))
    return (dtype, n / total) if dtype is not None and n / total >= 0.5 else None


def ran_without_mixed_precision(section: dict) -> bool:
    """Steps were observed and none computed in half precision."""
    return bool(section.get("steps")) and not section.get("mixed")


def not_in_effect_findings(section: dict) -> list[Finding]:
    """AMP292 (info) when the script sets up mixed precision that did not run here: a GradScaler
    torch turned off, an autocast region entered disabled or for another device, or a scaler
    with no autocast at all. A script with no AMP code gets no finding (the summary says float32)."""
    if not ran_without_mixed_precision(section):
        return []
    device = section.get("device") or "this device"
    reasons, first = [], None
    for s in section.get("scalers") or []:
        first = first or s
        if s.get("enabled"):
            reasons.append(f"the GradScaler made at {_at(s)} is enabled, but no float16/bfloat16 autocast region "
                           f"ran on {device}: it scales float32 gradients, which gains nothing")
        elif s.get("enabled_asked"):
            reasons.append(f"the GradScaler made at {_at(s)} for '{s.get('device')}' was asked to be enabled, and "
                           f"torch turned it off ('{s.get('device')}' is not available here), so its scale/step/"
                           "update pass the loss and the step through unchanged")
    for a in section.get("autocast") or []:
        if a.get("dtype") not in HALF:
            continue
        if not a.get("enabled"):
            first = first or a
            reasons.append(f"the {a['dtype']} autocast region at {_at(a)} was entered disabled ({a['count']}x): "
                           "enabled=False, or its device type is not available here")
        elif a.get("device") != section.get("device"):
            first = first or a
            reasons.append(f"the {a['dtype']} autocast region at {_at(a)} is for '{a['device']}', but the parameters "
                           f"are on {device}: it changes nothing there")
    if not reasons:
        return []
    reasons = [r[0].upper() + r[1:] for r in reasons]
    message = (f"no mixed precision ran in the {section['steps']} traced steps: they computed in "
               f"{section['compute']} on {device}. " + ". ".join(reasons[:3]) + ".")
    suggestion = ("This is what the script does on this host, not a mistake in its AMP code. To see its mixed "
                  "precision at work, trace it where it was written to run (a CUDA GPU), or make autocast and "
                  "GradScaler follow the device (torch.autocast(device_type, dtype=...), "
                  "torch.amp.GradScaler(device_type), bfloat16 on a CPU).")
    first = first or {}
    return [Finding(NOT_IN_EFFECT[0], NOT_IN_EFFECT[1], Severity.INFO, message, suggestion,
                    Location(path=first.get("path"), line=first.get("line")), None,
                    {"seen": "seen at run time", "compute": section["compute"], "reasons": reasons})]
