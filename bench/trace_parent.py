"""A command-line trace's cost, this checkout against another, side by side (issue 28: the trace's
parent process imported torch as well as its child).

Each round runs `python -m troubleshooter trace SCRIPT --steps N --format json` once per checkout,
in rotating order, from a neutral folder (PYTHONPATH picks the checkout; the child gets the same
one from the runner), and records
  - wall seconds of the whole command,
  - the parent's own CPU seconds and peak RSS (its RUSAGE_SELF, read at exit by a wrapper that
    runs the CLI exactly as `python -m troubleshooter` does), and the CPU of what it waited for
    (the child: RUSAGE_CHILDREN),
  - whether torch was in the parent's sys.modules at exit.
The medians and their ratios go to stdout; every run to --json.

    python bench/trace_parent.py --baseline /tmp/main [--rounds 7] [--steps 3] [--script S.py ...]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = """import torch

model = torch.nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(100):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(torch.randn(8, 16)).float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
"""
# Runs the CLI as `python -m troubleshooter` does; at exit (atexit runs before sys.exit's teardown
# and before os._exit in cli.exit_now) writes the parent's own usage to $TRACE_PARENT_USAGE.
WRAPPER = """
import atexit, json, os, resource, runpy, sys

def _usage():
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(os.environ["TRACE_PARENT_USAGE"], "w") as fh:
        json.dump({"parent_cpu_s": me.ru_utime + me.ru_stime, "parent_peak_rss_mib": me.ru_maxrss / 1024,
                   "child_cpu_s": kids.ru_utime + kids.ru_stime, "torch_in_parent": "torch" in sys.modules}, fh)

atexit.register(_usage)
sys.argv = ["troubleshooter", *sys.argv[1:]]
runpy.run_module("troubleshooter", run_name="__main__", alter_sys=True)
"""


def run_once(root: Path, script: str, args: list[str], steps: int, cwd: str) -> dict:
    usage = os.path.join(cwd, "usage.json")
    env = {**os.environ, "PYTHONPATH": str(root), "TRACE_PARENT_USAGE": usage}
    cmd = [sys.executable, "-c", WRAPPER, "trace", script, "--steps", str(steps), "--format", "json", "--", *args]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"{cmd} exited {proc.returncode}: {proc.stderr[-2000:]}")
    report = json.loads(proc.stdout)
    with open(usage) as fh:
        out = json.load(fh)
    return {"wall_s": wall, **out, "exit": report["exit"]["status"], "steps_observed": report["steps_observed"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", required=True, help="another checkout's root (e.g. `git worktree add /tmp/main main`)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--script", action="append", default=[],
                    help="a training script (repeatable; `PATH -- ARGS` as one string); default: a tiny torch loop")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    roots = {"baseline": Path(args.baseline).resolve(), "this": ROOT}
    work = tempfile.mkdtemp(prefix="trace-parent-bench-")
    scripts = []
    for text in args.script or []:
        path, _, rest = text.partition(" -- ")
        scripts.append((str(Path(path).resolve()), rest.split()))
    if not scripts:
        tiny = os.path.join(work, "tiny_train.py")
        Path(tiny).write_text(TINY)
        scripts.append((tiny, []))
    runs: list[dict] = []
    print(f"load before: {os.getloadavg()}; {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}", flush=True)
    for script, script_args in scripts:
        for name, root in roots.items():  # warm the page cache; not counted
            run_once(root, script, script_args, args.steps, work)
        for r in range(args.rounds):
            order = list(roots.items()) if r % 2 == 0 else list(reversed(roots.items()))
            for name, root in order:
                res = run_once(root, script, script_args, args.steps, work)
                runs.append({"script": os.path.basename(script), "checkout": name, "round": r, **res})
                print(json.dumps(runs[-1]), flush=True)
    print(f"load after: {os.getloadavg()}; {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}")
    keys = ("wall_s", "parent_cpu_s", "child_cpu_s", "parent_peak_rss_mib")
    for script in dict.fromkeys(r["script"] for r in runs):
        med = {name: {k: statistics.median(r[k] for r in runs if r["script"] == script and r["checkout"] == name)
                      for k in keys} for name in roots}
        torch_seen = {name: sorted({r["torch_in_parent"] for r in runs if r["script"] == script
                                    and r["checkout"] == name}) for name in roots}
        print(f"\n{script}: medians of {args.rounds} rounds (torch in the parent: {torch_seen})")
        for k in keys:
            b, t = med["baseline"][k], med["this"][k]
            print(f"  {k:20} baseline {b:8.3f}  this {t:8.3f}  this/baseline {t / b:.2f}  saved {b - t:+.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"roots": {k: str(v) for k, v in roots.items()}, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
