"""A job right after a job through the standby pool (`WarmPool`), two source trees side by side:
how long each job waits for its result, and the CPU time of all the worker processes.

After a job the pool replaces its standby; a job sent at once waits for that replacement. Each
round starts one fresh Python per tree (in alternating order) that prepares the standby, waits
`--pause` s (the standby is ready, as on a page that sat idle), runs `--jobs` jobs back to back,
waits `--pause` s again (the last replacement done), closes the pool, and reports the latencies
and the CPU time of everything it started (RUSAGE_CHILDREN: every worker process is reaped in
the end, by its supervisor, its zygote or the caller). The job is the app's device probe
(`troubleshooter.ui.check.capability_in_child`: import torch, detect the device), the smallest
job the page sends to the pool.

    python bench/job_after_job.py --baseline /tmp/zA [--rounds 7] [--jobs 4] [--pause 8] [--device cpu]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
THIS_TREE = os.path.dirname(HERE)


def child(root: str, jobs: int, pause: float, device: str) -> None:
    import resource

    sys.path.insert(0, root)
    from troubleshooter.ui.check import capability_in_child
    from troubleshooter.worker import WarmPool

    pool = WarmPool()
    pool.prepare(device)
    time.sleep(pause)
    latency = []
    for _ in range(jobs):
        t = time.perf_counter()
        pool.run(device, capability_in_child, device, timeout_s=300)
        latency.append(time.perf_counter() - t)
    time.sleep(pause)
    pool.close()
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(json.dumps({"latency": latency, "cpu": used.ru_utime + used.ru_stime}))


def run_tree(root: str, args) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", root, "--jobs", str(args.jobs),
           "--pause", str(args.pause), "--device", args.device]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=root)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", help="the other source tree (e.g. a clone of main)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--pause", type=float, default=8.0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--child", metavar="ROOT", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.jobs, args.pause, args.device)
        return 0
    trees = {"baseline": os.path.abspath(args.baseline), "this": THIS_TREE}
    rows: dict[str, list[dict]] = {name: [] for name in trees}
    print(f"{platform.machine()} {os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, "
          f"load {os.getloadavg()[0]:.1f}; {args.rounds} rounds of {args.jobs} jobs, pause {args.pause:g} s")
    for r in range(args.rounds):
        order = list(trees) if r % 2 == 0 else list(trees)[::-1]
        for name in order:
            res = run_tree(trees[name], args)
            rows[name].append(res)
            after = res["latency"][1:]
            print(f"round {r + 1} {name:8s} first {res['latency'][0]:.2f} s, after a job "
                  f"{' '.join(f'{x:.2f}' for x in after)} s, worker CPU {res['cpu']:.1f} s", flush=True)
    print(f"load {os.getloadavg()[0]:.1f} at the end")
    summary = {}
    for name, results in rows.items():
        summary[name] = (statistics.median(x for res in results for x in res["latency"][1:]),
                         statistics.median(res["latency"][0] for res in results),
                         statistics.median(res["cpu"] for res in results))
    print("| tree | job after a job, median s | first job (standby ready), median s | worker CPU per run, median s |")
    print("| --- | ---: | ---: | ---: |")
    for name, (after, first, cpu) in summary.items():
        print(f"| {name} | {after:.2f} | {first:.2f} | {cpu:.1f} |")
    (a, f, c), (a0, f0, c0) = summary["this"], summary["baseline"]
    print(f"ratios this / baseline: job after a job {a / a0:.2f}, first job {f / f0:.2f}, worker CPU {c / c0:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
