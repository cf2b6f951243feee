"""Hold `speedup` against an independent torch.utils.benchmark measurement, quiet and busy.

Issue 11's check: on a quiet CPU and on a deliberately busy one (processes burning every core
while both measurements run), the speedup verdict must agree with an independent measurement
of the same model, or say "inconclusive"; a verdict given on timings whose spread exceeds 50%
fails.

    python bench/speedup_vs_utils_benchmark.py                    # mlp and a small gpt, CPU
    python bench/speedup_vs_utils_benchmark.py --preset mlp --budget 20 --burners 4

The independent side shares nothing with the engine but the model spec: it builds the model
itself, writes its own training step (zero_grad, autocast forward, backward, optimizer step)
and times it with `torch.utils.benchmark.Timer.blocked_autorange` (median and IQR of blocks),
each precision in the listed order and then in reverse, so a drifting host favours neither.
Its speedup is median(fp32) / median(p), put in the same buckets as ours (`level_for`).
Ours agrees when its level equals the reference's, or when it says inconclusive; it FAILS when
it disagrees with a verdict, or gives a verdict although one of its spreads (fp32, the chosen
precision, or their paired ratio) is above 50%. When the reference's own spread is above 50%
its level is shown but is no ground truth ("ref noisy").
"""
from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from contextlib import contextmanager

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from torch.utils import benchmark  # noqa: E402

from troubleshooter.engine import precision as prec  # noqa: E402
from troubleshooter.engine.speedup import run_speedup  # noqa: E402
from troubleshooter.engine.verdict import level_for  # noqa: E402
from troubleshooter.spec import SpecSource, load_workload  # noqa: E402

PRESETS = ("mlp", "gpt:vocab_size=2048,d_model=128,n_layer=2,n_head=4,seq_len=64,batch_size=8")
SPREAD_LIMIT = 0.50
_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


