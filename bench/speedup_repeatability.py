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
from troubleshooter.spec import SpecSource, load_workload  # noqa: E402


def matmul_tflops(device: torch.device, n: int = 8192, iters: int = 20) -> dict:
    """One large bf16 matmul, timed with CUDA events after a warm-up: the practical ceiling."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        a @ b
    end.record()
    torch.cuda.synchronize(device)
    seconds = start.elapsed_time(end) / 1000.0
    achieved = 2.0 * n**3 * iters / seconds / 1e12
    name = torch.cuda.get_device_name(device)
    peak = hardware.peak_tflops(name, "bf16")
    return {"device": name, "n": n, "iters": iters, "achieved_tflops": achieved, "peak_tflops": peak,
            "share_of_peak": achieved / peak if peak else None}


def compare(first: dict, second: dict) -> dict:
    out = {}
    for p in first["results"]:
        a = first["results"][p].get("speedup_vs_fp32")
        b = second["results"].get(p, {}).get("speedup_vs_fp32")
        if p == "fp32" or a is None or b is None:
            continue
        out[p] = {"run1": a, "run2": b, "rel_diff": abs(a - b) / ((a + b) / 2),
                  "run1_paired": first["results"][p].get("speedup_vs_fp32_paired"),
                  "run2_paired": second["results"][p].get("speedup_vs_fp32_paired"),
                  "run1_spread": first["results"][p]["spread"], "run2_spread": second["results"][p]["spread"]}
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
    runs = []
    for i in range(2):
        t0 = time.perf_counter()
        runs.append(run_speedup(workload, device=device, precisions=args.precisions,
                                budget_s=args.budget, compile=args.compile))
        print(f"run {i + 1}: {time.perf_counter() - t0:.1f} s, {runs[-1]['settings']['rounds']} rounds, "
              f"stopped: {runs[-1]['settings']['stopped_because']}", file=sys.stderr)
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
        print(f"| {p} | {c['run1']:.3f}x | {c['run2']:.3f}x | {c['rel_diff']:.1%} | "
              f"{fmt(c['run1_paired'], '.3f')}x / {fmt(c['run2_paired'], '.3f')}x | "
              f"{c['run1_spread']:.1%} / {c['run2_spread']:.1%} |")
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
