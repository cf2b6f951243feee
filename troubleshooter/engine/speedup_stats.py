"""How sure is a measured speedup? Paired per-round ratios and a bootstrap confidence interval.

Each timing round runs every precision once (in a shuffled order), so round i gives the ratio
fp32_i / p_i measured under the same machine conditions: drift and load that hit the whole round
cancel out of it. The speedup is the median of these paired ratios (robust to the odd slow step),
and its 95% interval comes from a seeded percentile bootstrap over rounds, so the same samples
always give the same interval. A bootstrap treats rounds as independent; on a shared host the
ratio itself drifts during a run (another job starts), so the interval is widened to cover the
medians of the run's first, middle and last third: a run whose thirds disagree cannot claim a
tight figure. Pure (no torch), so recorded sample sets test it.
"""
from __future__ import annotations

import random
import statistics
from dataclasses import dataclass
from typing import Mapping, Sequence

CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 2000
LOW_QUANTILE = 0.1  # the "fastest typical step": what the machine does when nothing interferes
MIN_PAIRS = 5  # fewer paired rounds than this give no interval (and no verdict)
SEGMENTS = 3  # the interval also covers the median ratio of each consecutive third of the rounds


@dataclass(frozen=True)
class PairedSpeedup:
    """The speedup of one precision over fp32 from paired rounds."""

    median: float  # median of fp32_i / p_i
    low: float | None  # CONFIDENCE interval of that median (None: too few rounds)
    high: float | None
    pairs: int
    spread: float  # IQR / median of the ratios: how much the rounds disagree
    low_quantile_ratio: float | None  # fp32's LOW_QUANTILE time / p's: a second robust estimate

    def to_dict(self) -> dict:
        return {"median": self.median, "ci": [self.low, self.high] if self.low is not None else None,
                "confidence": CONFIDENCE, "pairs": self.pairs, "spread": self.spread,
                "low_quantile_ratio": self.low_quantile_ratio, "method": "median of paired per-round "
                "ratios fp32/p, percentile bootstrap over rounds, widened to the medians of the run's thirds"}


def quantile(data: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of data (0 <= q <= 1)."""
    xs = sorted(data)
    if not xs:
        raise ValueError("no data")
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def spread(data: Sequence[float]) -> float:
    """IQR / median (0.03 = 3%); inf for a zero median."""
    if len(data) < 2:
        return 0.0
    q1, q3 = quantile(data, 0.25), quantile(data, 0.75)
    med = statistics.median(data)
    return (q3 - q1) / med if med > 0 else float("inf")


def bootstrap_median_ci(values: Sequence[float], seed: int = 0, resamples: int = BOOTSTRAP_RESAMPLES,
                        confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Percentile bootstrap interval of the median; seeded, so deterministic."""
    rng = random.Random(seed)
    n = len(values)
    vals = list(values)
    meds = sorted(statistics.median(rng.choices(vals, k=n)) for _ in range(resamples))
    alpha = (1 - confidence) / 2
    return quantile(meds, alpha), quantile(meds, 1 - alpha)


def segment_medians(values: Sequence[float], segments: int = SEGMENTS) -> list[float]:
    """Median of each consecutive segment (in measurement order); empty when a segment would hold
    fewer than MIN_PAIRS values."""
    n = len(values)
    if n < segments * MIN_PAIRS:
        return []
    cuts = [round(i * n / segments) for i in range(segments + 1)]
    return [statistics.median(values[a:b]) for a, b in zip(cuts, cuts[1:])]


def paired_speedup(fp32_ms: Sequence[float], other_ms: Sequence[float], seed: int = 0) -> PairedSpeedup | None:
    """fp32_i / other_i per round (the lists are aligned by round); None without a pair."""
    pairs = [(a, b) for a, b in zip(fp32_ms, other_ms) if a > 0 and b > 0]
    if not pairs:
        return None
    ratios = [a / b for a, b in pairs]
    low = high = None
    if len(ratios) >= MIN_PAIRS:
        low, high = bootstrap_median_ci(ratios, seed)
        thirds = segment_medians(ratios)
        if thirds:
            low, high = min(low, *thirds), max(high, *thirds)
    lq = quantile([a for a, _ in pairs], LOW_QUANTILE) / quantile([b for _, b in pairs], LOW_QUANTILE)
    return PairedSpeedup(statistics.median(ratios), low, high, len(ratios), spread(ratios), lq)


def paired_speedups(samples: Mapping[str, Sequence[float]], seed: int = 0) -> dict[str, PairedSpeedup]:
    """Every precision against fp32 (aligned by round); empty without fp32."""
    base = samples.get("fp32")
    if not base:
        return {}
    out = {}
    for p, s in samples.items():
        if p == "fp32" or not s:
            continue
        ps = paired_speedup(base, s, seed)
        if ps is not None:
            out[p] = ps
    return out
