"""What tracing costs a training script per step: untraced vs `trace` vs `trace --nan` vs the
same steps under torch.autograd.detect_anomaly(), side by side in one run.

The step: a small GPT preset trained with GradScaler, autocast (fp32: entered but disabled, the
default, fast on any CPU; or fp16/bf16), unscale_, clip_grad_norm_, scaler step and update,
scheduler step, zero_grad, timed with the process CPU clock and one torch thread, because wall
time on a shared machine varies far more than the differences measured.

Default (`--mode inprocess`): one process; the trace observers (the same Recorder, Numerics and
patches the trace child installs) are installed and removed around blocks of steps, the four
modes interleaved in rotating order; per mode the median step of each block, then the median
over rounds. `--mode processes`: end to end, each run a fresh process (`python this_file
--child` untraced or under anomaly mode, `trace_script(this_file)` traced); process-to-process
variation on a shared VM is about +-10%, larger than the effects measured. Targets:

    (traced - plain) / plain                   <= 0.05
    (traced --nan - plain) / (anomaly - plain) <= 0.2

    python bench/trace_overhead.py                     # CPU, in one process, a few minutes on a busy 2-core VM
    python bench/trace_overhead.py --mode processes    # end to end: fresh processes, trace_script()
    python bench/trace_overhead.py --device cuda --precision bf16 --rounds 5
    python bench/trace_overhead.py --compare /tmp/base --script-loss   # another checkout's tracer, same rounds
    python bench/trace_overhead.py --compare /tmp/base --count-calls 200  # + Python/C calls per step (load-free)
    python bench/trace_overhead.py --compare /tmp/base --no-steady --warmup 5  # + this tracer with --no-steady

Steady state (docs/trace.md): the traced modes reach it after 3 identical clean steps of a block
(`--warmup` 5 leaves them out of the timed steps; the median of 60 would hardly move anyway);
`--nan` never enters it.

Short steps (a fixed per-step cost shows there): MLP presets of about 0.5, 2 and 5 ms per step on
a 2-core CPU (`--preset mlp:in_features=64,hidden=64,depth=2,num_classes=8,batch_size=16`, ...,
see BENCHMARKS.md), `--steps 300 --rounds 20`. `tracer_own_ms` is what the trace report states
(the tracer's own code timed in the run, median per step); `traced_added_ms` is the difference
measured from outside, which also holds the interpreter's and torch's dispatch to that code.
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


# -- in one process ------------------------------------------------------------------------------
def run_inprocess(args) -> dict[str, list[float]]:
    import contextlib
    import functools

    import torch

    from troubleshooter.spec import SpecSource, load_workload
    from troubleshooter.trace.numerics import Numerics
    from troubleshooter.trace.patches import install
    from troubleshooter.trace.recorder import Recorder

    tracers = {"": (Recorder, Numerics, install)}
    if args.compare:
        tracers["base_"] = _other_tracer(args.compare)
    if args.no_steady:  # this checkout's tracer with every instrument armed on every step
        tracers["full_"] = (functools.partial(Recorder, steady_after=0), Numerics, install)
    modes = tuple(prefix + m if m.startswith("traced") else m for m in MODES for prefix in tracers
                  if prefix == "" or m == "traced" or m.startswith("traced") and prefix == "base_")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    device, precision = args.device, args.precision
    workload = load_workload(SpecSource.preset(args.preset))
    model = workload.build_model().to(device)
    batch = workload.batch(torch.device(device), seed=0)
    opt = workload.make_optimizer(list(model.parameters()))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision, torch.float32)
    scaler = torch.amp.GradScaler(device, enabled=precision in ("fp16", "fp32"))
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    clock = time.perf_counter if device.startswith("cuda") else time.process_time

    def script_loss():
        # the loss written in the script itself, as most training scripts do: its ops are the
        # ones trace's loss watch records (a loss computed inside this package is not recorded)
        inputs, target = batch
        out = model(*inputs)
        return torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]).float(), target.reshape(-1))

    def step():
        with torch.autocast(device.split(":")[0], dtype=dtype, enabled=precision != "fp32"):
            loss = script_loss() if args.script_loss else workload.loss(model, batch)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        sched.step()
        opt.zero_grad(set_to_none=True)

    def block(mode: str, count: int = 0):
        """The median step of one block in this mode; with `count`, the Python and C calls per step
        over `count` steps instead (sys.setprofile: a measure the host's load does not move)."""
        rec = numerics = installed = None
        ctx = contextlib.nullcontext()
        prefix = next((p for p in ("base_", "full_") if mode.startswith(p)), "")
        if mode.startswith(prefix + "traced"):
            Recorder, Numerics, install = tracers[prefix]
            rec = Recorder(10 ** 9)
            numerics = Numerics(rec, nan=mode.endswith("traced_nan"), headroom=False)
            rec.on_step = numerics.on_step
            installed = install(rec)
            # they predate install; in a traced script install comes first (without the optimizer's
            # creation the recorder would count every backward() as a step of a loop without one)
            rec.on_scaler_init(scaler)
            rec.on_optimizer_init(opt)
        elif mode == "detect_anomaly":
            ctx = torch.autograd.detect_anomaly(check_nan=True)
        times = []
        calls = {"python": 0, "c": 0}

        def counter(frame, event, arg):
            if event == "call":
                calls["python"] += 1
            elif event == "c_call":
                calls["c"] += 1

        try:
            with ctx:
                for i in range(args.warmup + (count or args.steps)):
                    sync()
                    if count and i == args.warmup:
                        sys.setprofile(counter)
                    t0 = clock()
                    step()
                    sync()
                    if i >= args.warmup:
                        times.append(clock() - t0)
                sys.setprofile(None)
        finally:
            if installed is not None:
                installed.remove()
                numerics.close()
        if mode.endswith("traced_nan") and not numerics.checked_steps:
            raise SystemExit("the --nan hooks did not run: the benchmark would measure nothing")
        if count:
            return {kind: round(n / count, 1) for kind, n in calls.items()}
        if rec is not None and hasattr(rec, "overhead"):  # what the report states (newer tracers)
            own[mode].append(rec.overhead()["per_step_ms"])
        return statistics.median(times)

    import warnings
    warnings.filterwarnings("ignore", message="Anomaly Detection has been enabled")
    results: dict[str, list[float]] = {m: [] for m in modes}
    own: dict[str, list[float]] = {m: [] for m in modes if "traced" in m}
    for r in range(args.rounds):
        order = modes[r % len(modes):] + modes[:r % len(modes)]
        for mode in order:
            results[mode].append(block(mode))
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{m} {results[m][-1] * 1e3:.2f} ms" for m in modes),
              file=sys.stderr, flush=True)
    args.own = {m: round(statistics.median(v), 4) if v else None for m, v in own.items()}
    if args.count_calls:
        args.calls = {mode: block(mode, count=args.count_calls) for mode in modes}
    return results


