"""What the NaN-hunt hooks cost per training step, next to torch.autograd.detect_anomaly.

Same model, same batch, one process: plain steps, steps with `nanhunt` (one sync per step),
and steps inside `detect_anomaly()`, interleaved in rotating order so drift on a shared
machine hits every mode alike. Reports medians and the ratio

    (hooks - plain) / (anomaly - plain)      target: <= 0.2

    python bench/nan_overhead.py                       # deep MLP, CNN, small GPT on CPU, side by side
    python bench/nan_overhead.py --baseline-ref main   # + the hooks of another git ref, same rounds
    python bench/nan_overhead.py --device cuda --precision bf16 --preset gpt:d_model=768,n_layer=12
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from troubleshooter.engine import precision as prec  # noqa: E402
from troubleshooter.engine.nanhooks import HookSet  # noqa: E402
from troubleshooter.engine.nanhunt import nanhunt  # noqa: E402
from troubleshooter.spec import SpecSource, load_workload  # noqa: E402

# before: every module hooked (no passive-module rule; the state before the second issue-11.8 change)
MODES = ("plain", "nanhunt", "nanhunt_before", "detect_anomaly")
# --breakdown: where nanhunt's added time goes, timed in the same rounds: the hooks with no
# arithmetic (every aminmax replaced by a placeholder: Python and hook dispatch only), and the
# forward hooks alone (no gradient or parameter hooks)
BREAKDOWN = ("nanhunt_no_arithmetic", "nanhunt_forward_only")
DEFAULT_PRESET = "gpt:vocab_size=2048,d_model=128,n_layer=2,n_head=4,seq_len=64,batch_size=8"
# the shapes of issue 11.8, measured side by side in one run by default: many small layers
# (where per-hook costs dominate), a CNN, and the small GPT
SHAPES = ("mlp:in_features=64,hidden=64,depth=24,num_classes=10,batch_size=32",
          "cnn:width=16,batch_size=16",
          DEFAULT_PRESET)


class _HooksWithoutArithmetic(HookSet):
    """The same hooks, slots and analysis, with no reduction: what is left is Python and hook
    dispatch (only for --breakdown; the report it gives is meaningless)."""

    def _claim(self, step, t, measure=True, no_grad=False):
        return super()._claim(step, t, measure=False)  # a slot holding a placeholder, no reduction

    def _claim_in(self, step, d, key, split):
        return super()._claim(step, d, measure=False)


_BASELINE: dict[str, type] = {}  # --baseline-ref: "HookSet" -> that ref's HookSet class


def load_baseline(ref: str) -> type:
    """HookSet as it is in git `ref` (engine/nanhooks.py of that commit, imported under another
    name), so a change is timed against what it replaces in the same process and rounds."""
    root = Path(__file__).resolve().parents[1]
    source = subprocess.run(["git", "-C", str(root), "show", f"{ref}:troubleshooter/engine/nanhooks.py"],
                            check=True, capture_output=True, text=True).stdout
    source = source.replace("from .hook_registry import", "from troubleshooter.engine.hook_registry import")
    path = Path(tempfile.mkdtemp(prefix="nanhooks_ref_")) / "nanhooks_ref.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("nanhooks_ref", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.HookSet


def _step(workload, model, opt, scaler, batch, precision, device) -> None:
    opt.zero_grad(set_to_none=True)
    with prec.autocast(precision, device):
        loss = workload.loss(model, batch)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()


def _clock(device: torch.device):
    """CPU: this process's CPU time, so other tenants of a shared VM do not count (with one
    torch thread it is the step's compute time). GPU: wall time around synchronised steps."""
    return time.process_time if device.type == "cpu" else time.perf_counter


