"""Timing one training step honestly, and summarising a set of step times.

CUDA work is asynchronous: a wall clock read right after a step measures how fast Python
queued the kernels, not how long the GPU took. On CUDA a step is bracketed by CUDA events
on the current stream and read after a synchronisation; elsewhere the device is synchronised
and `time.perf_counter` is used. The summary uses the median and the inter-quartile range,
which shrug off the odd slow step (a page fault, another process) that would drag a mean.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from .precision import synchronize


class StepTimer:
    """`with timer.measure(): step()` records one duration; `collect()` returns them in ms.

    On CUDA the events are only read in `collect()`, after one synchronisation, so timing a
    round of steps costs a single host-device round trip instead of one per step.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self._cuda = device.type == "cuda"
        self._pending: list = []

    def time(self, fn: Callable[[], object]) -> None:
        if self._cuda:
            # on the timed device's stream: a bare record() uses the *current* device's, so a
            # model on cuda:1 timed while cuda:0 is current would be bracketed by idle events
            stream = torch.cuda.current_stream(self.device)
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record(stream)
            fn()
            end.record(stream)
            self._pending.append((start, end))
        else:
            synchronize(self.device)
            t0 = time.perf_counter()
            fn()
            synchronize(self.device)
            self._pending.append((time.perf_counter() - t0) * 1000.0)

    def collect(self) -> list[float]:
        """Durations in milliseconds of every step timed since the last call, in order."""
        if self._cuda and self._pending:
            synchronize(self.device)
            out = [start.elapsed_time(end) for start, end in self._pending]
        else:
            out = [float(x) for x in self._pending]
        self._pending = []
        return out


@dataclass(frozen=True)
class Summary:
    median: float
    q1: float
    q3: float

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    @property
    def spread(self) -> float:
        """IQR / median: the relative noise of the measurement (0.03 = 3%)."""
        return self.iqr / self.median if self.median > 0 else float("inf")


def summarize(samples: Sequence[float]) -> Summary:
    """Median and quartiles (inclusive method, so 2-3 samples still give a sensible IQR)."""
    if not samples:
        raise ValueError("no samples to summarise")
    data = sorted(float(x) for x in samples)
    med = statistics.median(data)
    if len(data) < 2:
        return Summary(med, med, med)
    q1, _, q3 = statistics.quantiles(data, n=4, method="inclusive")
    return Summary(med, q1, q3)
