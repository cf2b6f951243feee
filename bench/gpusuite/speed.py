"""Sections `matmul`, `speedup` and `speedup_compile`: the bf16 matmul ceiling, and the speedup
check on GPT-2 small and the CNN run twice each (repeatability), eager and with torch.compile,
held against torch.utils.benchmark. Built on bench/speedup_repeatability.py and
bench/speedup_vs_utils_benchmark.py."""
from __future__ import annotations

import contextlib

REPEAT_TARGET = 0.05  # two runs of the speedup check within 5% of each other
CEILING_TARGET = 0.90  # the default-size bf16 matmul reaches 90% of the best size measured
DEFAULT_MATMUL_N = 8192  # what bench/speedup_repeatability.py times


def run_matmul(ctx, res) -> None:
    from speedup_repeatability import matmul_rate

    sizes, iters = ctx.sizes.matmul_sizes, ctx.sizes.matmul_iters
    mid = sizes[len(sizes) // 2]
    rates: dict[tuple[str, int], dict] = {}
    for n in sizes:
        with res.step(f"bf16 {n}^3"):
            rates[("bf16", n)] = matmul_rate(ctx.device, "bf16", n, iters)
    for p in ("fp16", "tf32", "fp32"):
        with res.step(f"{p} {mid}^3"):
            rates[(p, mid)] = matmul_rate(ctx.device, p, mid, iters)
    _release(ctx.device)
    fp32 = (rates.get(("fp32", mid)) or {}).get("achieved_tflops")
    rows = [[p, n, r["ms"] / r["iters"], r["achieved_tflops"], r["peak_tflops"], r["share_of_peak"],
             r["achieved_tflops"] / fp32 if fp32 and n == mid else None] for (p, n), r in rates.items()]
    res.table("Matmul rates (n x n x n, after a warm-up; fp32 with TF32 off)",
              ["dtype", "n", "ms per matmul", "TFLOP/s", "peak TFLOP/s (gpus.yaml)", "share of peak",
               f"vs fp32 at n={mid}"], rows)
    bf16 = {n: r["achieved_tflops"] for (p, n), r in rates.items() if p == "bf16"}
    if bf16:
        best = max(bf16.values())
        res.data.update(ceiling_tflops=best, rates={f"{p}@{n}": r for (p, n), r in rates.items()})
        default_n = DEFAULT_MATMUL_N if DEFAULT_MATMUL_N in bf16 else mid
        share = bf16.get(default_n, 0.0) / best if best else None
        res.target(f"bf16 matmul at n={default_n} (the bench's ceiling) vs the best size measured",
                   f">= {CEILING_TARGET:.0%}", None if share is None else f"{share:.1%}",
                   None if share is None else share >= CEILING_TARGET)


def _release(device: str) -> None:
    from troubleshooter.engine.training_step import release

    release(device)


@contextlib.contextmanager
def dynamo_disabled(on: bool):
    """The dry run calls torch.compile as the GPU run does, with TorchDynamo off: inductor on a
    2-core CPU would spend minutes compiling tiny models."""
    if not on:
        yield
        return
    import torch._dynamo

    with torch._dynamo.config.patch(disable=True):
        yield


_SPENT_SHORT = {"start_up": "start-up", "model_builds": "builds", "first_steps": "first steps",
                "warm_up_steps": "warm-up", "rounds": "rounds", "other": "other"}


def _spent_text(spent: dict | None) -> str:
    """Where the run's budget went (`settings.time_spent_s`), compact for a table cell."""
    if not spent:
        return "-"
    return ", ".join(f"{_SPENT_SHORT.get(k, k)} {v:.1f}" for k, v in spent.items())


def _slim(run: dict) -> dict:
    """A speedup result without its per-sample lists (kept: medians, spreads, intervals, verdict)."""
    results = {p: {k: v for k, v in r.items() if k not in ("samples_ms", "losses")} for p, r in run["results"].items()}
    return {**run, "results": results}


def _rows(label: str, i: int, run: dict, ceiling: float | None) -> list[list]:
    rows = []
    for p, r in run["results"].items():
        tf = r.get("achieved_tflops")
        ci = r.get("speedup_vs_fp32_ci")
        rows.append([label, i, p + ("" if r.get("native", True) else " (emulated)"), r["median_ms"], r["spread"],
                     r.get("throughput"), r.get("throughput_unit"),
                     (r.get("peak_memory_bytes") or 0) / 2**20 if r.get("peak_memory_bytes") is not None else None,
                     tf, r.get("peak_share"), tf / ceiling if tf and ceiling else None,
                     r.get("speedup_vs_fp32") if p != "fp32" else None,
                     f"{ci[0]:.2f}-{ci[1]:.2f}" if ci and None not in ci else None])
    for p, why in run.get("errors", {}).items():
        rows.append([label, i, p, f"error: {why}", *[None] * 9])
    return rows


def run_speedup(ctx, res, compile_: bool = False) -> None:
    from speedup_repeatability import compare, run_twice
    from speedup_vs_utils_benchmark import judge, reference

    from troubleshooter.spec import SpecSource, load_workload

    precisions = ctx.sizes.compile_precisions if compile_ else ctx.sizes.speedup_precisions
    ceiling = ctx.data_of("matmul").get("ceiling_tflops")
    per_run, repeat, verdicts, refs = [], [], [], []
    models = ctx.sizes.compile_models if compile_ else ctx.sizes.speedup_models
    for label, preset, budget in models:
        runs = None
        with res.step(f"{label}: speedup twice"):
            workload = load_workload(SpecSource.preset(preset))
            with dynamo_disabled(compile_ and ctx.dry_run):
                runs = run_twice(workload, ctx.device, precisions, budget, compile_)
            res.data.setdefault("runs", {})[label] = [_slim(r) for r in runs]
            for i, run in enumerate(runs, 1):
                per_run += _rows(label, i, run, ceiling)
                v = run["verdict"]
                verdicts.append([label, i, v["level"], v.get("best_precision"), v.get("speedup"),
                                 run["settings"]["rounds"], run["settings"]["elapsed_s"],
                                 _spent_text(run["settings"].get("time_spent_s")), v["recommendation"]])
            for p, c in compare(*runs).items():  # a precision left untimed is a row with the reason
                ok = None if c["not_comparable"] else c["rel_diff"] <= REPEAT_TARGET
                if c["missing"]:
                    diff = f"not compared: {c['not_comparable']}"
                else:
                    diff = f"{c['rel_diff']:.1%}" + (f" ({c['not_comparable']})" if c["not_comparable"] else "")
                repeat.append([label, p, c["run1"], c["run2"], diff, "n/a" if ok is None else ok])
                res.target(f"{label} {p}: two runs agree", f"within {REPEAT_TARGET:.0%}", diff, ok)
        if runs and not compile_ and preset == ctx.sizes.reference_model:
            with res.step(f"{label}: against torch.utils.benchmark"):
                # what our run was asked to time, not only what it timed: on a busy host the dry run's
                # 0.2 s budget may leave bf16 untimed, and a reference of fp32 alone judges nothing
                asked = [*runs[0]["results"], *(p for p in runs[0].get("skipped", {}) if p not in runs[0]["results"])]
                ref = reference(workload, asked, ctx.sizes.reference_min_run_s, ctx.device)
                j = judge(runs[0], ref)
                res.data.setdefault("reference", {})[label] = {"reference": ref, "judged": j}
                refs.append([label, f"{j['level']} ({j['best']}, {_x(j['speedup'])})", j["ref_level"],
                             f"{j['ref_best']}, {_x(j['ref_speedup'])}", f"{j['ref_spread']:.0%}", j["outcome"]])
                agrees = True if j["outcome"] == "ok: agrees" else (False if j["outcome"].startswith("FAIL") else None)
                res.target(f"{label}: speedup verdict vs torch.utils.benchmark", "agrees", j["outcome"], agrees)
        _release(ctx.device)
    if not compile_:
        _fresh_process_speedup(ctx, res)
    what = " with torch.compile" if compile_ else ""
    res.table(f"Speedup check{what}: each run's figures",
              ["model", "run", "precision", "median ms", "spread", "throughput", "unit", "peak MiB", "TFLOP/s",
               "share of peak", "share of bf16 matmul ceiling", "vs fp32", "95% interval"], per_run,
              note=None if ceiling else "bf16 matmul ceiling: not measured in this run (section matmul).")
    res.table(f"Speedup check{what}: repeatability (speedup over fp32, run 1 vs run 2)",
              ["model", "precision", "run 1", "run 2", "difference", f"within {REPEAT_TARGET:.0%}"], repeat)
    res.table(f"Speedup check{what}: verdicts", ["model", "run", "level", "best", "speedup", "rounds", "seconds",
                                                 "time spent (s)", "recommendation"], verdicts)
    if refs:
        res.table("Speedup verdict against torch.utils.benchmark (same model, its own training step)",
                  ["model", "ours: level (best, speedup)", "reference level", "reference best", "its spread",
                   "outcome"], refs)


def _fresh_process_speedup(ctx, res) -> None:
    """The speedup as a user first runs it: `python -m troubleshooter speedup` in a new process
    (importing torch, loading kernels and building the model inside its budget), timed from
    outside. The runs above share this process's loaded kernels, so they cannot show this."""
    from .runner import cli_json

    label, preset, budget = ctx.sizes.cli_speedup
    args = ["speedup", "--preset", preset, "--device", ctx.device] + ([] if budget is None else ["--budget", str(budget)])
    with res.step(f"{label}: the default speedup in a fresh process"):
        out, wall = cli_json(args)
        st, v = out["settings"], out["verdict"]
        res.data["fresh_process"] = {"wall_s": wall, "settings": st, "verdict": v}
        res.table("Speedup check: the default run in a fresh process (CLI, timed from outside)",
                  ["model", "budget s", "wall s", "elapsed s", "rounds", "stopped because", "level", "best",
                   "speedup", "time spent (s)"],
                  [[label, st["budget_s"], round(wall, 2), st["elapsed_s"], st["rounds"], st["stopped_because"],
                    v["level"], v.get("best_precision"), v.get("speedup"), _spent_text(st.get("time_spent_s"))]])
        res.target(f"{label}: the default speedup ends within its budget, from outside",
                   f"<= {st['budget_s']:g} s wall", f"{wall:.1f} s", wall <= st["budget_s"])


def _x(value) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def run_speedup_compiled(ctx, res) -> None:
    if ctx.dry_run:
        res.note("cpu dry run: torch.compile is called with TorchDynamo disabled (the models run eagerly)")
    run_speedup(ctx, res, compile_=True)


def _self_time_us(event, cuda: bool) -> float:
    """An op's own time: on the GPU (its kernels) where there is one, else on the CPU."""
    if cuda:
        return float(getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0.0))
    return float(event.self_cpu_time_total)