def _time_block(mode, workload, model, opt, scaler, batch, precision, device, steps) -> list[float]:
    """Per-step seconds for `steps` steps in one mode (hooks attached only for this block)."""
    hunt = None
    if mode.startswith("nanhunt"):
        hunt = nanhunt(model, log=False, scaler=scaler)
        hunt.hooks.skip_passive_modules = mode != "nanhunt_before"
        if mode == "nanhunt_no_arithmetic":
            hunt.hooks.__class__ = _HooksWithoutArithmetic
        if mode == "nanhunt_ref":  # that ref's own HookSet, step records and all
            ref = _BASELINE["HookSet"](model)
            ref.on_root_call = hunt._on_root_call
            hunt.hooks = ref
        hunt.hooks.backward = mode != "nanhunt_forward_only"
        hunt.attach()
    anomaly = torch.autograd.detect_anomaly() if mode == "detect_anomaly" else contextlib.nullcontext()
    times = []
    clock = _clock(device)
    try:
        with anomaly:
            for _ in range(steps):
                prec.synchronize(device)
                t0 = clock()
                _step(workload, model, opt, scaler, batch, precision, device)
                if hunt is not None:
                    hunt.step()  # the one host sync of a hooked step, inside the timed region
                prec.synchronize(device)
                times.append(clock() - t0)
    finally:
        if hunt is not None:
            hunt.detach()
    return times


def run(preset: str, device: str, precision: str, repeats: int, steps: int, warmup: int,
        modes: tuple[str, ...] = MODES) -> dict:
    """Medians per mode over `repeats` interleaved rounds; `modes` must hold plain, nanhunt and
    detect_anomaly (nanhunt_before and the --breakdown modes are optional)."""
    device = prec.resolve_device(device)
    workload = load_workload(SpecSource.preset(preset))
    torch.manual_seed(0)
    model = workload.build_model().to(device)
    model.train()
    opt = workload.make_optimizer(list(model.parameters()))
    scaler = prec.make_scaler(precision, device)
    batch = workload.batch(device, seed=0)
    warnings.filterwarnings("ignore", message=".*[Aa]nomaly.*")
    for mode in modes:  # warm-up: allocator, autograd caches, first-call costs of each mode
        _time_block(mode, workload, model, opt, scaler, batch, precision, device, warmup)
    per_mode: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(repeats):
        order = modes[r % len(modes):] + modes[:r % len(modes)]
        for mode in order:
            block = _time_block(mode, workload, model, opt, scaler, batch, precision, device, steps)
            per_mode[mode].append(statistics.median(block))
    med = {m: statistics.median(v) for m, v in per_mode.items()}
    ours = med["nanhunt"] - med["plain"]
    anomaly = med["detect_anomaly"] - med["plain"]
    # the same ratio within each round (modes measured back to back): its spread shows the noise
    rounds = sorted((h - p) / (a - p) for p, h, a in zip(per_mode["plain"], per_mode["nanhunt"],
                                                         per_mode["detect_anomaly"]) if a > p)
    before = med["nanhunt_before"] - med["plain"] if "nanhunt_before" in med else None
    ref = med["nanhunt_ref"] - med["plain"] if "nanhunt_ref" in med else None
    return {
        "ratio_ref": ref / anomaly if anomaly > 0 and ref is not None else float("nan"),
        "round_ratios": rounds,
        "ratio_before": before / anomaly if anomaly > 0 and before is not None else float("nan"),
        "nanhunt_over_plain": ours / med["plain"] if med["plain"] > 0 else float("nan"),
        "preset": preset, "device": str(device), "precision": precision, "repeats": repeats,
        "steps_per_block": steps, "median_step_s": med,
        "added_s": {"nanhunt": ours, "detect_anomaly": anomaly},
        "ratio": ours / anomaly if anomaly > 0 else float("nan"),
        "params": sum(p.numel() for p in model.parameters()),
    }