@contextmanager
def busy(burners: int):
    """`burners` child processes spinning on the CPU for the duration (none for 0)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(burners)]
    try:
        time.sleep(0.5 if procs else 0)  # let them get scheduled
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _tf32(precision: str, device: torch.device):
    """TF32 on only for tf32 on CUDA (fp32 is strict fp32, as in the speedup check)."""
    return prec.tf32_mode(precision == "tf32" and device.type == "cuda")


def reference(workload, precisions, min_run_time: float, device: str | torch.device = "cpu") -> dict:
    """median/IQR per precision of a hand-written training step, timed by torch.utils.benchmark
    (which synchronises CUDA around each block). fp32 on CUDA runs with TF32 off, tf32 with it on.

    Timed in the listed order and then in reverse (A B ... B A), half the run time each, and the
    blocks of both passes pooled: a host whose speed drifts during the run (this VM's step times
    move by 20% within a minute) would otherwise favour whichever precision is timed first."""
    import statistics

    device = torch.device(device)
    steps, blocks = {}, {p: [] for p in precisions}
    for p in precisions:
        torch.manual_seed(0)
        model = workload.build_model().to(device)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        inputs, target = workload.batch(device, seed=0)
        dtype = _DTYPES.get(p)
        scaler = torch.amp.GradScaler(device.type, enabled=p == "fp16")

        def step(model=model, opt=opt, inputs=inputs, target=target, dtype=dtype, scaler=scaler):
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                loss = workload.loss_fn(model(*inputs), target)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()

        with _tf32(p, device):
            step()  # warm-up
        steps[p] = step
    for order in (list(precisions), list(reversed(precisions))):
        for p in order:
            with _tf32(p, device):
                m = benchmark.Timer(stmt="step()", globals={"step": steps[p]}, num_threads=torch.get_num_threads()
                                    ).blocked_autorange(min_run_time=min_run_time / 2)
            blocks[p].extend(m.times)
    out = {}
    for p, times in blocks.items():
        q = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
        med = statistics.median(times)
        out[p] = {"median_ms": med * 1e3, "spread": (q[2] - q[0]) / med if med else None, "blocks": len(times)}
    base = out["fp32"]["median_ms"]
    for p, r in out.items():
        r["speedup"] = base / r["median_ms"]
    return out


def judge(ours: dict, ref: dict) -> dict:
    """Our verdict against the reference: agree / inconclusive (fine) / disagree or noisy verdict (fail)."""
    v = ours["verdict"]
    level, best = v["level"], v.get("best_precision")
    spreads = {p: r.get("spread") for p, r in ours["results"].items() if p in ("fp32", best)}
    r = ours["results"].get(best) or {} if best else {}
    iqr, med = r.get("speedup_vs_fp32_iqr"), r.get("speedup_vs_fp32_paired")
    pair_spread = (iqr[1] - iqr[0]) / med if iqr and med else None  # of the paired per-round ratios
    worst = max([s for s in [*spreads.values(), pair_spread] if s is not None], default=None)
    ref_best = max((p for p in ref if p != "fp32"), key=lambda p: ref[p]["speedup"])
    ref_level = level_for(ref[ref_best]["speedup"])
    ref_noisy = any((ref[p]["spread"] or 0) > SPREAD_LIMIT for p in ("fp32", ref_best))
    if level in ("inconclusive", "unknown"):
        outcome = "ok: inconclusive"
    elif worst is not None and worst > SPREAD_LIMIT:
        outcome = f"FAIL: a verdict on a {worst:.0%} spread"
    elif level == ref_level:
        outcome = "ok: agrees"
    else:
        outcome = "FAIL: disagrees" + (" (ref noisy)" if ref_noisy else "")
    return {"level": level, "best": best, "speedup": v.get("speedup"), "ci": v.get("speedup_ci"),
            "worst_spread": worst, "ref_best": ref_best, "ref_speedup": ref[ref_best]["speedup"],
            "ref_level": ref_level, "ref_spread": max(ref[p]["spread"] or 0 for p in ("fp32", ref_best)),
            "ref_noisy": ref_noisy, "outcome": outcome}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", action="append", help=f"repeatable (default: {', '.join(PRESETS)})")
    ap.add_argument("--precisions", default="fp32,bf16", help="(default: fp32,bf16; fp16 is emulated on most CPUs)")
    ap.add_argument("--budget", type=float, default=15.0, help="our speedup --budget per run (default 15)")
    ap.add_argument("--ref-time", type=float, default=3.0, help="torch.utils.benchmark min_run_time per precision")
    ap.add_argument("--burners", type=int, default=os.cpu_count() or 2,
                    help="CPU-burning processes in the busy condition (default: one per core)")
    args = ap.parse_args(argv)
    precisions = [p.strip() for p in args.precisions.split(",")]
    if "fp32" not in precisions:
        ap.error("--precisions must include fp32 (the baseline)")
    t0 = time.perf_counter()
    print(f"torch {torch.__version__}, {platform.machine()}, {os.cpu_count()} cores, "
          f"{torch.get_num_threads()} torch threads; busy = {args.burners} spinning processes\n")
    print("| model | CPU | ours: level (best, speedup, 95% CI) | our worst spread | "
          "torch.utils.benchmark: level (best, speedup) | its spread | outcome |")
    print("| --- | --- | --- | ---: | --- | ---: | --- |")
    failed = 0
    for preset in args.preset or PRESETS:
        workload = load_workload(SpecSource.preset(preset))
        for cond, burners in (("quiet", 0), ("busy", args.burners)):
            with busy(burners):
                ours = run_speedup(workload, device="cpu", precisions=precisions, budget_s=args.budget)
                ref = reference(workload, precisions, args.ref_time)
            j = judge(ours, ref)
            failed += j["outcome"].startswith("FAIL")
            ci = f", [{j['ci'][0]:.2f}, {j['ci'][1]:.2f}]" if j["ci"] else ""
            sp = f"{j['speedup']:.2f}x" if j["speedup"] is not None else "n/a"
            ws = f"{j['worst_spread']:.0%}" if j["worst_spread"] is not None else "n/a"
            print(f"| `{preset}` | {cond} | {j['level']} ({j['best']}, {sp}{ci}) | {ws} | "
                  f"{j['ref_level']} ({j['ref_best']}, {j['ref_speedup']:.2f}x) | {j['ref_spread']:.0%}"
                  f"{' (noisy)' if j['ref_noisy'] else ''} | {j['outcome']} |", flush=True)
    print(f"\n{failed} failure(s)   [{time.perf_counter() - t0:.0f} s]")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
