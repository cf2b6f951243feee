"""Section `trace`: `trace` on generated recipes (bf16, and fp16 with its GradScaler) and on
nanoGPT's unmodified train.py (tests/fixtures/trace/real, MIT) on the device.

What must hold: each run stops cleanly after the requested steps on the requested device, with
no warning or error finding, and the precision section says what really ran: the recipes'
autocast (and, for fp16, an enabled GradScaler); nanoGPT's own AMP is on where CUDA is (bf16 on
Ampere or newer) and off on a CPU, where the trace must say so (AMP292), not "AMP works".
"""
from __future__ import annotations

import tempfile
from pathlib import Path

def cases(ctx, tmp: Path) -> list[dict]:
    """(label, script, args, cwd, what the precision section must say)."""
    from tests.fixtures.trace.nanogpt_data import nanogpt_copy
    from troubleshooter.recipes import render_recipe

    cuda = ctx.device.startswith("cuda")
    dev = "cuda" if cuda else "cpu"  # the child sees only the chosen GPU (CUDA_VISIBLE_DEVICES)
    out = []
    for precision in ctx.sizes.trace_recipes:
        dtype = {"bf16": "bfloat16", "fp16": "float16"}[precision]
        script = tmp / f"train_{precision}.py"
        script.write_text(render_recipe(precision=precision))
        out.append({"label": f"generated recipe, {precision}", "script": script, "cwd": tmp,
                    "args": ["--device", dev, "--max-steps", str(4 * ctx.sizes.trace_steps), "--batch-size", "8",
                             "--out-dir", str(tmp / f"out_{precision}")],
                    "mixed": True, "dtype": dtype, "scaler": precision == "fp16"})
    root = nanogpt_copy(tmp)
    out.append({"label": "nanoGPT train.py (unmodified)", "script": root / "train.py", "cwd": root,
                "args": ["config/train_shakespeare_char.py", f"--device={dev}", "--compile=False",
                         *ctx.sizes.nanogpt_args],
                # on CUDA it autocasts (bfloat16 where supported, else float16); on a CPU its AMP is off
                "mixed": cuda, "dtype": None, "scaler": None})
    return out


def judge(report: dict, case: dict, device_type: str) -> list[str]:
    """What is wrong with a trace report against the case's expectations (empty: as expected)."""
    problems = []
    if report["exit"]["status"] not in ("stopped", "finished"):
        problems.append(f"exit {report['exit']['status']}: {report['exit'].get('message') or ''}".strip())
    if not report.get("steps_observed"):
        problems.append("no optimizer step observed")
    if (report.get("device") or {}).get("type") != device_type:
        problems.append(f"ran on {(report.get('device') or {}).get('type')}, not {device_type}")
    prec = report.get("precision") or {}
    if prec.get("mixed") is not case["mixed"]:
        problems.append(f"mixed precision {'did not run' if case['mixed'] else 'ran'}: {prec.get('compute')}")
    if case["dtype"] and case["dtype"] not in (prec.get("compute") or "").replace(",", " ").split():
        problems.append(f"computed in {prec.get('compute')}, not {case['dtype']}")
    if case["scaler"] is not None:
        enabled = any(s.get("enabled") for s in prec.get("scalers") or [])
        if enabled is not case["scaler"]:
            problems.append(f"GradScaler {'off' if case['scaler'] else 'on'}")
    bad = [f"{f['rule']} ({f['severity']})" for f in report.get("findings", [])
           if f["severity"] in ("error", "warning")]
    if bad:
        problems.append("findings: " + ", ".join(bad))
    return problems


def run(ctx, res) -> None:
    """One trace after another, in every mode: trace stops each process that appeared below this
    one while its script ran, so two traces at once (or anything else starting processes) would
    stop each other's."""
    from troubleshooter.trace import trace_script

    device_type = "cuda" if ctx.device.startswith("cuda") else "cpu"
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpu-suite-trace-") as tmpdir:
        tmp = Path(tmpdir)
        todo = []
        with res.step("prepare the scripts"):
            todo = cases(ctx, tmp)
        for case in todo:
            with res.step(case["label"]):
                report = trace_script(case["script"], case["args"], steps=ctx.sizes.trace_steps, device=ctx.device,
                                      timeout_s=ctx.sizes.trace_timeout_s, cwd=str(case["cwd"]))
                problems = judge(report, case, device_type)
                findings = ", ".join(f"{f['rule']} ({f['severity']})" for f in report.get("findings", [])) or "none"
                prec = report.get("precision") or {}
                rows.append([case["label"], report["exit"]["status"], report.get("steps_observed"),
                             (report.get("device") or {}).get("name"), prec.get("compute"), findings,
                             report["exit"].get("wall_s"), not problems, "; ".join(problems) or "-"])
                res.data.setdefault("reports", {})[case["label"]] = {
                    k: report.get(k) for k in ("exit", "device", "precision", "steps_observed", "findings", "scale")}
                if problems:
                    raise AssertionError("; ".join(problems))
    res.table(f"trace on {ctx.device}", ["script", "exit", "steps", "device", "precision in effect", "findings",
                                         "seconds", "as expected", "problems"], rows)
