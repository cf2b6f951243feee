"""AMP204 high-skip-rate: what GradScaler really does to this model over N real fp16 steps.

A GradScaler starts at a high scale (65536) and halves it, skipping the optimizer step, every
time the scaled gradients overflow. A few skips at the start (calibration) are normal; skips
that keep coming afterwards, or a scale that falls below 1, mean float16 cannot represent this
model's gradients (or activations) and bf16 is the fix. Skips are read through the public API
only: the scale after `update()` is lower than before exactly when the step was skipped.
"""
from __future__ import annotations

import time
from typing import Any

import torch

from ..findings import Finding, Location, Severity
from ..workload import Workload
from . import precision as prec
from .budget import no_room, record_step_s
from .training_step import build, device_batch, training_step
from .results import DEFAULT_INIT_SCALE, SkipRateResult  # noqa: F401 - the class crosses to the app torch-free
from .skip_summary import summarize  # torch-free: the trace parent reads its skips with it

RULE, NAME = "AMP204", "high-skip-rate"
# Wall-clock cap for the probe: fp16 on a CPU without fp16 instructions can take seconds a step.
DEFAULT_BUDGET_S = 20.0
# Steps after calibration needed before the budget may stop the probe (to judge later skips).
MIN_STEPS_AFTER_CALIBRATION = 4


def run_steps(workload: Workload, device: torch.device, steps: int, seed: int,
              init_scale: float = DEFAULT_INIT_SCALE, budget_s: float | None = None,
              deadline: float | None = None, progress=None) -> list[dict[str, Any]]:
    """N fp16 training steps; per step the unscaled loss, the scale before/after, skipped or not.

    One host sync per step (`get_scale()` after `update()`); losses stay on the device until
    the end. With `budget_s`, stops early once that much time has passed, but never while the
    scaler is still calibrating (every step so far skipped) unless the scale already fell below
    1: cutting calibration short would hide exactly the overflow this probe exists to show.
    On a CPU without fp16 instructions one fp16 step can take seconds, hence the budget.
    `deadline` (a perf_counter time, from the check's overall budget) is hard: past it the probe
    stops at the next step boundary whatever the phase, and the summary says so.
    """
    model, optimizer = build(workload, device, seed)
    scaler = prec.make_scaler("fp16", device, init_scale=init_scale)
    losses: list[torch.Tensor] = []
    scales: list[tuple[float, float]] = []
    before = float(scaler.get_scale())  # init_scale: no sync before the first step
    start = time.perf_counter()
    calibrating, trained = True, 0
    try:
        for i in range(steps):
            step_start = time.perf_counter()
            batch = device_batch(workload, device, seed * 100003 + i)
            losses.append(training_step(workload, model, optimizer, scaler, batch, "fp16", device))
            after = float(scaler.get_scale())
            scales.append((before, after))
            calibrating = calibrating and after < before
            trained = trained + 1 if not calibrating else 0
            before = after
            if progress is not None:
                progress((i + 1) / steps, f"skiprate: fp16 step {i + 1}/{steps}, loss scale {after:g}")
            over_budget = budget_s is not None and time.perf_counter() - start > budget_s
            if over_budget and i + 1 < steps and (trained >= MIN_STEPS_AFTER_CALIBRATION or after < 1.0):
                break
            step_s = time.perf_counter() - step_start
            record_step_s("fp16", step_s)  # the other checks plan their fp16 work on it
            if no_room(deadline, step_s) and i + 1 < steps:  # stop before a step that would end past it
                break
        loss_values = torch.stack(losses).tolist() if losses else []
    finally:
        del model, optimizer, losses
    out = []
    calibrating = True
    for i, ((b, a), loss) in enumerate(zip(scales, loss_values)):
        skipped = a < b
        calibrating = calibrating and skipped
        out.append({"step": i, "loss": loss, "scale_before": b, "scale_after": a,
                    "skipped": skipped, "phase": "calibration" if calibrating else "training"})
    return out


_SUGGESTION = {
    "bf16": "Train in bfloat16 (torch.autocast(dtype=torch.bfloat16), no GradScaler) on hardware "
            "that has it; otherwise find and fix the overflowing layer (see the nan and headroom checks).",
    "lower_init_scale": "Start the scaler where it settles: torch.amp.GradScaler('{device}', init_scale={scale:g}) "
                        "so no steps are wasted on calibration.",
    "fix_model": "Fix the model or the data first (the nan check names the module: python -m troubleshooter "
                 "check --only nan); a lower precision neither causes nor cures it.",
}