def _breakdown_row(res: dict) -> str:
    """One markdown row: nanhunt's added time split by the --breakdown modes of the same rounds."""
    med = res["median_step_s"]
    plain, ours = med["plain"], med["nanhunt"]

    def ms(x: float) -> str:
        return f"{x * 1e3:+.2f} ms"

    return (f"| `{res['preset']}` | {ms(ours - plain)} | {ms(ours - med['nanhunt_no_arithmetic'])} | "
            f"{ms(med['nanhunt_no_arithmetic'] - plain)} | {ms(ours - med['nanhunt_forward_only'])} | "
            f"{ms(res['added_s']['detect_anomaly'] / 5)} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", action="append",
                    help="model preset, repeatable (default: the three shapes of SHAPES, side by side)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default: cpu)")
    ap.add_argument("--precision", default="fp32", help="fp32, tf32, fp16 or bf16 (default: fp32)")
    ap.add_argument("--repeats", type=int, default=11, help="interleaved rounds (default: 11)")
    ap.add_argument("--steps", type=int, default=4, help="steps per mode per round (default: 4)")
    ap.add_argument("--threads", type=int, default=1,
                    help="CPU threads for torch (default: 1; on a loaded shared VM more threads "
                         "spin against each other and swamp the difference being measured)")
    ap.add_argument("--warmup", type=int, default=2, help="warm-up steps per mode (default: 2)")
    ap.add_argument("--baseline-ref", metavar="REF",
                    help="also time the hooks of this git ref (e.g. main) in the same rounds, for a "
                         "before/after of a change to engine/nanhooks.py")
    ap.add_argument("--breakdown", action="store_true",
                    help="also time the hooks without arithmetic and the forward hooks alone in the "
                         "same rounds, and print where nanhunt's added time goes")
    args = ap.parse_args(argv)
    precision = prec.check_precision(args.precision)
    if args.repeats < 1 or args.steps < 1 or args.threads < 1:
        ap.error("--repeats, --steps and --threads must be at least 1")
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    print(f"torch {torch.__version__}; {platform.processor() or platform.machine()}, {torch.get_num_threads()} "
          f"threads, {precision}; {args.repeats} interleaved rounds x {args.steps} steps per mode; medians of "
          f"{'process CPU time' if args.device == 'cpu' else 'wall time, synchronised'}\n")
    ref = args.baseline_ref
    print("| model (preset) | params | plain ms/step | nanhunt added | before (all modules hooked) added "
          + (f"| {ref} added " if ref else "")
          + "| detect_anomaly added | ratio | ratio before " + (f"| ratio {ref} " if ref else "")
          + "| per-round ratios (median) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | " + ("---: | ---: | " if ref else "") + "--- |")
    modes = MODES + BREAKDOWN if args.breakdown else MODES
    if ref:
        _BASELINE["HookSet"] = load_baseline(ref)
        modes += ("nanhunt_ref",)
    breakdown_rows = []
    for preset in args.preset or SHAPES:
        res = run(preset, args.device, precision, args.repeats, args.steps, args.warmup, modes)
        breakdown_rows.append(_breakdown_row(res) if args.breakdown else None)
        med, plain = res["median_step_s"], res["median_step_s"]["plain"]

        def added(mode):
            a = med[mode] - plain
            return f"{a * 1e3:+.1f} ms ({a / plain:+.0%})"

        rr = res["round_ratios"]
        spread = f"{rr[0]:.2f} .. {rr[-1]:.2f} ({statistics.median(rr):.2f})" if rr else "n/a"
        print(f"| `{preset}` | {res['params'] / 1e6:.2f} M | {plain * 1e3:.1f} | {added('nanhunt')} | "
              f"{added('nanhunt_before')} | " + (f"{added('nanhunt_ref')} | " if ref else "")
              + f"{added('detect_anomaly')} | **{res['ratio']:.3f}** | {res['ratio_before']:.3f} | "
              + (f"{res['ratio_ref']:.3f} | " if ref else "") + f"{spread} |", flush=True)
    print(f"\nratio = (nanhunt - plain) / (detect_anomaly - plain), target <= 0.2   "
          f"[{time.perf_counter() - t0:.0f} s]")
    if args.breakdown:
        print("\n| model (preset) | nanhunt added | of which arithmetic (aminmax) | of which Python and "
              "dispatch | of which backward hooks | target (a fifth of detect_anomaly's) |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for row in breakdown_rows:
            print(row)
        print("\narithmetic = nanhunt - no_arithmetic; backward hooks = nanhunt - forward_only "
              "(gradient and parameter hooks with their arithmetic)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
