"""The quick speedup check: is AMP actually faster for this model on this machine?

A full training step (forward, loss, backward, optimizer step) is timed in each precision,
each on its own model and optimizer built from the same seed. After a discarded warm-up the
precisions are timed in interleaved rounds, each round in a freshly shuffled (seeded) order, so
drift of the machine (clocks, other processes) hits all of them alike and no precision always
runs first, until every precision's spread (IQR / median) is below `TARGET_SPREAD` or the time
budget runs out. The speedup is the median of the paired per-round ratios with a bootstrap
interval (`speedup_stats`); a verdict is given only where that evidence carries it. The result is the
`speedup --format json` object; `make_verdict` (in `verdict.py`) turns it into advice.
"""
from __future__ import annotations

import contextlib
import math
import os
import random
import sys
import time
from typing import Any, Callable, Iterator, Sequence

import torch

from .. import hardware
from ..errors import UserError
from ..jsonsafe import jsonable
from ..workload import Workload
from ..units import format_bytes
from . import precision as prec
from .device_info import describe_device
from .speedup_stats import paired_speedups
from .timing import StepTimer, summarize
from .budget import StepCosts
from .training_step import SeededStart, is_oom, release, training_step
from .verdict import make_verdict

DEFAULT_BUDGET_S = 20.0  # a verdict, or an honest "inconclusive", in 20 s; --budget for more
TARGET_SPREAD = 0.03  # stop sampling once every precision's IQR/median is below this ...
MIN_SAMPLES = 10  # ... and it has at least this many samples
MIN_ROUNDS = 3  # the budget stops the rounds before this only when the next round cannot end in time
RESERVE_S, RESERVE_SHARE = 2.5, 0.15  # kept back from the rounds: the alignment note, the verdict, the exit
# Work this cheap (a share of the budget) is done even past the deadline, so every precision gets a
# number and a median: a tiny model's step; a step of seconds is never started past it.
CHEAP_SHARE = 0.05
MAX_SAMPLES = 500  # per precision: enough for a stable median, keeps the JSON small
WARMUP_STEPS = 3  # discarded; their losses are the accuracy sanity check
COMPILE_WARMUP_STEPS = 6  # the first compiled steps compile and autotune
WARMUP_SHARE = 0.4  # share of the budget the warm-up of all precisions may take before it is cut short
N_BATCHES = 4  # distinct synthetic batches, cycled, the same for every precision
PROGRESS_EVERY_S = 0.25  # at most this often from the timing loop
ROUNDS_FOR_PREDICTION = 3  # the next round is expected to take as long as the slowest of these

ProgressFn = Callable[[float, str], None]


# ---------------------------------------------------------------- the device


