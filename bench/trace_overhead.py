"""What tracing costs a training script per step: untraced vs `trace` vs `trace --nan` vs the
same script under torch.autograd.detect_anomaly(), side by side in one run.

This file is also the traced training script (`--child`): a small GPT preset trained with GradScaler
and autocast (fp32: entered but disabled; fp16; bf16), timing each of its own steps (forward, backward, scaler
step, update, scheduler) with the process CPU clock and one torch thread, because wall time on a
shared machine varies far more than the differences measured. Every round runs the four modes in
rotating order, each in a fresh process; per mode the median step of each run, then the median
over rounds. Targets:

    (traced - plain) / plain                   <= 0.05
    (traced --nan - plain) / (anomaly - plain) <= 0.2

    python bench/trace_overhead.py                     # CPU, ~2-4 minutes on a busy 2-core VM
    python bench/trace_overhead.py --device cuda --precision bf16 --rounds 5
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODES = ("plain", "traced", "traced_nan", "detect_anomaly")
DEFAULT_PRESET = "gpt:vocab_size=2048,d_model=128,n_layer=2,n_head=4,seq_len=64,batch_size=8"


# -- the traced training script -----------------------------------------------------------
def child(out: str, preset: str, device: str, precision: str, warmup: int, steps: int, anomaly: bool) -> None:
    import contextlib

    import torch

    from troubleshooter.spec import SpecSource, load_workload

    torch.set_num_threads(1)
    torch.manual_seed(0)
    workload = load_workload(SpecSource.preset(preset))
    model = workload.build_model().to(device)
    batch = workload.batch(torch.device(device), seed=0)
    opt = workload.make_optimizer(list(model.parameters()))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision, torch.float32)
    # fp32: autocast entered but disabled, GradScaler on: every wrapper runs, compute stays fast on CPU
    scaler = torch.amp.GradScaler(device, enabled=precision in ("fp16", "fp32"))
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    clock = time.perf_counter if device.startswith("cuda") else time.process_time
    times = []
    ctx = torch.autograd.detect_anomaly(check_nan=True) if anomaly else contextlib.nullcontext()
    with ctx:
        for i in range(warmup + steps):
            sync()
            t0 = clock()
            with torch.autocast(device.split(":")[0], dtype=dtype, enabled=precision != "fp32"):
                loss = workload.loss(model, batch)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
            sched.step()
            opt.zero_grad(set_to_none=True)
            sync()
            if i >= warmup:
                times.append(clock() - t0)
    with open(out, "w") as fh:
        json.dump({"median_s": statistics.median(times), "steps": len(times)}, fh)


# -- the driver ---------------------------------------------------------------------------------
def run_mode(mode: str, args, out: str) -> float:
    from troubleshooter.trace import trace_script

    child_args = ["--child", out, "--preset", args.preset, "--device", args.device, "--precision",
                  args.precision, "--warmup", str(args.warmup), "--steps", str(args.steps)]
    if mode == "detect_anomaly":
        child_args.append("--anomaly")
    if mode in ("plain", "detect_anomaly"):
        import subprocess
        subprocess.run([sys.executable, __file__, *child_args], check=True, cwd=str(ROOT))
    else:
        report = trace_script(__file__, child_args, steps=10 * (args.warmup + args.steps), timeout_s=600,
                              nan=mode == "traced_nan", cwd=str(ROOT))
        if report["exit"]["status"] != "finished":
            raise SystemExit(f"traced run did not finish: {report['exit']}")
    with open(out) as fh:
        return json.load(fh)["median_s"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", metavar="OUT")
    p.add_argument("--anomaly", action="store_true")
    p.add_argument("--preset", default=DEFAULT_PRESET)
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", choices=("fp16", "bf16", "fp32"), default="fp32",
                   help="fp32 (default): autocast disabled, GradScaler on; CPUs without fp16/bf16 units "
                        "emulate those slowly, which would hide the overhead measured")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    if args.child:
        child(args.child, args.preset, args.device, args.precision, args.warmup, args.steps, args.anomaly)
        return
    results: dict[str, list[float]] = {m: [] for m in MODES}
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = MODES[r % len(MODES):] + MODES[:r % len(MODES)]
            for mode in order:
                results[mode].append(run_mode(mode, args, os.path.join(tmp, f"{mode}-{r}.json")))
            print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{m} {results[m][-1] * 1e3:.2f} ms" for m in MODES),
                  file=sys.stderr, flush=True)
    med = {m: statistics.median(v) for m, v in results.items()}
    plain = med["plain"]
    traced_added = (med["traced"] - plain) / plain
    nan_ratio = (med["traced_nan"] - plain) / (med["detect_anomaly"] - plain)
    per_round = [(results["traced_nan"][i] - results["plain"][i]) / (results["detect_anomaly"][i] - results["plain"][i])
                 for i in range(args.rounds)]
    per_round_traced = [(results["traced"][i] - results["plain"][i]) / results["plain"][i] for i in range(args.rounds)]
    print(json.dumps({
        "started": started, "machine": f"{platform.machine()} {platform.processor() or ''} {os.cpu_count()} cpus".strip(),
        "load_average": os.getloadavg(), "python": platform.python_version(),
        "torch": __import__("torch").__version__, "preset": args.preset, "device": args.device,
        "precision": args.precision, "rounds": args.rounds, "steps_per_run": args.steps,
        "median_ms": {m: round(v * 1e3, 3) for m, v in med.items()},
        "traced_added": round(traced_added, 4), "traced_added_per_round": [round(x, 4) for x in per_round_traced],
        "nan_over_anomaly": round(nan_ratio, 4), "nan_over_anomaly_per_round": [round(x, 4) for x in per_round],
        "targets": {"traced_added": 0.05, "nan_over_anomaly": 0.2},
    }, indent=2))


if __name__ == "__main__":
    main()