def _other_tracer(checkout: str):
    """Another checkout's tracer (`git worktree add /tmp/base COMMIT`) in this process, imported
    as the package `troubleshooter_base` (a link to its package folder): the tracer's modules
    import each other relatively, so the two copies share nothing but torch. Only one copy is
    installed at a time (each block installs and removes its own)."""
    import importlib
    import tempfile

    package = Path(checkout).resolve() / "troubleshooter"
    if not (package / "trace" / "recorder.py").is_file():
        raise SystemExit(f"--compare: no troubleshooter/trace in {checkout}")
    link_dir = Path(tempfile.mkdtemp(prefix="trace-overhead-"))
    (link_dir / "troubleshooter_base").symlink_to(package, target_is_directory=True)
    sys.path.insert(0, str(link_dir))
    recorder = importlib.import_module("troubleshooter_base.trace.recorder")
    numerics = importlib.import_module("troubleshooter_base.trace.numerics")
    patches = importlib.import_module("troubleshooter_base.trace.patches")
    return recorder.Recorder, numerics.Numerics, patches.install


# -- end to end, a process per run -------------------------------------------------------------
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
    p.add_argument("--rounds", type=int, default=None, help="default 15 in-process, 5 with processes")
    p.add_argument("--script-loss", action="store_true",
                   help="in-process only: compute the loss in this file (recorded by trace's loss watch)")
    p.add_argument("--mode", choices=("inprocess", "processes"), default="inprocess")
    p.add_argument("--count-calls", type=int, default=0, metavar="STEPS",
                   help="in-process: also count the Python and C calls per step of each mode over STEPS steps "
                        "(sys.setprofile; independent of the host's load)")
    p.add_argument("--no-steady", action="store_true",
                   help="in-process: also time this checkout's tracer with every instrument armed on every step "
                        "(trace --no-steady), as full_traced, in the same rounds")
    p.add_argument("--compare", metavar="DIR", help="in-process: also time the tracer of another checkout of this "
                   "project (`git worktree add /tmp/base COMMIT`) in the same rounds, as base_traced and "
                   "base_traced_nan; implies --script-loss (the loss computed in this file for both)")
    args = p.parse_args()
    if args.child:
        child(args.child, args.preset, args.device, args.precision, args.warmup, args.steps, args.anomaly)
        return
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    if args.compare:
        args.script_loss = True  # the base tracer would record this package's loss ops as the script's
    if args.rounds is None:
        args.rounds = 15 if args.mode == "inprocess" else 5
    if args.mode == "inprocess":
        results = run_inprocess(args)
    else:
        results = {m: [] for m in MODES}
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
        "torch": __import__("torch").__version__, "compare": args.compare, "preset": args.preset, "script_loss": args.script_loss, "device": args.device,
        "precision": args.precision, "mode": args.mode, "rounds": args.rounds, "steps_per_run": args.steps,
        "median_ms": {m: round(v * 1e3, 3) for m, v in med.items()},
        "traced_added": round(traced_added, 4), "traced_added_per_round": [round(x, 4) for x in per_round_traced],
        "traced_added_ms": round((med["traced"] - plain) * 1e3, 4),
        "tracer_own_ms": getattr(args, "own", None),  # as the report states it: the tracer's own code, timed in the run
        "nan_over_anomaly": round(nan_ratio, 4), "nan_over_anomaly_per_round": [round(x, 4) for x in per_round],
        "targets": {"traced_added": 0.05, "nan_over_anomaly": 0.2},
        # the fastest block per mode: on a loaded host other tenants only ever add time
        "min_ms": {m: round(min(v) * 1e3, 3) for m, v in results.items()},
        **({"calls_per_step": args.calls} if getattr(args, "calls", None) else {}),
        **({"base_traced_added": round((med["base_traced"] - plain) / plain, 4),
            "base_traced_added_ms": round((med["base_traced"] - plain) * 1e3, 4),
            "base_nan_over_anomaly": round((med["base_traced_nan"] - plain) / (med["detect_anomaly"] - plain), 4)}
           if "base_traced" in med else {}),
        **({"full_traced_added": round((med["full_traced"] - plain) / plain, 4),
            "full_traced_added_ms": round((med["full_traced"] - plain) * 1e3, 4)} if "full_traced" in med else {}),
    }, indent=2))


if __name__ == "__main__":
    main()