def split_available(precisions: Sequence[str], device: torch.device,
                    info: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    """Which precisions can be timed here; the others with the reason why not.

    TF32 is never "timed as fp32": without TF32 hardware it is reported unavailable. bf16 on a
    GPU without native bf16 is still timed (autocast emulates it) and flagged `native: false`,
    because "how slow is it" is what a user of such a GPU wants to know.
    """
    available, unavailable = [], {}
    for p in precisions:
        if p == "tf32" and device.type != "cuda":
            unavailable[p] = (f"TF32 needs an NVIDIA GPU of the Ampere generation or newer; "
                              f"this is a {'CPU' if device.type == 'cpu' else device.type.upper()}")
        elif p == "tf32" and not info.get("tf32"):
            unavailable[p] = (f"TF32 needs Ampere or newer (compute capability 8.0+); "
                              f"{info.get('name')} is sm_{info.get('compute_capability', '?').replace('.', '')}")
        elif p == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
            unavailable[p] = f"this PyTorch build cannot run bfloat16 on {info.get('name')}"
        else:
            available.append(p)
    return available, unavailable


def default_precisions(device: torch.device) -> list[str]:
    """All four: tf32 then shows up as unavailable (with the reason) where it cannot run."""
    return list(prec.PRECISIONS)


# ---------------------------------------------------------------- memory


def _tensor_bytes(*objs: Any) -> int:
    """Bytes of the distinct storages behind the tensors found in objs (params, grads, state)."""
    seen: dict[int, int] = {}

    def visit(o: Any) -> None:
        if isinstance(o, torch.Tensor):
            st = o.untyped_storage()
            seen[st.data_ptr()] = st.nbytes()
        elif isinstance(o, dict):
            for v in o.values():
                visit(v)
        elif isinstance(o, (list, tuple)):
            for v in o:
                visit(v)

    for o in objs:
        visit(o)
    return sum(seen.values())


@contextlib.contextmanager
def _quiet_native_stderr() -> Iterator[None]:
    """Mute file descriptor 2 briefly: the profiler's native layer logs every start and stop
    there ("USDT: ... profiler_start"), which is noise in a report. Only its start and stop run
    inside this, never the user's step."""
    try:
        sys.stderr.flush()
        saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    except (OSError, ValueError, AttributeError):
        yield
        return
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _profiled_step_peak(step: Callable[[], Any]) -> int:
    """Peak of live CPU tensor bytes during one call, relative to its start (PyTorch profiler)."""
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _quiet_native_stderr():
        prof.__enter__()
    try:
        step()
    finally:
        with _quiet_native_stderr():
            prof.__exit__(None, None, None)
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    live = peak = 0
    for e in events:
        live += e.nbytes()
        peak = max(peak, live)
    return peak


# ---------------------------------------------------------------- one precision


class _Runner:
    """One precision's model, optimizer and scaler, built from the shared seed."""

    def __init__(self, workload: Workload, precision: str, device: torch.device, start: SeededStart,
                 compile: bool, last: bool = False):
        self.workload, self.precision, self.device = workload, precision, device
        t0 = time.perf_counter()
        self.model, self.optimizer = start.build(device, last=last)
        self.build_seconds = time.perf_counter() - t0
        self.step_model = torch.compile(self.model) if compile else self.model
        self.scaler = prec.make_scaler(precision, device)
        self.losses: list[float | None] = []
        self.warmup_seconds: list[float] = []
        self.too_slow = False  # one step used this precision's whole share: timed from warm-up only
        self.no_rounds = False  # the budget ended before the first round: timed from warm-up only
        self.skipped_steps = 0
        self.peak_memory_bytes: int | None = None
        self.memory_method: str | None = None

    def step(self, batch) -> torch.Tensor:
        with prec.precision_mode(self.precision, self.device):
            return training_step(self.workload, self.step_model, self.optimizer, self.scaler,
                                 batch, self.precision, self.device)

    def warm_up_step(self, batch) -> float:
        """One discarded step that records its loss (a host sync is fine here); returns seconds."""
        scale = self.scaler.get_scale() if self.scaler.is_enabled() else None
        t0 = time.perf_counter()
        loss = self.step(batch).item()
        prec.synchronize(self.device)
        seconds = time.perf_counter() - t0
        self.warmup_seconds.append(seconds)
        if scale is not None and self.scaler.get_scale() < scale:
            self.skipped_steps += 1
        self.losses.append(loss if math.isfinite(loss) else None)
        return seconds

    def parameter_count(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def _error_text(exc: BaseException, compile: bool) -> str:
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    msg = msg[:300]
    if is_oom(exc):
        return f"out of memory: {msg or type(exc).__name__} (try a smaller batch)"
    name = type(exc).__name__
    if compile and ("dynamo" in type(exc).__module__ or "inductor" in type(exc).__module__
                    or "_dynamo" in repr(type(exc)) or "compile" in msg.lower()):
        return f"torch.compile failed: {name}: {msg} (run without --compile)"
    return f"{name}: {msg}" if msg else name


# ---------------------------------------------------------------- the check


def _emit(progress: ProgressFn | None, fraction: float, message: str) -> None:
    if progress is not None:
        progress(max(0.0, min(1.0, fraction)), message)


def _alignment_notes(workload: Workload, device: torch.device, model) -> tuple[list[str], float | None]:
    """Significant misaligned dimensions (AMP201) and the forward FLOPs the alignment trace saw."""
    try:
        from .alignment import check_alignment
    except ImportError:
        return [], None
    try:
        result = check_alignment(workload, device, model=model)
    except Exception:  # noqa: BLE001 - a reason for the verdict, never a failure of the check
        return [], None
    notes = [f"{r.module or '<model>'} {r.dimension}={r.value} (pad to {r.padded})"
             for r in result.rows if r.significant]
    return notes, result.summary.get("forward_flops")


def run_speedup(
    workload: Workload,
    device: str | torch.device = "auto",
    precisions: Sequence[str] | str | None = None,
    budget_s: float = DEFAULT_BUDGET_S,
    compile: bool = False,
    seed: int = 0,
    progress: ProgressFn | None = None,
    started_at: float | None = None,
) -> dict[str, Any]:
    """Time a training step in each precision on `device` within `budget_s`; the JSON object.
    `started_at` (a `time.time()`: when the command started, before torch was imported and the
    model built) counts those fixed costs against the budget too."""
    if not isinstance(budget_s, (int, float)) or not math.isfinite(budget_s) or budget_s <= 0:
        raise UserError(f"--budget must be a positive number of seconds, got {budget_s!r}")
    t_enter = time.perf_counter()
    t_start = t_enter - (max(0.0, time.time() - started_at) if started_at is not None else 0.0)
    deadline = t_start + budget_s - min(RESERVE_S, RESERVE_SHARE * budget_s)
    dev = prec.resolve_device(device)
    if isinstance(precisions, str):
        precisions = prec.parse_precisions(precisions)
    requested = [prec.check_precision(p) for p in (precisions or default_precisions(dev))]
    info = describe_device(dev)
    available, unavailable = split_available(requested, dev, info)
    errors: dict[str, str] = {}
    _emit(progress, 0.0, f"preparing {workload.name} on {info['name']}")

    try:
        batches = [workload.batch(dev, seed=seed + i) for i in range(N_BATCHES)]
    except Exception as exc:  # noqa: BLE001 - a spec whose batches cannot be made is the user's input
        raise UserError(f"could not make a batch for {workload.name}: {type(exc).__name__}: {exc}") from None

    # ---- build and warm up each precision on its own (its peak memory is measured here)
    runners: dict[str, _Runner] = {}
    skipped: dict[str, str] = {}
    costs = StepCosts(workload.flops_per_step, dev)
    start = SeededStart(workload, seed)
    warmup_steps = COMPILE_WARMUP_STEPS if compile else WARMUP_STEPS
    for i, p in enumerate(available):
        _emit(progress, 0.3 * i / max(1, len(available)), f"warming up {p}" + (" (compiling)" if compile else ""))
        why = _no_room_for(p, costs, deadline, budget_s) if runners else None  # the first one always runs
        if why:
            skipped[p] = why
            continue
        try:
            runners[p], _ = _prepare(workload, p, dev, start, compile, batches, warmup_steps,
                                     budget_s * WARMUP_SHARE / max(1, len(available)), deadline,
                                     CHEAP_SHARE * budget_s, last=i == len(available) - 1)
        except Exception as exc:  # noqa: BLE001 - one precision failing must not hide the others
            errors[p] = _error_text(exc, compile)
        if p in errors:
            release(dev)  # outside the except block: its traceback no longer pins the failed model
        elif p in runners and runners[p].warmup_seconds:
            costs.record(p, runners[p].warmup_seconds[-1])
    spent = _warmup_spent(runners.values(), t_enter - t_start)

    warmup_s = time.perf_counter() - t_start

    # ---- interleaved timing rounds (a precision whose one step used its share sits them out)
    timed = {p: r for p, r in runners.items() if not r.too_slow}
    samples, stop_reason, rounds, orders = _timed_rounds(timed, batches, dev, t_start, budget_s, errors, progress,
                                                         seed=seed, deadline=deadline)
    if timed and not rounds:  # the budget ended before one round could: each is timed from its warm-up
        for r in timed.values():
            r.too_slow, r.no_rounds = True, True
    for p in [p for p in runners if p in errors]:
        del runners[p]
    for p, r in runners.items():
        if r.too_slow:  # the first step (one-time costs) only when it is the only one
            samples[p] = [x * 1000.0 for x in (r.warmup_seconds[1:] or r.warmup_seconds)]
    if runners and not timed:
        stop_reason = "every precision was too slow for the budget: timed from one warm-up step each"
    spent["rounds"] = time.perf_counter() - t_start - warmup_s

    first = next(iter(runners.values()), None)
    misaligned, forward_flops = _alignment_notes(workload, dev, first.model if first else None) if first else ([], None)
    flops = workload.flops_per_step
    flops_method = "workload" if flops else None
    if flops is None and forward_flops:
        flops, flops_method = 3.0 * forward_flops, "estimated: 3 x forward FLOPs (torch flop counter)"

    paired = {p: ps.to_dict() for p, ps in paired_speedups(
        {p: samples[p] for p in runners if not runners[p].too_slow and p in samples}, seed=seed).items()}
    results = _results(runners, samples, workload, info, flops, paired)
    spec = {
        **dict(workload.summary or {}),  # the loader's description first: measured facts win
        "name": workload.name, "batch_size": workload.batch_size, "seq_len": workload.seq_len,
        "flops_per_step": flops, "flops_method": flops_method,
        "parameters": first.parameter_count() if first else None,
        "loss_weight": workload.loss_weight,
    }
    fp32_share = results.get("fp32", {}).get("peak_share")
    verdict = make_verdict(
        {p: r["median_ms"] for p, r in results.items()},
        device_type=dev.type, device_name=info.get("name"), cpu_features=info.get("cpu_features"),
        tensor_cores=info.get("tensor_cores") if dev.type == "cuda" else None,
        bf16_native=info.get("bf16_native"), flops_per_step=flops, batch_size=workload.batch_size,
        seq_len=workload.seq_len, fp32_peak_share=fp32_share, misaligned=misaligned,
        loss_rel_diff={p: r.get("loss_rel_diff_vs_fp32") for p, r in results.items()}, compiled=compile,
        failed=tuple(errors),
        spreads={p: r["spread"] for p, r in results.items() if r.get("timed_from") != "warm-up"},
        paired=paired, native={p: r["native"] for p, r in results.items()},
        warmup_only={p: r["samples"] for p, r in results.items() if r.get("timed_from") == "warm-up"},
        first_step_only=[p for p, r in results.items() if r.get("first_step_only")],
    )
    verdict.reasons += [f"{p} was not timed: {why}" for p, why in skipped.items()]
    elapsed = time.perf_counter() - t_start  # the whole check: the alignment note and verdict included
    spent["other"] = max(0.0, elapsed - sum(spent.values()))
    spent = {k: round(v, 3) for k, v in spent.items()}
    if verdict.level == "inconclusive" and rounds < MIN_SAMPLES:
        verdict.reasons.append("where the budget went: " + describe_spent(spent))
    for p in list(runners):
        del runners[p]
    release(dev)
    _emit(progress, 1.0, verdict.recommendation)
    # NaN/inf (a diverged loss, a zero-time step) become null: there, they only mean "no number".
    return jsonable({
        "device": info,
        "spec": spec,
        "settings": {
            "precisions": requested, "budget_s": budget_s, "compile": bool(compile), "seed": seed,
            "warmup_steps": warmup_steps, "target_spread": TARGET_SPREAD, "min_samples": MIN_SAMPLES,
            "rounds": rounds, "stopped_because": stop_reason, "warmup_s": round(warmup_s, 3),
            "round_order": "shuffled per round (seeded)", "first_round_orders": orders[:5],
            "elapsed_s": round(elapsed, 3), "started_at_counted": started_at is not None,
            "budget_exceeded_s": round(elapsed - budget_s, 3) if elapsed > budget_s * 1.05 else None,
            "time_spent_s": spent,
            "timer": "cuda events" if dev.type == "cuda" else "perf_counter after synchronize",
        },
        "results": results,
        "unavailable": unavailable,
        "skipped": skipped,
        "errors": errors,
        "verdict": verdict.to_dict(),
        "findings": [f.to_dict() for f in verdict.findings],
    }, nonfinite="null")


def speedup_source(source, allow_exec: bool = False, **kwargs: Any) -> dict[str, Any]:
    """`run_speedup` on a `SpecSource`: in-process for YAML/presets, in a time-limited child
    process for an (allowed) Python file. The child cannot call back, so `progress` is dropped there."""
    from ..spec import run_with_workload

    budget = kwargs.get("budget_s", DEFAULT_BUDGET_S)
    kwargs.setdefault("started_at", time.time())  # building the model is inside the budget
    if getattr(source, "kind", None) == "python":
        kwargs.pop("progress", None)
    # compiling and building models come on top of the budget; beyond this the child is stuck
    timeout = 3 * float(budget) + (600 if kwargs.get("compile") else 120)
    return run_with_workload(source, run_speedup, allow_exec=allow_exec, timeout_s=timeout, **kwargs)


def _warmup_spent(runners, start_up_s: float) -> dict[str, float]:
    """Seconds of the budget spent before the rounds, by kind: what an inconclusive verdict
    points to (on a GPU the first step of each precision pays seconds of kernel loading)."""
    runners = list(runners)
    return {
        "start_up": start_up_s,  # before the check began: importing torch, reading the spec
        "model_builds": sum(r.build_seconds for r in runners),
        "first_steps": sum(r.warmup_seconds[0] for r in runners if r.warmup_seconds),
        "warm_up_steps": sum(sum(r.warmup_seconds[1:]) for r in runners),
    }


_SPENT_WORDS = {
    "start_up": "start-up (importing torch, reading the model)",
    "model_builds": "building the models",
    "first_steps": "first steps (with one-time costs: kernel loading, library start-up, autotuning)",
    "warm_up_steps": "more warm-up steps",
    "rounds": "interleaved rounds",
    "other": "the rest (device start-up, batches, memory release, alignment note, verdict)",
}


def describe_spent(spent: dict[str, float]) -> str:
    """'start-up (...) 4.1 s, building the models 1.0 s, ...' for the parts that took time."""
    parts = [f"{_SPENT_WORDS.get(k, k)} {v:.1f} s" for k, v in spent.items() if v >= 0.05]
    return ", ".join(parts) or "nothing measurable"


def _prepare(workload, p, dev, start, compile, batches, warmup_steps, share_s, deadline=None, cheap_s=0.0,
             last=False):
    """Build, warm up and measure the memory of one precision; returns (runner, warm-up steps taken).

    The warm-up is cut short once it has eaten this precision's share of the budget (after one
    step for a very slow eager model, two with --compile), or once the next step (dearer than
    `cheap_s`) would end past `deadline`; the losses are then compared at the step count all precisions reached.
    """
    cuda = dev.type == "cuda"
    if cuda:
        prec.synchronize(dev)
        release(dev)
        base = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    runner = _Runner(workload, p, dev, start, compile, last=last)
    spent, n = 0.0, 0
    while n < warmup_steps:
        batch = batches[n % len(batches)]
        # the first step on a CPU is traced for memory: it allocates grads and optimizer state in view
        seconds = _cpu_memory_step(runner, batch) if (n == 0 and dev.type == "cpu") else runner.warm_up_step(batch)
        n += 1
        # the next step would end past the budget (and is not cheap): what ran is the warm-up
        no_room = (deadline is not None and n >= (2 if compile else 1) and seconds > cheap_s
                   and time.perf_counter() + seconds > deadline)
        if n == 1:
            # one-time costs (compiling, library init) make the first step unrepresentative; only a
            # step so slow that it alone used twice the share stops an eager warm-up here
            if not compile and seconds > 2 * share_s:
                runner.too_slow = True
                break
            if no_room:
                break
            continue
        spent += seconds
        if spent > share_s:
            # a second step that alone used the share: this precision cannot do rounds in budget
            runner.too_slow = n == 2 and not compile and seconds > share_s
            break
        if no_room:
            break
    if cuda:
        prec.synchronize(dev)
        runner.peak_memory_bytes = int(torch.cuda.max_memory_allocated(dev) - base)
        runner.memory_method = ("torch.cuda.max_memory_allocated over this precision's build and warm-up, "
                                "minus what was allocated before")
    elif dev.type != "cpu":
        runner.memory_method = f"not measured on {dev.type}"
    return runner, n


def _no_room_for(p: str, costs: StepCosts, deadline: float, budget_s: float) -> str | None:
    """Why precision `p` is not started (None: it is): its first step, predicted from the steps
    measured so far and a GEMM probe in its dtype, would end past the deadline (fp16 in PyTorch's
    CPU kernels without fp16 instructions: seconds a step, where fp32 takes a fraction)."""
    need = costs.expected(p)
    left = deadline - time.perf_counter()
    if need is None or need <= left or need <= CHEAP_SHARE * budget_s:
        return None
    return (f"one {p} step is expected to take about {need:.1f} s here, more than the {max(0.0, left):.1f} s "
            "left in the budget (raise --budget, or leave it out of --precisions)")


def _cpu_memory_step(runner: _Runner, batch) -> float:
    """A warm-up step whose CPU tensor memory is traced; sets the runner's peak memory."""
    # grads are dropped first (there are none on the first step): the profiler cannot see frees
    # of blocks allocated before it started, so they would be counted twice
    runner.optimizer.zero_grad(set_to_none=True)
    steady = _tensor_bytes(list(runner.model.parameters()), runner.optimizer.state_dict()["state"])
    took: list[float] = []
    try:
        extra = _profiled_step_peak(lambda: took.append(runner.warm_up_step(batch)))
    except Exception as exc:  # noqa: BLE001 - memory is a nice-to-have on CPU; the step itself is not
        if took:
            runner.memory_method = f"not measured on CPU: the PyTorch profiler failed ({type(exc).__name__})"
            return took[0]
        raise
    runner.peak_memory_bytes = int(steady + extra)
    runner.memory_method = ("CPU tensor memory: parameters and optimizer state plus the peak of live tensors "
                            "during one training step, traced by the PyTorch profiler (not the process RSS)")
    return took[0]


def _timed_rounds(runners, batches, dev, t_start, budget_s, errors, progress, seed: int = 0, deadline=None):
    """Rounds of one step per precision, each round in a new seeded random order (B A C, C B A,
    ...), until every spread is small, MAX_SAMPLES, or the budget: no round starts that is
    expected (from the last round, or the warm-up's last steps) to end past `deadline`."""
    samples: dict[str, list[float]] = {p: [] for p in runners}
    timers = {p: StepTimer(dev) for p in runners}
    deadline = t_start + budget_s if deadline is None else deadline
    rounds, stop_reason = 0, "no precision could be measured" if not runners else None
    first_round_s = sum((getattr(r, "warmup_seconds", None) or [0.0])[-1] for r in runners.values())
    if runners and time.perf_counter() + first_round_s > deadline and first_round_s > CHEAP_SHARE * budget_s:
        return samples, "budget", 0, []
    last_emit = 0.0
    rng = random.Random(seed)
    orders: list[list[str]] = []
    recent_rounds: list[float] = []
    while runners:
        round_start = time.perf_counter()
        batch = batches[rounds % len(batches)]
        order = list(runners)
        rng.shuffle(order)
        orders.append(order)
        for p in order:
            try:
                timers[p].time(lambda r=runners[p]: r.step(batch))
                samples[p].extend(timers[p].collect())
            except Exception as exc:  # noqa: BLE001
                errors[p] = _error_text(exc, False)
            if p in errors:
                del runners[p], samples[p]
                release(dev)
        rounds += 1
        if not runners:
            stop_reason = "every precision failed"
            break
        now = time.perf_counter()
        spreads = {p: summarize(s).spread for p, s in samples.items()}
        worst = max(spreads.values())
        if now - last_emit >= PROGRESS_EVERY_S or rounds == 1:  # callers may write each call to a file
            last_emit = now
            _emit(progress, 0.3 + 0.7 * min(1.0, (now - t_start) / budget_s),
                  f"round {rounds}: " + ", ".join(f"{p} {summarize(s).median:.2f} ms" for p, s in samples.items())
                  + f" (spread {worst:.1%})")
        if rounds >= MAX_SAMPLES:
            stop_reason = "max_samples"
            break
        if rounds >= MIN_SAMPLES and worst < TARGET_SPREAD:
            stop_reason = "spread"
            break
        recent_rounds.append(now - round_start)
        # the slowest of the last few rounds predicts the next: on a busy host one round can take
        # half as long again as the one before, and a round is never cut short once started
        round_s = max(recent_rounds[-ROUNDS_FOR_PREDICTION:])
        if now + round_s > deadline and (rounds >= MIN_ROUNDS or round_s > CHEAP_SHARE * budget_s):
            stop_reason = "budget"
            break
    return samples, stop_reason, rounds, orders


def _first_step_only(runner) -> bool:
    """Its only figure is its first step, which pays one-time costs (CUDA kernel loading, library
    start-up, autotuning): on a GPU often seconds for a step that then takes ms."""
    return runner.too_slow and len(runner.warmup_seconds) == 1


def _results(runners, samples, workload: Workload, info, flops, paired=None) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    base = samples.get("fp32")
    base_med = summarize(base).median if base else None
    if "fp32" in runners and _first_step_only(runners["fp32"]):
        base_med = None  # one cold step: a ratio over it measures the one-time costs (make_verdict says so)
    tf32 = samples.get("tf32")
    tf32_med = summarize(tf32).median if tf32 and not _first_step_only(runners["tf32"]) else None
    fp32_losses = runners["fp32"].losses if "fp32" in runners else None
    # warm-ups cut short by the budget may differ in length: compare losses after the same steps
    common = min((len(r.losses) for r in runners.values()), default=0)
    for p, runner in runners.items():
        s = samples[p]
        summ = summarize(s)
        seconds = summ.median / 1000.0
        r: dict[str, Any] = {
            "median_ms": summ.median, "q1_ms": summ.q1, "q3_ms": summ.q3, "iqr_ms": summ.iqr,
            "spread": summ.spread, "samples": len(s), "samples_ms": s,
            "throughput": workload.items_per_step / seconds if seconds > 0 else None,
            "throughput_unit": workload.samples_unit,
            "peak_memory_bytes": runner.peak_memory_bytes, "peak_memory_method": runner.memory_method,
            "speedup_vs_fp32": base_med / summ.median if base_med else None,
            "speedup_vs_fp32_medians": base_med / summ.median if base_med else None,
            "speedup_vs_fp32_paired": None,
            "speedup_vs_fp32_iqr": None,
            "speedup_vs_fp32_ci": None,
            "low_quantile_ms": _low_quantile(s),
            "final_loss": runner.losses[common - 1] if common else None,
            "loss_after_steps": common,
            "losses": runner.losses,
            "warmup_steps": len(runner.losses),
            "timed_from": "warm-up" if runner.too_slow else "interleaved rounds",
            "first_step_only": _first_step_only(runner),
            "loss_rel_diff_vs_fp32": None,
            "native": _native(p, info),
        }
        if base and p != "fp32" and not runner.too_slow and not runners["fp32"].too_slow:
            ratios = summarize([b / x for b, x in zip(base, s) if x > 0])  # paired by round
            r["speedup_vs_fp32_paired"] = ratios.median
            r["speedup_vs_fp32_iqr"] = [ratios.q1, ratios.q3]
        if (paired or {}).get(p):
            r["speedup_vs_fp32"] = paired[p]["median"]  # the robust figure: median of paired ratios
            r["speedup_vs_fp32_ci"] = paired[p]["ci"]
            r["speedup_vs_fp32_low_quantile"] = paired[p]["low_quantile_ratio"]
        if tf32_med:
            r["speedup_vs_tf32"] = tf32_med / summ.median
        if fp32_losses and runner.losses:
            a, b = fp32_losses[common - 1], runner.losses[common - 1]
            if a is not None and b is not None and a != 0:
                r["loss_rel_diff_vs_fp32"] = abs(b - a) / abs(a)
        if p == "fp16":
            r["skipped_steps"] = runner.skipped_steps
        first_only = " (first-step costs included)" if r["first_step_only"] else ""
        if runner.no_rounds:
            r["note"] = "the budget ended before the interleaved rounds: timed from its warm-up" + first_only
        elif runner.too_slow:
            r["note"] = (f"one step took {s[-1] / 1000:.1f} s, more than this precision's share of the "
                         "budget: timed from its warm-up" + first_only)
        if flops:
            achieved = flops / seconds / 1e12
            peak = hardware.peak_tflops(info.get("name") or "", p) if info["type"] == "cuda" else None
            r.update(achieved_tflops=achieved, peak_tflops=peak, peak_share=achieved / peak if peak else None)
            if peak is None:
                r["peak_note"] = ("no peak figure for a CPU" if info["type"] != "cuda"
                                  else f"no {p} peak figure for {info.get('name')} in data/gpus.yaml")
        out[p] = r
    return out


def _low_quantile(samples: list[float]) -> float | None:
    from .speedup_stats import LOW_QUANTILE, quantile

    return quantile(samples, LOW_QUANTILE) if samples else None


def _native(p: str, info: dict[str, Any]) -> bool:
    """Whether the device has hardware for this precision's math (else it is emulated/converted)."""
    if p == "fp32":
        return True
    if p == "tf32":
        return bool(info.get("tf32"))
    if info["type"] == "cuda":
        return bool(info.get("bf16_native")) if p == "bf16" else bool(info.get("tensor_cores"))
    return bool(info.get("bf16_native" if p == "bf16" else "fp16_native"))


# ---------------------------------------------------------------- text for people


def _rate(x: float | None) -> str:
    if x is None:
        return "n/a"
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= div:
            return f"{x / div:.2f}{suffix}"
    return f"{x:.1f}"


def format_text(result: dict[str, Any]) -> str:
    """The report for a terminal: device, a table per precision, the verdict and its reasons."""
    dev, spec, st = result["device"], result["spec"], result["settings"]
    lines = [f"Speedup check: {spec['name']} (batch {spec['batch_size']}"
             + (f" x {spec['seq_len']} tokens" if spec.get("seq_len") else "") + ")"
             + (" with torch.compile" if st["compile"] else ""),
             f"device: {dev.get('summary', dev.get('name'))}"]
    if dev.get("note"):
        lines.append(dev["note"])
    lines.append(f"{st['rounds']} interleaved rounds in {st['elapsed_s']:.1f} s (budget {st['budget_s']:g} s; "
                 f"stopped: {st['stopped_because']}); up to {st['warmup_steps']} warm-up steps discarded; "
                 f"timer: {st['timer']}")
    if st.get("time_spent_s"):
        lines.append("time spent: " + describe_spent(st["time_spent_s"]))
    if st.get("budget_exceeded_s"):
        lines.append(f"note: the budget was exceeded by {st['budget_exceeded_s']:.1f} s "
                     "(a step that had started is always finished)")
    results = result["results"]
    unit = next((r["throughput_unit"] for r in results.values()), "samples/s")
    has_tflops = any(r.get("achieved_tflops") is not None for r in results.values())
    head = (f"{'precision':<10}{'median ms':>11}{'IQR ms':>9}{'spread':>8}{unit:>12}{'peak mem':>12}{'vs fp32':>9}"
            f"{'95% interval':>15}")
    head += f"{'TFLOP/s':>9}{'of peak':>8}" if has_tflops else ""
    head += f"  {'final loss (vs fp32)'}"
    lines += ["", head]
    for p, r in results.items():
        vs = f"{r['speedup_vs_fp32']:.2f}x" if r.get("speedup_vs_fp32") else "n/a"
        row = (f"{p + ('' if r.get('native', True) else '*'):<10}{r['median_ms']:>11.3f}{r['iqr_ms']:>9.3f}"
               f"{r['spread']:>8.1%}{_rate(r['throughput']):>12}{format_bytes(r['peak_memory_bytes']):>12}{vs:>9}")
        ci = r.get("speedup_vs_fp32_ci")
        row += f"{f'{ci[0]:.2f}-{ci[1]:.2f}x':>15}" if ci and None not in ci else f"{'':>15}"
        if has_tflops:
            share = f"{r['peak_share']:.0%}" if r.get("peak_share") is not None else "n/a"
            row += f"{r['achieved_tflops']:>9.3g}{share:>8}"
        loss = r.get("final_loss")
        diff = r.get("loss_rel_diff_vs_fp32")
        row += f"  {loss:.4g}" if loss is not None else "  non-finite"
        row += f" ({diff:.2%})" if diff is not None and p != "fp32" else ""
        if p == "fp16" and r.get("skipped_steps"):
            row += f", {r['skipped_steps']} skipped warm-up step(s)"
        lines.append(row)
    if any(not r.get("native", True) for r in results.values()):
        lines.append("* no native hardware for this precision here: converted/emulated")
    for p, r in results.items():
        if r.get("note"):
            lines.append(f"{p}: {r['note']}")
    for p, why in result.get("unavailable", {}).items():
        lines.append(f"{p}: unavailable: {why}")
    for p, why in (result.get("skipped") or {}).items():
        lines.append(f"{p}: not timed: {why}")
    for p, why in result.get("errors", {}).items():
        lines.append(f"{p}: error: {why}")
    mem = next((r["peak_memory_method"] for r in results.values() if r.get("peak_memory_method")), None)
    if mem:
        lines.append(f"peak memory: {mem}")
    v = result["verdict"]
    lines += ["", f"Verdict: {v['recommendation']}"]
    if v.get("speedup_ci"):
        lines.append(f"  speedup: median of {st['rounds']} paired per-round ratios (rounds in shuffled order), "
                     f"95% interval {v['speedup_ci'][0]:.2f}x to {v['speedup_ci'][1]:.2f}x")
    for reason in v.get("reasons", []):
        lines.append(f"  - {reason}")
    for f in result.get("findings", []):
        lines.append(f"{f['rule']} {f['name']} ({f['severity']}): {f['message']}")
    return "\n".join(lines) + "\n"
