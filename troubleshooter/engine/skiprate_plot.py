"""The loss-scale trajectory of the skip-rate probe as a figure for the app and reports.

Log-scale y because the scale moves by factors of two; skipped steps are marked so "the
scale kept halving" and "it settled after calibration" read at a glance.
"""
from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on a GPU host or in a worker process
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402


def _num(x: Any) -> float | None:
    return x if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def plot_skiprate(skiprate: dict[str, Any]) -> Figure:
    """Figure of the loss scale after every step (log y), skipped steps as red crosses, the
    calibration phase shaded. `skiprate` is the `skiprate` section of the check JSON."""
    steps = skiprate.get("steps") or []
    fig = Figure(figsize=(7.5, 3.8), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    summary = skiprate.get("summary") or {}
    rec = skiprate.get("recommendation") or {}
    if not steps:
        ax.text(0.5, 0.5, "no steps measured", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return fig
    x = [s["step"] + 1 for s in steps]
    init = _num(skiprate.get("init_scale")) or _num(steps[0].get("scale_before")) or 65536.0
    xs = [0] + x
    ys = [init] + [max(_num(s["scale_after"]) or 0.0, 1e-30) for s in steps]
    ax.step(xs, ys, where="post", color="#1f77b4", linewidth=2, label="loss scale after step")
    skipped = [(s["step"] + 1, max(_num(s["scale_after"]) or 0.0, 1e-30)) for s in steps if s["skipped"]]
    if skipped:
        ax.scatter(*zip(*skipped), marker="x", s=50, color="#d62728", zorder=3,
                   label=f"skipped step ({len(skipped)})")
    calib = [s for s in steps if s.get("phase") == "calibration"]
    if calib:
        ax.axvspan(0, calib[-1]["step"] + 1, color="#ff7f0e", alpha=0.15,
                   label=f"calibration ({len(calib)} step{'s' if len(calib) != 1 else ''})")
    if min(ys) < 1:
        ax.axhline(1.0, color="gray", linestyle="--", linewidth=1, label="scale 1 (no scaling)")
    ax.set_yscale("log", base=2)
    ax.set_xlim(0, len(steps) + 0.5)
    ax.set_xlabel("training step")
    ax.set_ylabel("GradScaler scale (log2)")
    rate = summary.get("skip_rate_after_calibration")
    rate_txt = f"{rate:.0%}" if isinstance(rate, (int, float)) else "n/a"
    title = (f"fp16 loss scale: {summary.get('skipped', len(skipped))}/{len(steps)} steps skipped, "
             f"{rate_txt} after calibration")
    if rec.get("action"):
        title += f"\nrecommendation: {str(rec['action']).replace('_', ' ')}"
        if _num(rec.get("init_scale")):
            title += f" (init_scale={rec['init_scale']:g})"
    ax.set_title(title, fontsize=11)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper right", fontsize=8, framealpha=0.85)
    return fig
