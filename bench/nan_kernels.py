"""Which kernel gives a tensor's exact min and max fastest, where the NaN-hunt hooks run them.

Why: the reductions are about 60% of the hooks' time inside a small CNN's step (issue 28), and
a one-pass kernel would save the second read of every activation and gradient. This times the
candidates on the CNN's tensor sizes the way the hooks meet them, right after the kernel that
wrote the tensor (a Conv2d + BatchNorm2d forward, so the data is only partly in the cache), in
rotating order, one torch thread, median of `--rounds`; and a whole forward's outputs reduced in
one call at the forward's end (`torch._foreach_*`) against one call per tensor.

    python bench/nan_kernels.py
    python bench/nan_kernels.py --rounds 200 --batch-size 16

Only the first two candidates give exactly what the reports need (min and max, NaN-propagating);
the others are timed to show what a one-pass or batched form would cost if its missing half were
free: `amax` alone is the floor of any two-pass form's first pass.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import torch
from torch import nn


def candidates(lo: torch.Tensor, hi: torch.Tensor) -> dict:
    """name -> f(tensor): each writes into the 0-d views lo/hi where it can, as the hooks do."""
    def numpy_pair(t):
        a = t.numpy()
        lo.fill_(float(a.min()))
        hi.fill_(float(a.max()))

    return {
        "amin + amax (hooks, float32 >= 32 K)": lambda t: (torch.amin(t, out=lo), torch.amax(t, out=hi)),
        "aminmax (hooks, smaller)": lambda t: torch.aminmax(t, out=(lo, hi)),
        "amax alone (half the answer)": lambda t: torch.amax(t, out=hi),
        "vector_norm(inf) (max |x| only)": lambda t: torch.linalg.vector_norm(t, float("inf"), out=hi),
        "abs().amax() (max |x|, a copy)": lambda t: torch.amax(t.abs(), out=hi),
        "max() (all-reduce)": lambda t: t.max(),
        "numpy min + max": numpy_pair,
    }


def per_size(rounds: int, batch_size: int) -> None:
    buf = torch.empty(4)
    lo, hi = buf[0], buf[1]
    fns = candidates(lo, hi)
    print("| tensor (elements) | " + " | ".join(fns) + " |")
    print("| --- |" + " ---: |" * len(fns))
    for channels, size in ((16, 32), (32, 16), (64, 8)):
        conv = nn.Conv2d(channels, channels, 3, padding=1)
        bn = nn.BatchNorm2d(channels)
        x = torch.randn(batch_size, channels, size, size)
        times: dict[str, list[float]] = {k: [] for k in fns}
        names = list(fns)
        with torch.no_grad():
            for r in range(rounds):
                for name in names[r % len(names):] + names[:r % len(names)]:
                    y = bn(conv(x))  # just written, as in a module's forward hook
                    t0 = time.thread_time_ns()
                    fns[name](y)
                    times[name].append(time.thread_time_ns() - t0)
        row = " | ".join(f"{statistics.median(v) / 1e3:.1f}" for v in times.values())
        print(f"| {batch_size}x{channels}x{size}x{size} ({y.numel()}) | {row} |")


def whole_forward(rounds: int, batch_size: int) -> None:
    """The CNN forward's 25 reduced outputs, reduced at its end: per tensor or one foreach call."""
    sizes = ([batch_size * 3 * 32 * 32] + [batch_size * 16 * 32 * 32] * 7 + [batch_size * 32 * 16 * 16] * 7
             + [batch_size * 64 * 8 * 8] * 7 + [batch_size * 64, batch_size * 10, batch_size * 10])
    tensors = [torch.randn(n) for n in sizes]
    out = torch.empty(2 * len(tensors))
    sweep = torch.randn(8 << 20)  # 32 MiB: the forward's outputs as the backward finds them

    def per_tensor():
        for i, t in enumerate(tensors):
            torch.amin(t, out=out[2 * i])
            torch.amax(t, out=out[2 * i + 1])

    fns = {"amin + amax per tensor": per_tensor,
           "_foreach_max (max only)": lambda: torch._foreach_max(tensors),
           "_foreach_norm(inf) (max |x| only)": lambda: torch._foreach_norm(tensors, float("inf"))}
    if hasattr(torch, "_foreach_min"):
        fns["_foreach_min + _foreach_max"] = lambda: (torch._foreach_min(tensors), torch._foreach_max(tensors))
    print(f"\n{len(tensors)} tensors, {sum(sizes) / 1e6:.2f} M floats (the CNN forward's reduced outputs); "
          f"us, median of {max(rounds // 10, 5)}; torch has _foreach_min: {hasattr(torch, '_foreach_min')}")
    for name, f in fns.items():
        times = []
        for _ in range(max(rounds // 10, 5)):
            sweep.add_(1.0)
            t0 = time.thread_time_ns()
            f()
            times.append(time.thread_time_ns() - t0)
        print(f"  {name:36s} {statistics.median(times) / 1e3:8.0f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--batch-size", type=int, default=16, help="the CNN preset's batch (default: 16)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"torch {torch.__version__}, {platform.machine()}, {torch.backends.cpu.get_cpu_capability()}, "
          f"1 thread, load {load:.1f}; us per call, median of {args.rounds} rotating rounds, "
          "right after the Conv2d + BatchNorm2d that wrote the tensor\n")
    per_size(args.rounds, args.batch_size)
    whole_forward(args.rounds, args.batch_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
