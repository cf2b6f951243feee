"""What AMP201's advice is worth on a GPU: GPT-2 small with its vocabulary of 50257 (not a multiple
of 8) against the same model padded to 50304 (nanoGPT's fix), bf16 training steps timed side by
side in one process, interleaved, with CUDA events.

On the first H200 run the profile of GPT-2 small's bf16 step showed three `..._align1` GEMM kernels
(the head's matmuls with the odd vocabulary, sm75-era kernels) taking about 30 ms of a 75 ms step.

    python bench/alignment_gain.py [--rounds 8] [--steps 3] [--batch-size 16] [--json OUT]

`--device cpu` runs the same code on a tiny model (a smoke test of the script; no figure).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GPT2 = "gpt:vocab_size={v},d_model=768,n_layer=12,n_head=12,seq_len=1024,batch_size={b}"
TINY = "gpt:vocab_size={v},d_model=32,n_layer=1,n_head=2,seq_len=16,batch_size={b}"


def measure(device: str, rounds: int, steps: int, batch_size: int) -> dict:
    import torch

    from troubleshooter.engine import precision as prec
    from troubleshooter.engine.timing import StepTimer
    from troubleshooter.engine.training_step import build, training_step
    from troubleshooter.spec import SpecSource, load_workload

    dev = torch.device(device)
    preset = GPT2 if dev.type == "cuda" else TINY
    runs = {}
    for vocab in (50257, 50304):
        workload = load_workload(SpecSource.preset(preset.format(v=vocab, b=batch_size)))
        model, opt = build(workload, dev, 0)
        runs[vocab] = (workload, model, opt, prec.make_scaler("bf16", dev), workload.batch(dev, seed=0))

    def step(vocab):
        workload, model, opt, scaler, batch = runs[vocab]
        with prec.precision_mode("bf16", dev):
            training_step(workload, model, opt, scaler, batch, "bf16", dev)

    for vocab in runs:  # warm-up: kernel loading, autotuning
        for _ in range(3):
            step(vocab)
    timer = StepTimer(dev)
    order = []
    for r in range(rounds):
        for vocab in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
            timer.time(lambda: [step(vocab) for _ in range(steps)])
            order.append(vocab)
    ms = {vocab: [] for vocab in runs}
    for vocab, total in zip(order, timer.collect()):
        ms[vocab].append(total / steps)
    med = {v: statistics.median(x) for v, x in ms.items()}
    ratios = [a / b for a, b in zip(ms[50257], ms[50304])]
    return {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "preset": preset,
            "torch": torch.__version__, "rounds": rounds, "steps_per_round": steps, "ms": ms, "median_ms": med,
            "speedup_padded": statistics.median(ratios), "ratio_range": [min(ratios), max(ratios)]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA GPU on this machine: nothing measured")
        return 1
    res = measure(args.device, args.rounds, args.steps, args.batch_size)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    m = res["median_ms"]
    print(f"{res['device']} · torch {res['torch']} · bf16 training step, {res['rounds']} interleaved rounds x "
          f"{res['steps_per_round']} steps · {res['preset'].format(v='V', b=args.batch_size)}")
    print(f"| vocabulary | ms per step (median) |\n| --- | ---: |\n| 50257 | {m[50257]:.2f} |\n| 50304 | {m[50304]:.2f} |")
    lo, hi = res["ratio_range"]
    print(f"padded is {res['speedup_padded']:.2f}x faster (per-round ratios {lo:.2f}-{hi:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