def _profile_rows(events, steps: int, total_us: float, cuda: bool, n: int, name_chars: int | None = None):
    """The `n` events with the most own time: name (clipped: kernel names run to hundreds of
    characters), calls, ms and share per step."""
    top = sorted(events, key=lambda e: _self_time_us(e, cuda), reverse=True)[:n]
    return [[e.key if not name_chars or len(e.key) <= name_chars else e.key[:name_chars - 1] + "…",
             e.count / steps, _self_time_us(e, cuda) / steps / 1e3, _self_time_us(e, cuda) / total_us if total_us else None]
            for e in top]


def _profiled_steps(preset: str, device: str, steps: int):
    """(per-op events, this many profiled bf16 training steps, their unprofiled wall ms per step)."""
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile

    from troubleshooter.engine import precision as prec
    from troubleshooter.engine.speedup import _quiet_native_stderr
    from troubleshooter.engine.training_step import build, training_step
    from troubleshooter.spec import SpecSource, load_workload

    dev = torch.device(device)
    workload = load_workload(SpecSource.preset(preset))
    model, opt = build(workload, dev, 0)
    scaler = prec.make_scaler("bf16", dev)
    batch = workload.batch(dev, seed=0)

    def step():
        training_step(workload, model, opt, scaler, batch, "bf16", dev)

    for _ in range(2):  # warm-up
        step()
    prec.synchronize(dev)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    prec.synchronize(dev)
    wall_ms = (time.perf_counter() - t0) / steps * 1e3
    prof = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else []))
    with _quiet_native_stderr():  # the profiler's native layer logs its start and stop there
        prof.__enter__()
    try:
        for _ in range(steps):
            step()
        prec.synchronize(dev)
    finally:
        with _quiet_native_stderr():
            prof.__exit__(None, None, None)
    return _without_annotations(prof.key_averages(), prof.events()), wall_ms


