"""Throughput of the generated recipes on a GPU: bf16 and fp16 against fp32 (TF32 off).

Renders the recipe for each precision, resizes its demo transformer to GPT-2 small (12 layers,
768 wide, 12 heads, 1024 tokens, vocabulary 50304), runs each as its own process on the GPU, and
reads tokens/s from the recipe's own progress lines (the median of the windows after the first,
which includes warm-up). MFU = 6 * parameters * tokens/s / the GPU's dense peak for that precision
(attention FLOPs left out, as in nanoGPT's estimate). fp32 runs with TF32 off (PyTorch's default
for matmuls), so it is the true fp32 baseline.

    python bench/recipe_throughput.py [--steps 60] [--batch-size 8] [--compile]

Needs a CUDA GPU; without one it says so and measures nothing.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from troubleshooter import hardware  # noqa: E402
from troubleshooter.recipes import render_recipe  # noqa: E402

GPT2_SMALL = {"VOCAB_SIZE": 50304, "SEQ_LEN": 1024, "N_EMBD": 768, "N_HEAD": 12, "N_LAYER": 12}
RATE = re.compile(r"\| ([\d,]+) tok/s")


def gpt2_recipe(precision: str, compile_: bool, log_every: int) -> str:
    text = render_recipe(precision=precision, compile=compile_, log_every=log_every)
    for name, value in GPT2_SMALL.items():
        text, n = re.subn(rf"^{name} = \d+", f"{name} = {value}", text, count=1, flags=re.M)
        assert n == 1, f"the template has no {name} line any more"
    return text


def params_gpt2_small() -> int:
    c = GPT2_SMALL
    per_block = 12 * c["N_EMBD"] ** 2 + 13 * c["N_EMBD"]  # qkv + proj + 2-layer MLP + norms
    return c["N_LAYER"] * per_block + (2 * c["VOCAB_SIZE"] + c["SEQ_LEN"]) * c["N_EMBD"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--compile", action="store_true")
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU on this machine: nothing measured")
        return 1
    name = torch.cuda.get_device_name(0)
    n_params = params_gpt2_small()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for precision in ("fp32", "bf16", "fp16"):
            script = Path(tmp) / f"train_{precision}.py"
            script.write_text(gpt2_recipe(precision, args.compile, log_every=10))
            proc = subprocess.run([sys.executable, str(script), "--device", "cuda", "--max-steps", str(args.steps),
                                   "--batch-size", str(args.batch_size), "--out-dir", str(Path(tmp) / precision)],
                                  capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
            if proc.returncode != 0:
                rows.append((precision, None, None, proc.stderr.strip().splitlines()[-1:]))
                continue
            rates = [float(r.replace(",", "")) for r in RATE.findall(proc.stdout)][1:]
            tok_s = statistics.median(rates)
            peak = hardware.peak_tflops(name, precision)
            mfu = 6 * n_params * tok_s / (peak * 1e12) if peak else None
            rows.append((precision, tok_s, mfu, []))
    base = rows[0][1]
    print(f"{name} · GPT-2 small ({n_params / 1e6:.0f}M params) · batch {args.batch_size} x 1024 tokens"
          f"{' · torch.compile' if args.compile else ''} · torch {torch.__version__}")
    print("| precision | tokens/s | vs fp32 | MFU |\n| --- | --- | --- | --- |")
    for precision, tok_s, mfu, err in rows:
        if tok_s is None:
            print(f"| {precision} | failed: {' '.join(err)} | | |")
            continue
        ratio = f"{tok_s / base:.2f}x" if base else "-"
        print(f"| {precision} | {tok_s:,.0f} | {ratio} | {f'{mfu:.1%}' if mfu else '-'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
