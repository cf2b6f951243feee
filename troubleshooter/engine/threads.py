"""How many CPU threads a check's steps run on: one when the host's other processes already keep
its cores busy.

The checks measure numerics, never speed, and a tiny step on PyTorch's intra-op thread pool waits
for a thread the scheduler has given to another process: on a 2-core host at load 2.7 the default
check of the `gpt` preset took 35 s of wall and 36 s of CPU time on 2 threads, 8.8 s of both on
one (the `mlp` preset 7-9.6 s against 1.4 s; bench/first_answer.py, BENCHMARKS.md issue 28). A
thread count the user chose (OMP_NUM_THREADS, MKL_NUM_THREADS) is left alone, and so is any device
but the CPU. `speedup` never uses this: it measures the speed your training would get.
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

USER_SETTINGS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def threads_for(load: float, cores: int, default: int) -> int:
    """The threads to use: the cores the rest of the host leaves free (at least one), at most
    PyTorch's default."""
    free = int(cores - load + 0.5)
    return max(1, min(default, free))


@contextlib.contextmanager
def cpu_threads(device) -> Iterator[dict[str, Any] | None]:
    """Run the block on `threads_for` the host's 1-minute load; yields what the report says
    (None: nothing changed). The thread count is restored after."""
    import torch

    if torch.device(device).type != "cpu" or any(os.environ.get(v) for v in USER_SETTINGS):
        yield None
        return
    try:
        load = os.getloadavg()[0]
    except OSError:
        yield None
        return
    default, cores = torch.get_num_threads(), os.cpu_count() or 1
    used = threads_for(load, cores, default)
    if used == default:
        yield None
        return
    torch.set_num_threads(used)
    try:
        yield {"used": used, "default": default,
               "why": f"the host was busy (load {load:.1f} on {cores} cores): {used} thread(s) waits for no "
                      "other process (the checks measure numerics, not speed; OMP_NUM_THREADS overrides)"}
    finally:
        torch.set_num_threads(default)
