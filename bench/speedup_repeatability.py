"""How repeatable is the speedup check? Run it twice in one process and compare the ratios.

    python bench/speedup_repeatability.py --preset mlp --budget 20
    python bench/speedup_repeatability.py --preset "gpt:d_model=768,n_layer=12,n_head=12,seq_len=1024,batch_size=16" --budget 120

Prints, per precision, the speedup over fp32 of run 1 and run 2 and how far apart they are
(|a - b| / mean; the target on a GPU is within 5%). On CUDA it also times one large bf16
matmul and reports it as a share of the device's peak from data/gpus.yaml, so users see
what the hardware can do at best next to what their model reaches.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from troubleshooter import hardware  # noqa: E402
from troubleshooter.engine import precision as prec  # noqa: E402
from troubleshooter.engine.speedup import run_speedup  # noqa: E402
from troubleshooter.engine.timing import StepTimer  # noqa: E402
from troubleshooter.spec import SpecSource, load_workload  # noqa: E402


_MATMUL_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "tf32": torch.float32}


def matmul_rate(device: torch.device, precision: str = "bf16", n: int = 8192, iters: int = 20,
                warmup: int = 3) -> dict:
    """TFLOP/s of an n x n @ n x n matmul in `precision` (fp32 with TF32 off, tf32 with it on),
    timed after a warm-up like a training step (StepTimer: CUDA events on the device's own stream,
    read after a synchronisation; perf_counter around a synchronised block elsewhere)."""
    device = torch.device(device)
    a = torch.randn(n, n, device=device, dtype=_MATMUL_DTYPES[precision])
    b = torch.randn(n, n, device=device, dtype=_MATMUL_DTYPES[precision])
    c = torch.empty_like(a)  # one output buffer: 20 results of 16384^2 would hold 10 GB

    def products(k: int) -> None:
        for _ in range(k):
            torch.matmul(a, b, out=c)

    timer = StepTimer(device)
    with prec.tf32_mode(precision == "tf32" and device.type == "cuda"):
        products(warmup)
        timer.time(lambda: products(iters))
        (ms,) = timer.collect()
    achieved = 2.0 * n**3 * iters / (ms / 1000.0) / 1e12
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    peak = hardware.peak_tflops(name, precision) if name else None
    return {"precision": precision, "device": name or device.type, "n": n, "iters": iters, "ms": ms,
            "achieved_tflops": achieved, "peak_tflops": peak, "share_of_peak": achieved / peak if peak else None}


def matmul_tflops(device: torch.device, n: int = 8192, iters: int = 20) -> dict:
    """One large bf16 matmul after a warm-up: the practical ceiling a model's bf16 step can reach."""
    return matmul_rate(device, "bf16", n, iters)


def run_twice(workload, device, precisions=None, budget_s: float = 20.0, compile: bool = False,
              log=None) -> list[dict]:
    """The speedup check twice in one process, as a user re-running it would (the same seed)."""
    runs = []
    for i in range(2):
        t0 = time.perf_counter()
        runs.append(run_speedup(workload, device=device, precisions=precisions, budget_s=budget_s, compile=compile))
        if log is not None:
            log(f"run {i + 1}: {time.perf_counter() - t0:.1f} s, {runs[-1]['settings']['rounds']} rounds, "
                f"stopped: {runs[-1]['settings']['stopped_because']}")
    return runs


