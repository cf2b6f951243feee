"""Building the speedup check's models: one seeded build per precision (before) against one build
copied per precision (`SeededStart`), side by side in one process, rounds alternating.

On a GPU the speedup check's default 20 s budget for GPT-2 small was spent before its first timed
round (2026-11-28, H200); four CPU builds of a 124M-parameter model were about 4 s of it.

    python bench/seeded_start.py [--preset SPEC] [--copies 4] [--rounds 5] [--device cpu]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GPT2_SMALL = "gpt:vocab_size=50257,d_model=768,n_layer=12,n_head=12,seq_len=1024,batch_size=16"


def _timed(fn) -> tuple[float, float]:
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w0, time.process_time() - c0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default=GPT2_SMALL)
    ap.add_argument("--copies", type=int, default=4, help="precisions to prepare (the speedup default: 4 on a GPU)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)

    import torch

    from troubleshooter.engine.training_step import SeededStart, build
    from troubleshooter.spec import SpecSource
    from troubleshooter.spec.loader import load_workload

    workload = load_workload(SpecSource("preset", args.preset))
    device = torch.device(args.device)

    def before():
        models = [build(workload, device, 0) for _ in range(args.copies)]
        del models

    def after():
        start = SeededStart(workload, 0)
        models = [start.build(device, last=i == args.copies - 1) for i in range(args.copies)]
        del models

    rows = {"one build per precision": [], "one build, copied": []}
    for r in range(args.rounds):
        order = [("one build per precision", before), ("one build, copied", after)]
        for name, fn in (order if r % 2 == 0 else order[::-1]):
            rows[name].append(_timed(fn))
    print(f"{args.preset}, {args.copies} models on {device}; {platform.node()}, {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.2f}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, torch {torch.__version__}")
    print(f"| way | wall s (median of {args.rounds}) | CPU s | vs before (wall) |\n| --- | ---: | ---: | ---: |")
    base = statistics.median(w for w, _ in rows["one build per precision"])
    for name, xs in rows.items():
        wall, cpu = statistics.median(w for w, _ in xs), statistics.median(c for _, c in xs)
        print(f"| {name} | {wall:.2f} | {cpu:.2f} | {wall / base:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
