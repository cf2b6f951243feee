"""Throughput of the generated recipes on a GPU: bf16 and fp16 against fp32 (TF32 off).

Renders the recipe for each precision, resizes its demo transformer to GPT-2 small (12 layers,
768 wide, 12 heads, 1024 tokens, vocabulary 50304), runs each as its own process on the GPU, and
reads tokens/s from the recipe's own progress lines (the median of the windows after the first,
which includes warm-up). MFU = FLOPs per token * tokens/s / the GPU's dense peak for that precision,
with nanoGPT's FLOPs per token (`estimate_mfu`): 6 * the parameters that multiply (the blocks and the
head; not the input embedding table, a lookup) + 12 * layers * width * tokens of context (attention).
fp32 runs with TF32 off (PyTorch's default for matmuls), so it is the true fp32 baseline.

    python bench/recipe_throughput.py [--steps 60] [--batch-size 8] [--compile]

Needs a CUDA GPU; without one it says so and measures nothing. `measure()` is what
bench/gpu_suite.py calls (its CPU dry run passes tiny sizes and device "cpu").
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from troubleshooter import hardware  # noqa: E402
from troubleshooter.recipes import render_recipe  # noqa: E402

GPT2_SMALL = {"VOCAB_SIZE": 50304, "SEQ_LEN": 1024, "N_EMBD": 768, "N_HEAD": 12, "N_LAYER": 12}
PRECISIONS = ("fp32", "bf16", "fp16")
RATE = re.compile(r"\| ([\d,]+) tok/s")


def sized_recipe(precision: str, compile_: bool, log_every: int, sizes: dict = GPT2_SMALL) -> str:
    """The recipe for `precision` with its demo transformer resized to `sizes`."""
    text = render_recipe(precision=precision, compile=compile_, log_every=log_every)
    for name, value in sizes.items():
        text, n = re.subn(rf"^{name} = \d+", f"{name} = {value}", text, count=1, flags=re.M)
        assert n == 1, f"the template has no {name} line any more"
    return text


def gpt2_recipe(precision: str, compile_: bool, log_every: int) -> str:
    return sized_recipe(precision, compile_, log_every, GPT2_SMALL)


def parameter_count(sizes: dict = GPT2_SMALL) -> int:
    """Parameters of the demo transformer at `sizes` (untied head)."""
    c = sizes
    per_block = 12 * c["N_EMBD"] ** 2 + 13 * c["N_EMBD"]  # qkv + proj + 2-layer MLP + norms
    return c["N_LAYER"] * per_block + (2 * c["VOCAB_SIZE"] + c["SEQ_LEN"]) * c["N_EMBD"]


def flops_per_token(sizes: dict = GPT2_SMALL) -> int:
    """nanoGPT's estimate for one token's forward and backward. Counting the untied input embedding
    (a lookup, no FLOPs) as 6 FLOPs a parameter made the first H200 run report fp32 at 87% MFU, above
    the fp32 matmul rate measured in the same run."""
    c = sizes
    multiplying = parameter_count(sizes) - (c["VOCAB_SIZE"] + c["SEQ_LEN"]) * c["N_EMBD"]
    return 6 * multiplying + 12 * c["N_LAYER"] * c["N_EMBD"] * c["SEQ_LEN"]


def params_gpt2_small() -> int:
    return parameter_count(GPT2_SMALL)


def _device_name(device: str) -> str | None:
    if not device.startswith("cuda"):
        return None
    import torch

    return torch.cuda.get_device_name(torch.device(device).index or 0)


def _launch(script: Path, device: str, steps: int, batch_size: int, out_dir: Path, env: dict | None):
    return subprocess.Popen([sys.executable, str(script), "--device", device, "--max-steps", str(steps),
                             "--batch-size", str(batch_size), "--out-dir", str(out_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def _finish(proc: subprocess.Popen, row: dict, t0: float, timeout_s: float, name: str | None,
            flops_token: int) -> None:
    """Wait for one recipe process and fill its row: tokens/s and MFU, or the error."""
    try:
        stdout, stderr = proc.communicate(timeout=max(1.0, timeout_s - (time.perf_counter() - t0)))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        row["error"] = f"timed out after {timeout_s:g} s"
        return
    finally:
        row["seconds"] = time.perf_counter() - t0
    if proc.returncode != 0:
        row["error"] = " ".join(stderr.strip().splitlines()[-1:]) or f"exit {proc.returncode}"
        return
    rates = [float(r.replace(",", "")) for r in RATE.findall(stdout)]
    if not rates:
        row["error"] = "no progress line with tok/s in the recipe's output"
        return
    row["windows"] = len(rates)
    row["tokens_per_s"] = statistics.median(rates[1:] or rates)  # the first window includes warm-up
    peak = hardware.peak_tflops(name, row["precision"]) if name else None
    row["mfu"] = flops_token * row["tokens_per_s"] / (peak * 1e12) if peak else None


def measure(device: str = "cuda", precisions=PRECISIONS, steps: int = 60, batch_size: int = 8,
            compile_: bool = False, sizes: dict = GPT2_SMALL, log_every: int = 10, timeout_s: float = 600,
            env: dict | None = None, parallel: bool = False) -> dict:
    """Run the recipe once per precision, one process each, one after another (`parallel`: all at
    once, for a dry run whose rates mean nothing); tokens/s, MFU and the ratio to fp32 (when fp32 is
    among them). A run that fails or times out is a row with its error."""
    name = _device_name(device)
    n_params, flops_token = parameter_count(sizes), flops_per_token(sizes)
    rows = [{"precision": p, "tokens_per_s": None, "mfu": None, "vs_fp32": None, "error": None} for p in precisions]
    with tempfile.TemporaryDirectory() as tmp:
        scripts = []
        for row in rows:
            script = Path(tmp) / f"train_{row['precision']}.py"
            script.write_text(sized_recipe(row["precision"], compile_, log_every, sizes))
            scripts.append(script)
        if parallel:
            t0 = time.perf_counter()
            procs = [_launch(sc, device, steps, batch_size, Path(tmp) / r["precision"], env)
                     for sc, r in zip(scripts, rows)]
            for proc, row in zip(procs, rows):
                _finish(proc, row, t0, timeout_s, name, flops_token)
        else:
            for script, row in zip(scripts, rows):
                t0 = time.perf_counter()
                proc = _launch(script, device, steps, batch_size, Path(tmp) / row["precision"], env)
                _finish(proc, row, t0, timeout_s, name, flops_token)
    base = next((r["tokens_per_s"] for r in rows if r["precision"] == "fp32"), None)
    for r in rows:
        if base and r["tokens_per_s"]:
            r["vs_fp32"] = r["tokens_per_s"] / base
    return {"device": device, "device_name": name, "parameters": n_params, "flops_per_token": flops_token, "sizes": dict(sizes), "steps": steps,
            "batch_size": batch_size, "compile": compile_, "parallel": parallel, "rows": rows}


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
    result = measure("cuda", PRECISIONS, args.steps, args.batch_size, args.compile)
    print(f"{result['device_name']} · GPT-2 small ({result['parameters'] / 1e6:.0f}M params) · batch "
          f"{args.batch_size} x 1024 tokens{' · torch.compile' if args.compile else ''} · torch {torch.__version__}")
    print("| precision | tokens/s | vs fp32 | MFU |\n| --- | --- | --- | --- |")
    for row in result["rows"]:
        if row["tokens_per_s"] is None:
            print(f"| {row['precision']} | failed: {row['error']} | | |")
            continue
        ratio = f"{row['vs_fp32']:.2f}x" if row["vs_fp32"] else "-"
        print(f"| {row['precision']} | {row['tokens_per_s']:,.0f} | {ratio} | "
              f"{format(row['mfu'], '.1%') if row['mfu'] else '-'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
