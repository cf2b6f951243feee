"""The time budget of a `check` run: each check gets a share of what is left, and steps stop at
a step boundary once their deadline has passed.

Shares follow each check's weight (the skip-rate probe trains the most, the capability check
reads properties only); time a check does not use carries over to the ones after it. A check
always does its first unit of work (one step, one precision), so even a spent budget gives
something measured; what it could not do is reported, never silently dropped.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

Progress = Callable[[float, str], None]


@dataclass
class Budget:
    total_s: float | None  # None: no limit
    weights: dict[str, float]
    started: float = field(default_factory=lambda: time.perf_counter())
    _left_weight: float = 0.0

    def __post_init__(self) -> None:
        self._left_weight = float(sum(self.weights.values()))

    def remaining(self) -> float | None:
        if self.total_s is None:
            return None
        return max(0.0, self.total_s - (time.perf_counter() - self.started))

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
