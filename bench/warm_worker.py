"""How long a job waits for its worker process: a cold spawn (`run_in_worker`) against the
standby worker spawned ahead (`WarmPool`), side by side, same job, same run.

The job is the app's device probe (`troubleshooter.ui.check.capability_in_child`: imports torch,
detects the device), the smallest job the page runs in a worker. Between two rounds the script
waits, as the app does between two user jobs, so the standby is ready again.

    python bench/warm_worker.py [--rounds 5] [--pause 8]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from troubleshooter.ui.check import capability_in_child  # noqa: E402
from troubleshooter.worker import WarmPool, run_in_worker  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--pause", type=float, default=8.0, help="seconds between rounds (the standby refills)")
    args = ap.parse_args()
    pool = WarmPool()
    pool.prepare("cpu")
    time.sleep(args.pause)
    cold, warm = [], []
    for _ in range(args.rounds):  # interleaved: the machine's load hits both alike
        t = time.perf_counter()
        run_in_worker(capability_in_child, "cpu", timeout_s=300)
        cold.append(time.perf_counter() - t)
        t = time.perf_counter()
        pool.run("cpu", capability_in_child, "cpu", timeout_s=300)
        warm.append(time.perf_counter() - t)
        time.sleep(args.pause)
    pool.close()
    c, w = statistics.median(cold), statistics.median(warm)
    print(f"{platform.machine()} {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}, {args.rounds} rounds")
    print(f"cold spawn  s: {' '.join(f'{x:.2f}' for x in cold)}  median {c:.2f}")
    print(f"warm standby s: {' '.join(f'{x:.2f}' for x in warm)}  median {w:.2f}")
    print(f"ratio warm / cold (medians): {w / c:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
