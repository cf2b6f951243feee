"""The time budget of a `check` run: each check gets a share of what is left, and steps stop at
a step boundary once their deadline has passed.

Shares follow each check's weight (the skip-rate probe trains the most, the capability check
reads properties only); time a check does not use carries over to the ones after it. No step
starts that is expected to end past its check's deadline, the first one included (see
`StepCosts`); only when nothing predicts a step's cost does a check do its first unit of work
regardless. What a check could not do is reported, never silently dropped.
"""
from __future__ import annotations

import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Callable

Progress = Callable[[float, str], None]
RESERVE_S, RESERVE_SHARE = 1.5, 0.1  # kept back from checks: the report, the process exit


@dataclass
class Budget:
    total_s: float | None  # None: no limit
    weights: dict[str, float]
    started: float = field(default_factory=lambda: time.perf_counter())
    _left_weight: float = 0.0

    def __post_init__(self) -> None:
        self._left_weight = float(sum(self.weights.values()))

    def remaining(self) -> float | None:
        """Seconds left for checks: the total less what has passed and a reserve for writing the
        report and leaving the process (about a second on a busy 2-core host)."""
        if self.total_s is None:
            return None
        reserve = min(RESERVE_S, RESERVE_SHARE * self.total_s)
        return max(0.0, self.total_s - reserve - (time.perf_counter() - self.started))

    def deadline_for(self, name: str) -> float | None:
        """perf_counter time by which check `name` should stop (its share of what is left)."""
        left = self.remaining()
        weight = self.weights.get(name, 1.0)
        share = None if left is None else left * weight / max(self._left_weight, weight)
        self._left_weight = max(0.0, self._left_weight - weight)
        return None if share is None else time.perf_counter() + share

    def share_s(self, deadline: float | None) -> float | None:
        return None if deadline is None else max(0.0, deadline - time.perf_counter())


def past(deadline: float | None) -> bool:
    """The deadline has passed (never, without one)."""
    return deadline is not None and time.perf_counter() > deadline


def scaled(progress: Progress | None, start: float, width: float) -> Progress | None:
    """A check's own 0..1 progress mapped into its slice [start, start + width] of the run."""
    if progress is None:
        return None

    def inner(fraction: float, message: str) -> None:
        progress(start + width * max(0.0, min(1.0, fraction)), message)

    return inner


def no_room(deadline: float | None, next_step_s: float) -> bool:
    """Past the deadline, or the next step (as long as the last one) would end past it."""
    return deadline is not None and time.perf_counter() + next_step_s > deadline


# ---------------------------------------------------------------- what a step costs here
# A check must know what its next unit of work will cost *before* starting it, or the budget is
# only a wish: one fp16 step of a small GPT took 12 s in PyTorch's CPU fp16 kernels (0.4 s since
# the check computes them in float32, lowp_emulation.py). Measured steps are the best guide;
# before any, the workload's FLOPs over the rate of a short GEMM probe in that dtype, run under
# the same emulation as the steps (GEMMs dominate a slow fp16 step, so the probe predicts it
# within ~10%; an fp32/bf16 step is never assumed cheaper than fp32 GEMMs).

# (m, k, n): ~0.05 s in PyTorch's slow CPU fp16 kernels; the rest run a larger one (milliseconds),
# since a small GEMM understates their rate 2-4x and would make every prediction pessimistic
PROBE_SHAPE = {"fp16": (1024, 256, 256), "other": (1024, 512, 512)}
_RATES: dict[tuple[str, str, bool], float] = {}  # (device type, precision, emulated) -> FLOP/s, per process


def gemm_rate(precision: str, device) -> float | None:
    """FLOP/s of one (m, k) @ (k, n) GEMM in `precision`'s dtype on a CPU (None elsewhere: a GPU
    step is cheap and needs no prediction). Measured once per process."""
    import torch

    from .lowp_emulation import emulated

    dev = torch.device(device)
    if dev.type != "cpu":
        return None
    fast = emulated(precision)  # the probe runs under the same emulation as the steps it predicts
    key = (dev.type, precision, fast)
    if key not in _RATES:
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision, torch.float32)
        m, k, n = PROBE_SHAPE["fp16" if precision == "fp16" and not fast else "other"]
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(m, k, generator=gen).to(dtype)
        b = torch.randn(k, n, generator=gen).to(dtype)
        a @ b  # first call: kernel selection, allocation
        times = []
        for _ in range(3):
            start = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - start)
        _RATES[key] = 2.0 * m * k * n / max(sorted(times)[1], 1e-9)
    return _RATES[key]


@dataclass
class StepCosts:
    """Seconds one plain training step takes on this run's device, per precision."""
    flops_per_step: float | None
    device: object
    measured: dict[str, float] = field(default_factory=dict)

    def record(self, precision: str, seconds: float) -> None:
        self.measured[precision] = seconds

    def expected(self, precision: str) -> float | None:
        """The measured cost, else a prediction (None: nothing to go on, so run it and see)."""
        if precision in self.measured:
            return self.measured[precision]
        fp32 = self.measured.get("fp32")
        if self.flops_per_step:
            rate, rate32 = gemm_rate(precision, self.device), gemm_rate("fp32", self.device)
            if rate is None or rate32 is None:
                return None
            base = fp32 if fp32 is not None else self.flops_per_step / rate32
            return max(base, self.flops_per_step / rate)
        if fp32 is not None:
            rate, rate32 = gemm_rate(precision, self.device), gemm_rate("fp32", self.device)
            if rate and rate32:
                return fp32 * max(1.0, rate32 / rate)
        return None


_COSTS: ContextVar[StepCosts | None] = ContextVar("step_costs", default=None)


def track_costs(costs: StepCosts | None):
    """Make `costs` the current run's step costs (returns the token for `untrack`)."""
    return _COSTS.set(costs)


def untrack(token) -> None:
    _COSTS.reset(token)


def expected_step_s(precision: str, factor: float = 1.0) -> float | None:
    """The current run's expected cost of one `precision` step (times `factor`), or None."""
    costs = _COSTS.get()
    value = costs.expected(precision) if costs is not None else None
    return None if value is None else value * factor


def record_step_s(precision: str, seconds: float, keep_measured: bool = False) -> None:
    """Tell the current run what one plain `precision` step took (`keep_measured`: only if no
    step in that precision was measured yet)."""
    costs = _COSTS.get()
    if costs is not None and not (keep_measured and precision in costs.measured):
        costs.record(precision, seconds)


def fits(deadline: float | None, seconds: float | None) -> bool:
    """A unit of work expected to take `seconds` (None: unknown) ends before the deadline."""
    return deadline is None or seconds is None or time.perf_counter() + seconds <= deadline