def compare(first: dict, second: dict) -> dict:
    """Each precision but fp32, run 1 against run 2. `not_comparable` says why a pair says nothing
    about repeatability: a run has no figure for it (the budget left it untimed: that run's reason),
    or one was timed from a cold first step only (kernel loading), which the check does not rank."""
    out = {}
    runs = (first, second)
    names = {p for r in runs for p in (*r["results"], *r.get("skipped", {}), *r.get("errors", {}))} - {"fp32"}
    for p in sorted(names, key=lambda p: (p not in first["results"], p)):
        got = [r["results"].get(p, {}) for r in runs]
        a, b = (g.get("speedup_vs_fp32") for g in got)
        missing = next((i for i, x in enumerate((a, b), 1) if x is None), None)
        cold = [i for i, g in enumerate(got, 1) if g.get("first_step_only")]
        if missing:
            run = runs[missing - 1]
            cold_base = (run["results"].get("fp32") or {}).get("first_step_only")  # no ratio over it (make_verdict)
            why = f"run {missing}: " + (run.get("skipped", {}).get(p) or run.get("errors", {}).get(p)
                                        or ("fp32 timed from a cold first step only" if cold_base else "no figure"))
        else:
            why = f"run {' and '.join(map(str, cold))} timed from a cold first step only" if cold else None
        out[p] = {"run1": a, "run2": b, "rel_diff": None if missing else abs(a - b) / ((a + b) / 2),
                  "not_comparable": why, "missing": bool(missing),
                  "run1_paired": got[0].get("speedup_vs_fp32_paired"), "run2_paired": got[1].get("speedup_vs_fp32_paired"),
                  "run1_spread": got[0].get("spread"), "run2_spread": got[1].get("spread")}
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="mlp")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--budget", type=float, default=20.0)
    parser.add_argument("--precisions", default=None)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--json", action="store_true", help="print the raw comparison as JSON")
    args = parser.parse_args(argv)

    device = prec.resolve_device(args.device)
    workload = load_workload(SpecSource.preset(args.preset))
    runs = run_twice(workload, device, args.precisions, args.budget, args.compile,
                     log=lambda line: print(line, file=sys.stderr))
    report = {"preset": args.preset, "device": runs[0]["device"].get("summary"), "budget_s": args.budget,
              "compile": args.compile, "ratios": compare(*runs),
              "medians_ms": [{p: r["median_ms"] for p, r in run["results"].items()} for run in runs],
              "verdicts": [run["verdict"]["recommendation"] for run in runs]}
    if device.type == "cuda":
        report["bf16_matmul"] = matmul_tflops(device)

    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"preset {args.preset} on {report['device']} (budget {args.budget:g} s per run"
          + (", torch.compile" if args.compile else "") + ")")
    print("| precision | run 1 vs fp32 | run 2 vs fp32 | difference | paired run 1 / run 2 | spread run 1 / run 2 |")
    print("| --- | --- | --- | --- | --- | --- |")
    def fmt(x, spec):
        return "n/a" if x is None else format(x, spec)

    for p, c in report["ratios"].items():
        diff = fmt(c["rel_diff"], ".1%") + (f" ({c['not_comparable']})" if c["not_comparable"] else "")
        print(f"| {p} | {fmt(c['run1'], '.3f')}x | {fmt(c['run2'], '.3f')}x | {diff} | "
              f"{fmt(c['run1_paired'], '.3f')}x / {fmt(c['run2_paired'], '.3f')}x | "
              f"{fmt(c['run1_spread'], '.1%')} / {fmt(c['run2_spread'], '.1%')} |")
    for i, run in enumerate(runs, 1):
        for p, r in run["results"].items():
            if r.get("note"):
                print(f"run {i} {p}: {r['note']}")
    for i, med in enumerate(report["medians_ms"], 1):
        print(f"run {i} medians: " + ", ".join(f"{p} {m:.3f} ms" for p, m in med.items()))
    if "bf16_matmul" in report:
        m = report["bf16_matmul"]
        share = f"{m['share_of_peak']:.0%} of the {m['peak_tflops']:g} TFLOP/s peak" if m["peak_tflops"] else "no peak figure"
        print(f"bf16 matmul {m['n']}^3 on {m['device']}: {m['achieved_tflops']:.1f} TFLOP/s ({share})")
    else:
        print("no GPU: the bf16 matmul ceiling was not measured")
    return 0


if __name__ == "__main__":
    sys.exit(main())
