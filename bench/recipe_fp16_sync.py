"""What the fp16 recipe's per-step skip check costs on a GPU.

The generated fp16 loop reads the loss scale after every optimizer step (`scaler.get_scale()`, a
host sync) to tell a skipped step from a taken one, so that a skipped step does not advance the LR
schedule. On the first H200 run the fp16 recipe was 25% behind bf16. This renders the fp16 recipe
as generated and a copy whose check is removed (`stepped = True`: the sync gone, nothing else
changed), with bf16 beside them, and runs each as its own process, twice, in alternating order:
the gap the check makes is the difference between the two fp16 rows.

    python bench/recipe_fp16_sync.py [--steps 40] [--batch-size 8] [--repeats 2] [--json OUT]

Needs a CUDA GPU (`--device cpu` runs the same code on tiny sizes, for a test of the script).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import recipe_throughput as rt  # noqa: E402

CHECK = ("    scale_before = scaler.get_scale()\n", "    stepped = scaler.get_scale() >= scale_before\n")
TINY = {"VOCAB_SIZE": 64, "SEQ_LEN": 16, "N_EMBD": 32, "N_HEAD": 2, "N_LAYER": 1}


def without_skip_check(script: str) -> str:
    """The same recipe with the per-step scale reads removed (every step counts as taken)."""
    for line in CHECK:
        if script.count(line) != 1:
            raise SystemExit(f"the fp16 recipe no longer has the line {line.strip()!r}: update this bench")
    return script.replace(CHECK[0], "").replace(CHECK[1], "    stepped = True  # bench: no host sync\n")


def measure(device: str, steps: int, batch_size: int, repeats: int, sizes: dict) -> dict:
    variants = {"bf16": rt.sized_recipe("bf16", False, 10, sizes),
                "fp16": rt.sized_recipe("fp16", False, 10, sizes)}
    variants["fp16, no skip check"] = without_skip_check(variants["fp16"])
    name, flops_token = rt._device_name(device), rt.flops_per_token(sizes)
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        order = list(variants)
        for r in range(repeats):
            for v in (order if r % 2 == 0 else order[::-1]):
                script = Path(tmp) / f"train_{len(runs[v])}_{v.split(',')[0]}_{'nosync' if ',' in v else 'as_is'}.py"
                script.write_text(variants[v])
                row = {"precision": v.split(",")[0], "tokens_per_s": None, "error": None}
                t0 = time.perf_counter()
                rt._finish(rt._launch(script, device, steps, batch_size, Path(tmp) / script.stem, None),
                           row, t0, 600, name, flops_token)
                runs[v].append(row)
    medians = {v: statistics.median([r["tokens_per_s"] for r in rows if r["tokens_per_s"]] or [0]) or None
               for v, rows in runs.items()}
    return {"device_name": name, "steps": steps, "batch_size": batch_size, "repeats": repeats, "sizes": sizes,
            "runs": runs, "tokens_per_s": medians}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA GPU on this machine: nothing measured")
        return 1
    sizes = rt.GPT2_SMALL if args.device.startswith("cuda") else TINY
    result = measure(args.device, args.steps, args.batch_size, args.repeats, sizes)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    med = result["tokens_per_s"]
    print(f"{result['device_name'] or args.device} · batch {args.batch_size} · {args.steps} steps · "
          f"{args.repeats} runs each, alternating · torch {torch.__version__}")
    print("| recipe | tokens/s (median of runs) | runs | vs bf16 |\n| --- | ---: | --- | ---: |")
    for v, rows in result["runs"].items():
        each = ", ".join(f"{r['tokens_per_s']:,.0f}" if r["tokens_per_s"] else f"failed: {r['error']}" for r in rows)
        vs = f"{med[v] / med['bf16']:.3f}" if med[v] and med["bf16"] else "-"
        print(f"| {v} | {med[v] or 0:,.0f} | {each} | {vs} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
