"""Sections `nan_overhead`, `recipe` and `recipe_compile`: what nanhunt costs next to anomaly
mode (bench/nan_overhead.py), and the generated training loops' throughput and MFU against
strict fp32 (bench/recipe_throughput.py)."""
from __future__ import annotations

import math

NAN_RATIO_TARGET = 0.2  # nanhunt adds at most a fifth of what detect_anomaly adds
NAN_PLAIN_TARGET = 0.15  # ... and at most 15% over plain steps
BF16_VS_FP32_TARGET = 8.0
FP16_VS_BF16_TARGET = 0.05
MFU_TARGET = 0.40
NAN_MODES = ("plain", "nanhunt", "detect_anomaly")


def run_nan_overhead(ctx, res) -> None:
    import nan_overhead

    s = ctx.sizes
    rows = []
    for preset, precision in s.nan_cases:
        with res.step(f"{preset} in {precision}"):
            r = nan_overhead.run(preset, ctx.device, precision, s.nan_repeats, s.nan_steps, 1, NAN_MODES)
            res.data.setdefault("results", {})[f"{preset} {precision}"] = r
            med, plain = r["median_step_s"], r["median_step_s"]["plain"]
            rr = r["round_ratios"]
            rows.append([preset, precision, plain * 1e3, (med["nanhunt"] - plain) * 1e3,
                         f"{r['nanhunt_over_plain']:+.0%}", (med["detect_anomaly"] - plain) * 1e3, r["ratio"],
                         f"{rr[0]:.2f} .. {rr[-1]:.2f}" if rr else "n/a"])
            judged = math.isfinite(r["ratio"])  # NaN: anomaly mode added no time in this (noisy) run
            res.target(f"{preset}: nanhunt's added time / detect_anomaly's", f"<= {NAN_RATIO_TARGET}",
                       round(r["ratio"], 3) if judged else "n/a (detect_anomaly added no time)",
                       r["ratio"] <= NAN_RATIO_TARGET if judged else None)
            res.target(f"{preset}: nanhunt over plain steps", f"<= {NAN_PLAIN_TARGET:.0%}",
                       f"{r['nanhunt_over_plain']:+.1%}", r["nanhunt_over_plain"] <= NAN_PLAIN_TARGET)
    if rows:
        res.table("NaN hunt overhead per training step (modes interleaved, medians)",
                  ["model", "precision", "plain ms", "nanhunt added ms", "nanhunt added", "detect_anomaly added ms",
                   "ratio (nanhunt / anomaly added)", "per-round ratios"], rows,
                  note=f"{s.nan_repeats} rounds x {s.nan_steps} steps per mode; "
                       + ("wall time around synchronised steps" if ctx.device.startswith("cuda")
                          else "process CPU time"))


def _recipe_rows(result: dict, base_fp32: float | None = None) -> list[list]:
    rows = []
    for r in result["rows"]:
        vs = r["vs_fp32"] or (r["tokens_per_s"] / base_fp32 if base_fp32 and r["tokens_per_s"] else None)
        rows.append([r["precision"], r["tokens_per_s"], vs, r["mfu"], r.get("seconds"), r["error"]])
    return rows


def _measure(ctx, precisions, compile_: bool) -> dict:
    import recipe_throughput

    s = ctx.sizes
    env = {"TORCHDYNAMO_DISABLE": "1"} if compile_ and ctx.dry_run else None
    # the dry run starts its processes at once (its rates mean nothing); a GPU run, one after another
    return recipe_throughput.measure(ctx.device, precisions, s.recipe_steps, s.recipe_batch, compile_,
                                     s.recipe_sizes, log_every=10, timeout_s=s.recipe_timeout_s, env=env,
                                     parallel=ctx.dry_run)


def _failed(result: dict) -> None:
    errors = [f"{r['precision']}: {r['error']}" for r in result["rows"] if r["error"]]
    if errors:
        raise RuntimeError("; ".join(errors))


def _title(result: dict, compiled: bool) -> str:
    sizes = result["sizes"]
    n = result["parameters"]
    count = f"{n / 1e6:.0f}M" if n >= 1e6 else f"{n:,}"
    return (f"Generated recipe{' with torch.compile' if compiled else ''}: {count}-parameter "
            f"transformer ({sizes['N_LAYER']} layers, {sizes['N_EMBD']} wide, {sizes['SEQ_LEN']} tokens), batch "
            f"{result['batch_size']}, {result['steps']} steps, one process per precision")


def run_recipe(ctx, res) -> None:
    with res.step(", ".join(ctx.sizes.recipe_precisions)):
        result = _measure(ctx, ctx.sizes.recipe_precisions, False)
        res.data["result"] = result
        res.table(_title(result, False), ["precision", "tokens/s", "vs fp32", "MFU", "seconds", "error"],
                  _recipe_rows(result), note="fp32 runs with TF32 off (strict fp32); tokens/s is the median of the "
                                             "10-step windows after the first")
        by = {r["precision"]: r for r in result["rows"]}
        bf16, fp16 = by.get("bf16", {}), by.get("fp16", {})
        if bf16.get("vs_fp32"):
            res.target("bf16 recipe vs strict fp32", f">= {BF16_VS_FP32_TARGET:g}x", f"{bf16['vs_fp32']:.2f}x",
                       bf16["vs_fp32"] >= BF16_VS_FP32_TARGET)
        if bf16.get("tokens_per_s") and fp16.get("tokens_per_s"):
            gap = abs(fp16["tokens_per_s"] / bf16["tokens_per_s"] - 1)
            res.target("fp16 recipe vs bf16", f"within {FP16_VS_BF16_TARGET:.0%}", f"{gap:.1%}",
                       gap <= FP16_VS_BF16_TARGET)
        _failed(result)


def run_recipe_compiled(ctx, res) -> None:
    if ctx.dry_run:
        res.note("cpu dry run: the recipes run with TORCHDYNAMO_DISABLE=1 (torch.compile called, models eager)")
    base = next((r["tokens_per_s"] for r in (ctx.data_of("recipe").get("result") or {}).get("rows", [])
                 if r["precision"] == "fp32"), None)
    precisions = ctx.sizes.compile_recipe_precisions
    with res.step(", ".join(precisions) + " with torch.compile"):
        result = _measure(ctx, precisions, True)
        res.data["result"] = result
        res.table(_title(result, True), ["precision", "tokens/s", "vs fp32 (eager, section recipe)", "MFU", "seconds",
                                         "error"], _recipe_rows(result, base))
        for r in result["rows"]:
            if r["precision"] == "bf16":
                res.target("bf16 recipe MFU with torch.compile", f">= {MFU_TARGET:.0%}",
                           None if r["mfu"] is None else f"{r['mfu']:.1%}",
                           None if r["mfu"] is None else r["mfu"] >= MFU_TARGET)
        _failed(result)
