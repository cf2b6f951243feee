"""gpu_suite.md: the run's report as Markdown tables, ready to paste into BENCHMARKS.md.

The header names what the figures were measured on (GPU, driver, CUDA, torch, date) and a CPU
dry run says so on its first line and in every section heading, so its numbers can never be
mistaken for GPU figures.
"""
from __future__ import annotations

from typing import Any

DRY_RUN_BANNER = ("**CPU DRY RUN: tiny sizes on a CPU to prove the suite works. Not a GPU measurement: "
                  "no figure here belongs in BENCHMARKS.md.**")
STATUS_WORD = {"ok": "ok", "partial": "partly failed", "failed": "FAILED", "skipped": "skipped",
               "not run": "not run", "running": "running (did not finish: the run was stopped here)",
               "interrupted": "interrupted"}


def cell(value: Any) -> str:
    """One table cell: numbers rounded for reading, None as a dash, no stray pipes or newlines."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value != value:  # NaN
            return "-"
        a = abs(value)
        text = f"{value:.3g}" if a < 1 else (f"{value:.2f}" if a < 100 else f"{value:,.0f}")
    else:
        text = str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def table(columns: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(cell(c) for c in columns) + " |", "|" + " --- |" * len(columns)]
    out += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return out


def _environment(report: dict) -> list[str]:
    env = report.get("environment") or {}
    gpus = env.get("gpus") or []
    gpu = ", ".join(g.get("name", "?") for g in gpus) or "none (CPU)"
    rows = [
        ["GPU", gpu],
        ["driver", env.get("driver") or "-"],
        ["CUDA", f"runtime {env.get('cuda_runtime') or '-'} (torch build); "
                 f"driver supports {env.get('cuda_driver') or '-'}"],
        ["torch", env.get("torch")],
        ["Python", env.get("python")],
        ["CPU", f"{env.get('cpu') or '-'} ({env.get('cpu_count')} cores)"],
        ["date", env.get("date")],
        ["commit", env.get("commit") or "-"],
        ["command", "`" + " ".join(["python", "bench/gpu_suite.py", *report.get("argv", [])]) + "`"],
        ["packages", ", ".join(f"{k} {v or 'missing'}" for k, v in (env.get("packages") or {}).items())
         + (f" (gradio/pydantic: {env['packages_source']})" if env.get("packages_source") else "")],
    ]
    return table(["", ""], rows)


def _section(sec: dict, dry: bool) -> list[str]:
    status = STATUS_WORD.get(sec["status"], sec["status"])
    head = f"### {sec['title']} (`{sec['name']}`){' · cpu dry run' if dry else ''}"
    lines = [head, ""]
    took = f", {sec['elapsed_s']:.1f} s" if sec.get("elapsed_s") is not None else ""
    lines.append(f"Status: **{status}**{took}" + (f". {sec['reason']}" if sec.get("reason") else ""))
    if sec.get("error"):
        e = sec["error"]
        lines.append(f"\nError: `{e['type']}: {e['message']}`")
    failed = [s for s in sec.get("steps", []) if s["status"] in ("failed", "skipped", "running")]
    for s in failed:
        why = (f"{s['error']['type']}: {s['error']['message']}" if s.get("error") else s.get("reason")
               or "did not finish")
        lines.append(f"- step `{s['name']}`: {s['status']}: {why}")
    for t in sec.get("tables", []):
        lines += ["", f"**{t['title']}**" + (" (cpu dry run)" if dry else ""), ""]
        lines += table(t["columns"], t["rows"])
        if t.get("note"):
            lines += ["", t["note"]]
    if sec.get("targets"):
        lines += ["", "Targets:", ""]
        lines += table(["target", "wanted", "measured", "met"],
                       [[t["name"], t["target"], t["value"], "n/a" if t["met"] is None else t["met"]]
                        for t in sec["targets"]])
    for n in sec.get("notes", []):
        lines += ["", f"Note: {n}"]
    return lines + [""]


def markdown(report: dict) -> str:
    dry = report.get("mode") == "cpu dry run"
    lines = ["# GPU suite (`bench/gpu_suite.py`)", ""]
    if dry:
        lines += [DRY_RUN_BANNER, ""]
    lines += _environment(report) + [""]
    if report.get("merged_from"):
        lines += [f"Merged from {len(report['merged_from'])} runs: "
                  + "; ".join(f"{m['started']} (`{' '.join(m.get('argv') or [])}`)" for m in report["merged_from"]), ""]
    secs = report.get("sections", {})
    lines += table(["section", "status", "seconds", "estimate on one H100 (s)", "what it measures"],
                   [[n, STATUS_WORD.get(secs[n]["status"], secs[n]["status"]) + (" (cpu dry run)" if dry else ""),
                     secs[n].get("elapsed_s"), secs[n].get("estimate_s"), secs[n].get("what")]
                    for n in report.get("order", [])])
    finished = report.get("finished")
    lines += ["", f"Started {report.get('started')}, " + (f"finished {finished}" if finished else
                                                          "still running or stopped before the end")
              + f", {report.get('elapsed_s')} s.", ""]
    for name in report.get("order", []):
        lines += _section(secs[name], dry)
    return "\n".join(lines).rstrip() + "\n"