def step_is_finite(workload: Workload, device: torch.device, seed: int, precision: str = "fp32",
                   scale: float = 1.0) -> bool:
    """The probe's first step (same weights and batch) in `precision` with the loss times `scale`:
    are the loss and every gradient finite? fp32 at scale 1 tells a model/data bug from a precision
    problem; fp16 at scale 1 tells whether any loss scale can work (smaller ones only shrink values)."""
    model, _ = build(workload, device, seed)
    try:
        with prec.autocast(precision, device):
            loss = workload.loss(model, workload.batch(device, seed=seed * 100003))
        if not bool(torch.isfinite(loss.detach()).all()):
            return False
        if loss.requires_grad:
            (loss.float() * scale).backward()
        flags = [torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None]
        return bool(torch.stack(flags).all()) if flags else True
    finally:
        del model


def _fp32_loss_finite(workload: Workload, device: torch.device, seed: int) -> bool:
    """The first step in plain fp32, forward and backward (a NaN made only in the backward, such
    as sqrt at 0, is a model bug too)."""
    return step_is_finite(workload, device, seed, "fp32", 1.0)


def _recheck(rec: dict, summary: dict, workload: Workload, device: torch.device, seed: int) -> dict:
    """Before blaming fp16 (bf16, a lower init_scale) make sure fp32 is finite and, when the scaler
    never found a usable scale, that some scale can work at all."""
    suspicious = summary["nonfinite_losses"] or rec["action"] in ("bf16", "lower_init_scale")
    if not suspicious:
        return rec
    if not _fp32_loss_finite(workload, device, seed):
        return {"action": "fix_model", "severity": None, "fp32_finite": False,
                "reason": "the loss or the gradients are not finite even in fp32 (same weights and batch), so "
                          "this is a model or data bug, not a mixed-precision problem: the nan check names "
                          "the module that produces it"}
    if rec["action"] == "lower_init_scale" and not summary["calibration_ended"]:
        if not step_is_finite(workload, device, seed, "fp16", 1.0):
            return {"action": "bf16", "severity": "error", "fp32_finite": True,
                    "reason": f"all {summary['steps']} steps were skipped, and even unscaled (scale 1) the fp16 "
                              "gradients are not finite while fp32's are: no loss scale works, float16 cannot "
                              "represent this model's values"}
        rec = {**rec, "reason": rec["reason"] + "; an unscaled fp16 step is finite, so a lower scale works"}
    return {**rec, "fp32_finite": True}


def check_skiprate(workload: Workload, device: torch.device | str = "cpu", steps: int = 20,
                   seed: int = 0, init_scale: float = DEFAULT_INIT_SCALE,
                   budget_s: float | None = DEFAULT_BUDGET_S, deadline: float | None = None,
                   progress=None) -> SkipRateResult:
    device = torch.device(device)
    if steps < 1:
        raise ValueError("steps must be at least 1")
    with prec.precision_mode("fp16", device):
        series = run_steps(workload, device, steps, seed, init_scale, budget_s, deadline, progress)
    summary, rec = summarize(series, init_scale)
    summary["steps_requested"] = steps
    summary["stopped_by_budget"] = len(series) < steps
    if summary["stopped_by_budget"]:
        summary["budget_s"] = budget_s
        summary["note"] = (f"rests on {len(series)} of the {steps} steps asked for: the time budget ran out "
                           "(raise --budget for more)")
    rec = _recheck(rec, summary, workload, device, seed)
    findings = []
    if rec["severity"]:
        scale = rec.get("init_scale") or 1.0
        suggestion = _SUGGESTION[rec["action"]].format(scale=scale, device=device.type)
        msg = (f"GradScaler skipped {summary['skipped']} of {summary['steps']} fp16 steps "
               f"({summary['skipped_calibration']} in calibration, "
               f"{summary['skipped_after_calibration']} after): {rec['reason']}")
        findings.append(Finding(RULE, NAME, Severity.parse(rec["severity"]), msg, suggestion,
                                Location(), precision="fp16",
                                data={"check": "skiprate", "summary": summary, "recommendation": rec}))
    return SkipRateResult(series, summary, rec, findings, str(device), seed, init_scale)
