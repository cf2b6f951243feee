"""The speedup verdict: measured step times in, a recommendation and its reasons out.

Pure (no torch, no measurement) so the thresholds of the common decision matrix can be
tested with given timings, and the app can re-derive a verdict from a saved JSON result:
  below 1.1x -> stay in fp32; 1.1x to 1.5x -> modest, AMP is fine but check numerics;
  above 1.5x -> use AMP.
When the speedup is low, it names the likely causes from what the caller knows about the
device and the workload, and emits finding AMP209 (low-speedup).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..findings import Finding, Location, Severity

STAY_BELOW = 1.1
USE_AMP_ABOVE = 1.5
LOSS_DIFF_WARN = 0.05  # relative loss difference vs fp32 after the warm-up steps worth a note
SMALL_STEP_FLOPS = 5e9  # below this a step is launch/overhead-bound on any GPU
SMALL_CPU_STEP_FLOPS = 2e8
SHORT_CUDA_STEP_MS = 5.0
LOW_PEAK_SHARE = 0.15
SMALL_BATCH = 16
SMALL_ITEMS = 4096
NOISY_SPREAD = 0.10  # IQR/median above this: something else is competing for the device
PREFER_BF16_WITHIN = 1.05  # bf16 this close to fp16 is worth it: no GradScaler, no overflow

MAX_SPREAD = 0.25  # IQR/median of the timings (or the paired ratios) above this: no verdict at all
LEVELS = ("stay_fp32", "modest", "use_amp", "inconclusive", "unknown")
CLEAN_MEASUREMENT = ("for a clean measurement: stop other programs using this device, rerun with a larger "
                     "--budget, pin the threads (OMP_NUM_THREADS / taskset on a CPU), or measure on the GPU "
                     "you will train on")
_CPU_MATRIX_FEATURES = ("avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16")


@dataclass
class Verdict:
    level: str  # one of LEVELS
    recommendation: str
    best_precision: str | None
    speedup: float | None  # median of paired per-round ratios fp32/best (else fp32 median / best median)
    reasons: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    interval: tuple[float, float] | None = None  # 95% interval of `speedup`
    inconclusive_because: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "recommendation": self.recommendation,
            "level": self.level,
            "best_precision": self.best_precision,
            "speedup": None if self.speedup is None else round(self.speedup, 4),
            "speedup_ci": None if self.interval is None else [round(x, 4) for x in self.interval],
            "thresholds": {"stay_fp32_below": STAY_BELOW, "use_amp_above": USE_AMP_ABOVE,
                           "max_spread": MAX_SPREAD, "noisy_spread": NOISY_SPREAD},
            "inconclusive_because": list(self.inconclusive_because),
            "reasons": list(self.reasons),
        }


def level_for(speedup: float) -> str:
    """The decision-matrix bucket for a speedup ratio over fp32."""
    if speedup < STAY_BELOW:
        return "stay_fp32"
    if speedup <= USE_AMP_ABOVE:
        return "modest"
    return "use_amp"


def _how_to_use(precision: str) -> str:
    if precision == "tf32":
        return "TF32 (torch.backends.cuda.matmul.allow_tf32 = True, torch.backends.cudnn.allow_tf32 = True)"
    if precision == "fp16":
        return "AMP with fp16 (autocast float16 + GradScaler)"
    return f"AMP with {precision} (autocast, no GradScaler needed)"


def _recommendation(level: str, best: str, speedup: float) -> str:
    if round(speedup, 2) == 1.0 or round(1 / speedup, 2) == 1.0:
        faster = "as fast as fp32 (within 1%)"
    elif speedup > 1:
        faster = f"{speedup:.2f}x faster than fp32"
    else:
        faster = f"{1 / speedup:.2f}x slower than fp32"
    if level == "stay_fp32":
        only = "only " if speedup >= 1 else ""
        return f"stay in fp32: the best alternative, {best}, is {only}{faster} here"
    if level == "modest":
        return (f"modest: {best} is {faster}; {_how_to_use(best)} is fine here, "
                "but check numerics (python -m troubleshooter check)")
    return f"use {_how_to_use(best)}: {faster}"


def make_verdict(
    medians_ms: Mapping[str, float],
    *,
    device_type: str = "cpu",
    device_name: str | None = None,
    cpu_features: Mapping[str, bool] | None = None,
    tensor_cores: bool | None = None,
    bf16_native: bool | None = None,
    flops_per_step: float | None = None,
    batch_size: int | None = None,
    seq_len: int | None = None,
    fp32_peak_share: float | None = None,
    misaligned: Sequence[str] = (),
    loss_rel_diff: Mapping[str, float | None] | None = None,
    compiled: bool = False,
    failed: Sequence[str] = (),
    spreads: Mapping[str, float | None] | None = None,
    paired: Mapping[str, Mapping[str, Any]] | None = None,
    native: Mapping[str, bool] | None = None,
    warmup_only: Mapping[str, int] | None = None,
    first_step_only: Sequence[str] = (),
) -> Verdict:
    """Decide from median step times per precision (ms) and what is known about the run.

    `misaligned` lists human descriptions of dimensions that are not tensor-core friendly
    (from the alignment check, AMP201); `loss_rel_diff` maps precision -> |loss - fp32 loss|
    / |fp32 loss| after the same few steps; `failed` names precisions that raised an error;
    `spreads` maps precision -> IQR/median of its samples; `paired` maps precision -> the
    `PairedSpeedup.to_dict()` of its per-round ratios against fp32 (median, ci, spread): with it
    the speedup is the paired median and the verdict is "inconclusive" when its interval straddles
    a threshold or the timings are too noisy; `native` maps precision -> the device has a fast
    path for it (a gain on a precision without one needs clean timings to be believed);
    `warmup_only` maps precision -> warm-up steps it was timed from, when the budget left it no
    interleaved rounds (fp32 or the best precision timed so gives no verdict: too few samples);
    `first_step_only` names precisions whose one figure is their first step: it carries one-time
    costs (on the first H200 run, 1.6-1.8 s for a bf16/fp16 step that then took 80 ms), so they
    are not ranked against the others.
    """
    medians = {p: float(v) for p, v in medians_ms.items() if v is not None and v > 0}
    others = {p: v for p, v in medians.items() if p != "fp32"}
    notes = _noise_notes(spreads or {}) + _loss_notes(loss_rel_diff or {})
    if "fp32" not in medians or not others:
        best = min(medians, key=medians.get) if medians else None
        if "fp32" in failed:
            why = "fp32 failed (see the errors), so there is no baseline to compare with"
        elif "fp32" not in medians:
            why = "fp32 was not measured, so there is no baseline: include fp32 in --precisions"
        elif failed:
            why = f"only fp32 could be measured ({', '.join(failed)} failed: see the errors)"
        else:
            why = "only fp32 was measured: add fp16/bf16 to --precisions"
        return Verdict("unknown", f"no verdict: {why}", best, None, notes)

    unranked = [p for p in others if p in first_step_only]
    ranked = {p: v for p, v in others.items() if p not in unranked} or others
    if "fp32" in first_step_only:
        return _cold_baseline(medians, min(ranked, key=ranked.get), warmup_only or {}, notes)
    paired = {p: v for p, v in (paired or {}).items() if p in ranked and v and v.get("median")}
    if paired:
        best = max(paired, key=lambda p: paired[p]["median"])
        speedup = float(paired[best]["median"])
    else:
        best = min(ranked, key=ranked.get)
        speedup = medians["fp32"] / ranked[best]
    level = level_for(speedup)
    ci = tuple(paired[best]["ci"]) if paired and paired[best].get("ci") else None
    doubts = _doubts(best, speedup, level, ci, paired.get(best), spreads or {}, native or {}, bool(paired))
    doubts = _warmup_doubts(best, warmup_only or {}) + doubts
    unranked_note = _first_step_note([p for p in unranked if p != best])
    if unranked_note and (level != "use_amp" or best not in ("bf16", "fp16")):
        doubts.append(unranked_note)  # one of them might have been the faster (or the AMP) choice
    elif unranked_note:
        notes.append(unranked_note)
    if doubts:
        return _inconclusive(best, speedup, ci, doubts, notes)
    reasons: list[str] = []
    if level != "use_amp":
        reasons = _low_speedup_reasons(
            medians, device_type=device_type, device_name=device_name, cpu_features=cpu_features,
            tensor_cores=tensor_cores, bf16_native=bf16_native, flops_per_step=flops_per_step,
            batch_size=batch_size, seq_len=seq_len, fp32_peak_share=fp32_peak_share,
            misaligned=misaligned, compiled=compiled,
        )
    prefer = _prefer_bf16_note(medians, best, device_type, bf16_native, cpu_features)
    if prefer:
        reasons.append(prefer)
    if (native or {}).get(best) is False and level != "stay_fp32":
        reasons.append(f"{best} has no fast path on this device (converted/emulated); this gain was measured with "
                       f"clean timings (spread within {NOISY_SPREAD:.0%}), but confirm it on the machine you train on")
    reasons += notes
    verdict = Verdict(level, _recommendation(level, best, speedup), best, speedup, reasons, interval=ci)
    if level != "use_amp":
        verdict.findings.append(_low_speedup_finding(verdict, device_type, device_name))
    return verdict


def _doubts(best: str, speedup: float, level: str, ci: tuple | None, pair: Mapping[str, Any] | None,
            spreads: Mapping[str, float | None], native: Mapping[str, bool], has_paired: bool) -> list[str]:
    """Why the evidence cannot carry a verdict (empty when it can)."""
    out = []
    noisy = {p: v for p, v in spreads.items() if p in ("fp32", best) and v is not None and v > MAX_SPREAD}
    if pair and pair.get("spread") is not None and pair["spread"] > MAX_SPREAD:
        noisy[f"{best}/fp32 ratio"] = pair["spread"]
    if noisy:
        worst = max(noisy, key=noisy.get)
        out.append(f"the timings are too noisy for a verdict ({worst} spread {noisy[worst]:.0%} IQR/median, "
                   f"limit {MAX_SPREAD:.0%}): something else is competing for the device")
    if has_paired:
        if ci is None:
            out.append(f"too few paired rounds ({(pair or {}).get('pairs', 0)}) for a confidence interval")
        elif level_for(ci[0]) != level_for(ci[1]):
            edge = STAY_BELOW if level_for(ci[0]) == "stay_fp32" else USE_AMP_ABOVE
            out.append(f"the 95% interval of the {best} speedup, {ci[0]:.2f}x to {ci[1]:.2f}x, straddles the "
                       f"{edge:g}x threshold")
    if native.get(best) is False and level != "stay_fp32" and not out:
        shaky = {p: v for p, v in spreads.items() if p in ("fp32", best) and v is not None and v > NOISY_SPREAD}
        if pair and pair.get("spread") is not None and pair["spread"] > NOISY_SPREAD:
            shaky[f"{best}/fp32 ratio"] = pair["spread"]
        if shaky or ci is None and has_paired:
            worst = max(shaky, key=shaky.get) if shaky else None
            out.append(f"{best} has no fast path on this device (converted/emulated), so a {speedup:.2f}x gain "
                       "needs clean timings to be believed"
                       + (f", and these are noisy ({worst} spread {shaky[worst]:.0%})" if worst else ""))
    return out


def _warmup_doubts(best: str, warmup_only: Mapping[str, int]) -> list[str]:
    """fp32 or the best precision timed only from warm-up steps: one or two samples, each taken
    alone (not in a round beside the other), cannot carry a ratio on a shared host."""
    timed = [p for p in ("fp32", best) if p in warmup_only]
    if not timed:
        return []
    what = " and ".join(f"{p} from {warmup_only[p]} warm-up step{'s' if warmup_only[p] != 1 else ''}" for p in timed)
    return [f"too few rounds: {what} only, not in interleaved rounds (the budget left no room for them), so the "
            "ratio rests on single steps timed apart; rerun with a larger --budget"]


def _first_step_note(unranked: Sequence[str]) -> str | None:
    if not unranked:
        return None
    names = " and ".join(unranked)
    return (f"{names} {'was' if len(unranked) == 1 else 'were'} timed from {'its' if len(unranked) == 1 else 'their'} "
            "first step only, which pays one-time costs (kernel loading, library start-up, autotuning), so "
            f"{'it was' if len(unranked) == 1 else 'they were'} not compared; rerun with a larger --budget")


def _cold_baseline(medians: Mapping[str, float], best: str, warmup_only: Mapping[str, int],
                   notes: list[str]) -> Verdict:
    """fp32 timed from its first step only: that step pays the one-time costs, so every ratio over it
    is inflated by them (a GPU app run with a 5 s budget said "84x" for a 0.8x CNN). No speedup is
    stated; the step times are, so the user sees what was measured."""
    def timed(p: str) -> str:
        steps = warmup_only.get(p)
        how = "in interleaved rounds" if steps is None else f"from {steps} warm-up step{'s' if steps != 1 else ''}"
        return f"{p} {medians[p]:.1f} ms {how}"

    why = ("fp32, the baseline, was timed from its first step only, which pays one-time costs (kernel loading, "
           "library start-up, autotuning), so no speedup over it can be stated "
           f"({timed('fp32')}; {timed(best)}); rerun with a larger --budget")
    return Verdict("inconclusive", f"inconclusive: {why}", best, None, [why, *notes], inconclusive_because=[why])


def _inconclusive(best: str, speedup: float, ci: tuple | None, doubts: list[str], notes: list[str]) -> Verdict:
    interval = f" (95% interval {ci[0]:.2f}x to {ci[1]:.2f}x)" if ci else ""
    rec = (f"inconclusive: {best} measured {speedup:.2f}x over fp32{interval}, but "
           + "; ".join(doubts) + f"; {CLEAN_MEASUREMENT}")
    return Verdict("inconclusive", rec, best, speedup, [*doubts, CLEAN_MEASUREMENT[0].upper() + CLEAN_MEASUREMENT[1:],
                                                        *[n for n in notes if "noisy" not in n]],
                   interval=ci, inconclusive_because=doubts)


def _noise_notes(spreads: Mapping[str, float | None]) -> list[str]:
    noisy = {p: v for p, v in spreads.items() if v is not None and v > NOISY_SPREAD}
    if not noisy:
        return []
    worst = max(noisy, key=noisy.get)
    return [f"the timings are noisy ({worst} spread {noisy[worst]:.0%}, IQR/median): another process is "
            "competing for the device, so the ratios are rough; rerun on an idle machine or with a larger --budget"]


def _loss_notes(loss_rel_diff: Mapping[str, float | None]) -> list[str]:
    out = []
    for p, diff in loss_rel_diff.items():
        if p != "fp32" and diff is not None and diff > LOSS_DIFF_WARN:
            out.append(f"the {p} loss after the warm-up steps differs from fp32's by {diff:.1%}: "
                       "check numerics before switching (python -m troubleshooter check)")
    return out


def _prefer_bf16_note(medians, best, device_type, bf16_native, cpu_features) -> str | None:
    if best != "fp16" or "bf16" not in medians or bf16_native is False:
        return None
    if medians["bf16"] <= medians["fp16"] * PREFER_BF16_WITHIN:
        return (f"bf16 is within {PREFER_BF16_WITHIN - 1:.0%} of fp16 and needs no GradScaler "
                "and cannot overflow: prefer bf16")
    return None


def _mark(value: bool | None) -> str:
    return "✓" if value else ("?" if value is None else "✗")


def _cpu_feature_text(cpu_features: Mapping[str, bool] | None) -> str:
    if not cpu_features:
        return "unknown CPU features"
    return ", ".join(f"{k} {_mark(cpu_features.get(k))}" for k in _CPU_MATRIX_FEATURES)


def _low_speedup_reasons(medians, *, device_type, device_name, cpu_features, tensor_cores,
                         bf16_native, flops_per_step, batch_size, seq_len, fp32_peak_share,
                         misaligned, compiled) -> list[str]:
    reasons: list[str] = []
    name = device_name or device_type
    if device_type == "cpu":
        feats = cpu_features or {}
        if not any(feats.get(k) for k in _CPU_MATRIX_FEATURES):
            reasons.append(
                f"these are CPU numbers ({name}) and this CPU has no bf16/fp16 matrix instructions "
                f"({_cpu_feature_text(cpu_features)}): autocast converts to and from fp32, which "
                "costs more than it saves; measure on the GPU you will train on")
        else:
            reasons.append(
                f"these are CPU numbers ({name}; {_cpu_feature_text(cpu_features)}): CPU gains from "
                "autocast are small next to a GPU's tensor cores; measure on the GPU you will train on")
    else:
        if tensor_cores is False:
            reasons.append(f"{name} has no fp16 tensor cores (before Volta): fp16 math runs at "
                           "about fp32 speed, AMP mostly saves memory")
        if bf16_native is False and "bf16" in medians:
            reasons.append(f"{name} has no native bf16 (before Ampere): bf16 is emulated and slow; "
                           "use fp16 with GradScaler on this GPU")
    small_flops = SMALL_CPU_STEP_FLOPS if device_type == "cpu" else SMALL_STEP_FLOPS
    if flops_per_step is not None and flops_per_step < small_flops:
        reasons.append(f"the model is small ({flops_per_step / 1e9:.2g} GFLOP per step): overheads "
                       "(kernel launches, casts, the optimizer) dominate, and AMP speeds up only the math")
    elif device_type == "cuda" and medians.get("fp32", 0) < SHORT_CUDA_STEP_MS:
        reasons.append(f"an fp32 step takes only {medians['fp32']:.2f} ms: the GPU is launch-bound "
                       "(Python and kernel-launch overhead), which AMP does not shorten"
                       + ("" if compiled else "; try --compile or CUDA graphs"))
    if fp32_peak_share is not None and fp32_peak_share < LOW_PEAK_SHARE:
        reasons.append(f"fp32 reaches only {fp32_peak_share:.0%} of this device's fp32 peak: the step "
                       "is bound by memory traffic or overhead rather than matmul speed (memory-bound), "
                       "where half-precision gains are smaller")
    if batch_size is not None and batch_size < SMALL_BATCH and batch_size * (seq_len or 1) < SMALL_ITEMS:
        reasons.append(f"the batch is small ({batch_size}"
                       + (f" x {seq_len} tokens" if seq_len else "") + "): small matrices keep "
                       "tensor cores idle; try a larger batch")
    if misaligned:
        shown = "; ".join(list(misaligned)[:4]) + ("; ..." if len(misaligned) > 4 else "")
        reasons.append(f"dimensions not aligned for tensor cores ({shown}): see the alignment "
                       "findings (AMP201) from python -m troubleshooter check")
    if not reasons:
        reasons.append("no obvious cause found: profile one step (torch.profiler) to see where the time goes")
    return reasons


def _low_speedup_finding(verdict: Verdict, device_type: str, device_name: str | None) -> Finding:
    where = device_name or device_type
    severity = Severity.WARNING if device_type == "cuda" and verdict.level == "stay_fp32" else Severity.INFO
    return Finding(
        rule="AMP209",
        name="low-speedup",
        severity=severity,
        message=(f"mixed precision gives a low speedup on {where}: best {verdict.best_precision} "
                 f"at {verdict.speedup:.2f}x over fp32"),
        suggestion=verdict.reasons[0] if verdict.reasons else verdict.recommendation,
        location=Location(),
        precision=verdict.best_precision,
        data={"speedup": round(verdict.speedup, 4), "level": verdict.level,
              "device_type": device_type, "reasons": list(verdict.reasons)},
    )
