"""The speedup plot: step time (with its spread) and peak memory per precision, side by side.

Drawn from the result dict alone (the `speedup --format json` object), so the app can redraw
a saved run. Agg backend: no display needed on a server.
"""
from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402  (after choosing the backend)

_COLORS = {"fp32": "#7f7f7f", "tf32": "#1f77b4", "fp16": "#ff7f0e", "bf16": "#2ca02c"}


def plot_speedup(result: dict[str, Any]) -> Figure:
    """Two panels: median step time with IQR error bars and 'N.NNx' speedup labels; peak memory."""
    results = result.get("results", {})
    names = list(results)
    dev = result.get("device", {})
    spec = result.get("spec", {})
    fig = Figure(figsize=(10, 4.6), dpi=110)
    ax_t, ax_m = fig.subplots(1, 2)
    device_name = dev.get("name") or dev.get("type", "?")
    kind = "CPU numbers" if dev.get("cpu_numbers") else dev.get("type", "").upper()
    compiled = " · torch.compile" if result.get("settings", {}).get("compile") else ""
    fig.suptitle(f"{spec.get('name', 'model')} on {device_name} ({kind}){compiled}", fontsize=11)

    if not names:
        for ax in (ax_t, ax_m):
            ax.text(0.5, 0.5, "no precision could be measured", ha="center", va="center")
            ax.set_axis_off()
        return fig

    colors = [_COLORS.get(n, "#9467bd") for n in names]
    med = [results[n]["median_ms"] for n in names]
    low = [max(0.0, results[n]["median_ms"] - results[n]["q1_ms"]) for n in names]
    high = [max(0.0, results[n]["q3_ms"] - results[n]["median_ms"]) for n in names]
    bars = ax_t.bar(names, med, color=colors, yerr=[low, high], capsize=6, ecolor="black")
    ax_t.set_ylabel("median step time (ms) — lower is better")
    ax_t.set_title("training step time (error bars: IQR; labels: speedup vs fp32,\n"
                   "the median of the paired per-round ratios)", fontsize=10)
    top = max(m + h for m, h in zip(med, high)) or 1.0
    for bar, n, m, h in zip(bars, names, med, high):
        ratio = results[n].get("speedup_vs_fp32")
        label = f"{ratio:.2f}x" if ratio else f"{m:.3g} ms"
        ax_t.text(bar.get_x() + bar.get_width() / 2, m + h + top * 0.02, label,
                  ha="center", va="bottom", fontsize=10, fontweight="bold")
    ax_t.set_ylim(0, top * 1.18)

    mem = [results[n].get("peak_memory_bytes") for n in names]
    if any(m is not None for m in mem):
        mib = [(m or 0) / 2**20 for m in mem]
        mbars = ax_m.bar(names, mib, color=colors)
        mtop = max(mib) or 1.0
        for bar, m, raw in zip(mbars, mib, mem):
            ax_m.text(bar.get_x() + bar.get_width() / 2, m + mtop * 0.02,
                      f"{m:.3g} MiB" if raw is not None else "n/a", ha="center", va="bottom", fontsize=9)
        ax_m.set_ylim(0, mtop * 1.18)
        ax_m.set_ylabel("peak memory (MiB)")
        ax_m.set_title("peak memory per precision", fontsize=10)
    else:
        ax_m.text(0.5, 0.5, "peak memory not measured\non this device", ha="center", va="center")
        ax_m.set_axis_off()

    verdict = result.get("verdict", {}).get("recommendation")
    if verdict:
        fig.text(0.5, 0.01, _wrap(verdict, 120), ha="center", va="bottom", fontsize=8.5)
    fig.tight_layout(rect=(0, 0.08, 1, 0.94))
    return fig


def _wrap(text: str, width: int) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width)[:2])


def save_plot(result: dict[str, Any], path: str) -> None:
    """Write the plot as a PNG; unwritable paths are the user's input (UserError), not a crash."""
    from ..errors import UserError

    fig = plot_speedup(result)
    try:
        fig.savefig(path, format="png")
    except OSError as exc:
        raise UserError(f"cannot write the plot to {path}: {exc.strerror or exc}") from None