def _on_device(event) -> bool:
    """A kernel's own event (not the op that launched it): the profiler lists both, and each
    kernel's time appears under both, so a sum over all events counts it twice."""
    return getattr(getattr(event, "device_type", None), "name", "CPU") != "CPU"


def _without_annotations(averages, events) -> list:
    """The averaged events less the device-side spans of record_function ranges (e.g.
    `Optimizer.step#AdamW.step` on the H200): a span covers kernels already counted. Only the raw
    events say which are such spans; their averages do not keep the flag."""
    spans = {e.key for e in events if getattr(e, "is_user_annotation", False) and _on_device(e)}
    return [a for a in averages if not (a.key in spans and _on_device(a))]


def run_profile(ctx, res) -> None:
    """Where a bf16 training step of GPT-2 small spends its time (torch.profiler), beside the step's
    unprofiled wall time: kernel time well below the wall time means the host is the limit."""
    (label, preset), steps = ctx.sizes.profile_model, 3
    cuda = ctx.device.startswith("cuda")
    with res.step(f"{label}: bf16 steps under torch.profiler"):
        all_events, wall_ms = _profiled_steps(preset, ctx.device, steps)
        timed = [e for e in all_events if _self_time_us(e, cuda) > 0]
        ops = [e for e in timed if not _on_device(e)]  # on a GPU: each op's kernels' time, once
        kernels = [e for e in timed if _on_device(e)]
        total_us = sum(_self_time_us(e, cuda) for e in (kernels if cuda else ops))
        what = "GPU" if cuda else "CPU"
        res.table(f"{label}, bf16 training step: the 15 ops with the most {what} time",
                  ["op", "calls per step", "ms per step", "share"],
                  _profile_rows(ops, steps, total_us, cuda, 15),
                  note=f"{'kernel' if cuda else 'CPU op'} time per step {total_us / steps / 1e3:.2f} ms; the same step "
                       f"unprofiled: {wall_ms:.2f} ms wall"
                       + (f" (kernels busy {total_us / steps / 1e3 / wall_ms:.0%} of it)" if cuda else ""))
        if kernels:
            res.table(f"{label}, bf16 training step: the 8 kernels with the most GPU time",
                      ["kernel", "calls per step", "ms per step", "share"],
                      _profile_rows(kernels, steps, total_us, cuda, 8, name_chars=110))
        res.data.update(wall_ms=wall_ms, busy_ms=total_us / steps / 1e3, steps=steps)
    _release(ctx.device)
