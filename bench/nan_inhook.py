"""CPU time spent inside the NaN-hunt hooks per training step: this tree's hooks against those
of a git ref, in alternating blocks of one process.

Why next to bench/nan_overhead.py: that bench times whole steps, and on a shared 2-core VM a
step's time moves by about a millisecond from round to round, as much as a change to the hooks
is worth. The time inside the hooks (thread CPU time around each hook call and `collect()`) is
a smaller quantity with a smaller spread, so two versions of the hooks can be told apart in a
minute. It leaves out what happens outside the hooks' own Python (the autograd engine's calls
into them, nn.Module's hook dispatch), and each timed call adds about 2 us of timer to both.

    python bench/nan_inhook.py                                  # the CNN, against main
    python bench/nan_inhook.py --preset mlp:depth=24 --ref HEAD~1 --rounds 60
"""
from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from nan_overhead import load_baseline  # noqa: E402

from troubleshooter.engine.nanhooks import HOOK_ENTRY_POINTS, HookSet  # noqa: E402
from troubleshooter.spec import SpecSource, load_workload  # noqa: E402

# the entry points the hooks are called through (trace/numerics.py times the same), and collect
ENTRY_POINTS = (*HOOK_ENTRY_POINTS, "collect")


def timed(base: type, spent: list[int]) -> type:
    """`base` with each entry point's thread CPU time added to spent[0]."""
    clock = time.thread_time_ns

    def wrap(method):
        def entry(self, *args):
            started = clock()
            try:
                return method(self, *args)
            finally:
                spent[0] += clock() - started
        return entry

    return type(f"Timed{base.__name__}", (base,), {name: wrap(getattr(base, name)) for name in ENTRY_POINTS
                                                  if hasattr(base, name)})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="cnn:width=16,batch_size=16")
    ap.add_argument("--ref", default="main", help="git ref whose hooks are the baseline (default: main)")
    ap.add_argument("--rounds", type=int, default=40, help="alternating blocks per version (default: 40)")
    ap.add_argument("--steps", type=int, default=5, help="steps per block (default: 5)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    spent = [0]
    versions = {args.ref: timed(load_baseline(args.ref), spent), "this tree": timed(HookSet, spent)}
    workload = load_workload(SpecSource.preset(args.preset))
    torch.manual_seed(0)
    model = workload.build_model()
    model.train()
    opt = workload.make_optimizer(list(model.parameters()))
    batch = workload.batch(torch.device("cpu"), seed=0)
    in_hooks: dict[str, list[float]] = {name: [] for name in versions}

    def block(name: str, keep: bool) -> None:
        hooks = versions[name](model).attach()
        try:
            for _ in range(args.steps):
                spent[0] = 0
                opt.zero_grad(set_to_none=True)
                workload.loss(model, batch).backward()
                opt.step()
                hooks.collect()
                if keep:
                    in_hooks[name].append(spent[0] / 1e3)
        finally:
            hooks.detach()

    for name in versions:  # warm-up
        block(name, keep=False)
    names = list(versions)
    for r in range(args.rounds):
        for name in names if r % 2 else names[::-1]:
            block(name, keep=True)
    print(f"torch {torch.__version__}, {platform.machine()}, 1 thread, `{args.preset}`, "
          f"{args.rounds} rounds x {args.steps} steps per version; "
          "us of thread CPU time inside the hooks per step")
    for name, v in in_hooks.items():
        q = statistics.quantiles(v, n=4)
        print(f"  {name:>10}: median {statistics.median(v):7.0f}  (quartiles {q[0]:.0f} .. {q[2]:.0f})")
    ref, ours = (statistics.median(in_hooks[n]) for n in names)
    print(f"  this tree / {args.ref}: {ours / ref:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
