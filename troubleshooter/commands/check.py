"""`check`: what mixed precision will do to a model, measured on this host.

    python -m troubleshooter check SPEC.yaml|--preset NAME[:k=v,...]|--python FILE --allow-exec
        [--device auto|cpu|cuda[:N]] [--only capability,alignment,skiprate,nan,headroom]
        [--steps N] [--seed S] [--budget SECONDS] [--format text|json]

Exit status: 0 no warning/error finding, 1 some (or a check that could not finish), 2 bad spec
or options.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

# Kept here, not imported from engine.check, so building the CLI parser never imports torch
# (tests/test_check.py keeps them equal to the engine's).
CHECKS = ("capability", "alignment", "skiprate", "nan", "headroom")
DEFAULT_STEPS = 20
DEFAULT_BUDGET_S = 60.0


def _budget(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value <= 24 * 3600:
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0 (at most a day), got {text}")
    return value


def register(subparsers) -> None:
    from ..spec import add_spec_arguments

    p = subparsers.add_parser(
        "check", help="run capability, alignment, skip-rate, NaN and headroom checks on a model",
        description="Build the model from a spec and measure what fp16/bf16 mixed precision does to it: "
                    "device capability, tensor-core alignment, GradScaler skip rate over real fp16 steps, "
                    "the first module producing NaN/Inf per precision, and fp16 overflow/underflow headroom.",
    )
    add_spec_arguments(p)
    p.add_argument("--device", default="auto", help="auto (default), cpu, cuda or cuda:N")
    p.add_argument("--only", metavar="CHECKS", help=f"comma-separated subset of: {','.join(CHECKS)}")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS,
                   help=f"fp16 training steps for the skip-rate probe (default {DEFAULT_STEPS})")
    p.add_argument("--seed", type=int, default=0, help="seed for weights and synthetic batches (default 0)")
    p.add_argument("--budget", type=_budget, default=DEFAULT_BUDGET_S, metavar="SECONDS",
                   help=f"time for the whole run (default {DEFAULT_BUDGET_S:g}): each check gets a share and stops "
                        "at a step boundary; the report says what did not fit")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import time

    started_at = time.time()  # importing torch and building the model count against --budget
    from ..engine.check import check_source, parse_only
    from ..spec import source_from_args

    parse_only(args.only)
    source = source_from_args(args)
    progress = _stderr_progress if args.format == "text" and sys.stderr.isatty() else None
    result = check_source(source, allow_exec=args.allow_exec, device=args.device, only=args.only,
                          steps=args.steps, seed=args.seed, progress=progress, budget_s=args.budget,
                          started_at=started_at)
    if args.format == "json":
        print(json.dumps(result, indent=2))
    else:
        print(render_text(result))
    return int(result["exit_code"])


def _stderr_progress(fraction: float, message: str) -> None:
    print(f"[{fraction:4.0%}] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- text report


def _num(x: Any, fmt: str = ".3g") -> str:
    if x is None:
        return "n/a"
    if isinstance(x, str):
        return x
    return format(x, fmt)


def _share(x: Any) -> str:
    return "n/a" if x is None or isinstance(x, str) else f"{x:.1%}"


def render_text(r: dict[str, Any]) -> str:
    """The report for people: findings first, then one short section per check."""
    dev = r["device"]
    spec = r["spec"]
    out = [f"AMP check of {spec.get('name')} on {dev.get('name')} ({dev.get('type')}"
           f"{':' + str(dev['index']) if dev.get('index') is not None else ''}), seed {r.get('seed')}"]
    out += ["", _findings_text(r["findings"], r.get("errors") or {})]
    b = r.get("budget") or {}
    if b.get("cut"):
        out += ["", f"Time budget {_num(b.get('budget_s'), 'g')} s: not everything fit, so some results rest on less "
                    "than asked (raise --budget):"] + [f"  - {c}" for c in b["cut"]]
    if b.get("exceeded_s"):
        out.append(f"  note: the run took {b['exceeded_s']:.1f} s more than the budget "
                   "(a step that had started is always finished)")
    for name, fn in (("capability", _capability_text), ("alignment", _alignment_text),
                     ("skiprate", _skiprate_text), ("nan", _nan_text), ("headroom", _headroom_text)):
        title = {"capability": "Capability", "alignment": "Alignment (tensor-core multiples)",
                 "skiprate": "fp16 skip rate (GradScaler)", "nan": "NaN/Inf localisation",
                 "headroom": "fp16/bf16 headroom"}[name]
        out += ["", f"== {title}"]
        if name in r.get("errors", {}):
            out.append(f"  error: {r['errors'][name]['message']}")
        if r.get(name) is None and name in r.get("errors", {}):
            continue
        if r.get(name) is None:
            out.append(f"  skipped: {r.get('skipped', {}).get(name, 'not run')}")
        else:
            out += fn(r)
    return "\n".join(out)


def _findings_text(findings: list[dict], errors: dict | None = None) -> str:
    failed = {n: e for n, e in (errors or {}).items() if e.get("kind") != "not_available"}
    if failed:
        head = [f"NOT VERIFIED: {len(failed)} check{'s' if len(failed) > 1 else ''} could not run "
                f"({', '.join(failed)}); the report below is incomplete:"]
        head += [f"  ERROR   {e['message']}" for e in failed.values()]
        if not findings:
            return "\n".join(head + ["No findings from the checks that ran."])
        return "\n".join(head + [""]) + "\n" + _findings_text(findings)
    if not findings:
        return "No findings: nothing to fix for mixed precision."
    counts: dict[str, int] = {}
    for f in findings:
        counts[f["severity"]] = counts.get(f["severity"], 0) + 1
    lines = ["Findings: " + ", ".join(f"{n} {s}{'s' if n != 1 else ''}" for s, n in counts.items())]
    for f in findings:
        where = f"module '{f['module']}'" if f.get("module") is not None else "model"
        if f.get("precision"):
            where += f" ({f['precision']})"
        lines.append(f"  {f['severity'].upper():7} {f['rule']} {f['name']} - {where}")
        lines.append(f"          {f['message']}")
        lines.append(f"          fix: {f['suggestion']}")
    return "\n".join(lines)


def _capability_text(r: dict) -> list[str]:
    c = r["capability"]
    lines = []
    line = c.get("summary_line") or c.get("summary")
    if line:
        lines.append(f"  {line}")
    if c.get("recommended_precision"):
        lines.append(f"  recommended: {c['recommended_precision']}" + (f" - {c['reason']}" if c.get("reason") else ""))
    return lines or ["  " + json.dumps(c)[:300]]


def _alignment_text(r: dict) -> list[str]:
    rows = r["alignment"]
    s = r.get("alignment_summary") or {}
    bad = [row for row in rows if not row["aligned"]]
    lines = [f"  {len(rows)} sizes checked, {len(bad)} not aligned"
             + (f"; layers with a misalignment worth fixing do {_share(s.get('misaligned_flops_share'))} "
                "of the FLOPs" if bad else "")]
    if bad:
        lines.append(f"  {'module':24} {'class':18} {'dimension':22} {'value':>7} {'padded':>7} {'FLOPs':>7}")
        for row in bad:
            lines.append(f"  {row['module'][:24]:24} {row['class'][:18]:18} {row['dimension'][:22]:22} "
                         f"{row['value']:>7} {row['padded']:>7} {_share(row.get('flops_share')):>7}")
    if s.get("note"):
        lines.append(f"  note: {s['note']}")
    return lines


def _skiprate_text(r: dict) -> list[str]:
    s = r["skiprate"]["summary"]
    rec = r["skiprate"]["recommendation"]
    lines = [f"  {s['steps']} fp16 steps: {s['skipped']} skipped ({s['skipped_calibration']} in calibration, "
             f"{s['skipped_after_calibration']} of {s['steps_after_calibration']} after); "
             f"final scale {_num(s['final_scale'], 'g')}",
             f"  recommendation: {rec['action'].replace('_', ' ')}"
             + (f" (init_scale={_num(rec['init_scale'], 'g')})" if rec.get("init_scale") else "")
             + f" - {rec['reason']}"]
    series = " ".join(("x" if st["skipped"] else ".") for st in r["skiprate"]["steps"])
    lines.append(f"  steps (x = skipped): {series}")
    if s.get("note"):
        lines.append(f"  note: {s['note']}")
    return lines


def _nan_text(r: dict) -> list[str]:
    n = r["nan"]
    lines = []
    for p, sec in (n.get("precisions") or {}).items():
        if not isinstance(sec, dict):
            continue
        if sec.get("summary"):  # the nan check's own one-line account
            lines.append(f"  {p}: {sec['summary']}")
            continue
        parts = []
        for key in ("first_forward", "first_backward"):
            ev = sec.get(key)
            if ev:
                where = f"'{ev.get('module')}'" if ev.get("module") is not None else "the loss"
                parts.append(f"{key.replace('first_', '')}: {ev.get('value') or ev.get('kind', 'non-finite')} first at {where}"
                             + (f" ({ev['class']})" if ev.get("class") else ""))
        if sec.get("error"):
            parts.append(f"error: {sec['error']}")
        lines.append(f"  {p}: " + ("; ".join(parts) if parts else "all finite"))
    return lines or ["  no precision measured"]


def _headroom_text(r: dict) -> list[str]:
    h = r["headroom"]
    acts = [a for a in h["activations"] if isinstance(a.get("headroom_bits"), (int, float))]
    lines = []
    if h.get("first_nonfinite_fp32") is not None:
        lines.append(f"  the fp32 reference step itself is not finite from module '{h['first_nonfinite_fp32']}' "
                     "(see the NaN/Inf section): the figures below cover the finite part only")
    if h.get("first_overflow") is not None:
        lines.append(f"  first module past float16's 65504: '{h['first_overflow']}'")
    if acts:
        tight = min(acts, key=lambda a: a["headroom_bits"])
        lines.append(f"  least headroom: '{tight['module']}' ({tight['class']}) max |x| {_num(tight['max_abs'])}, "
                     f"{tight['headroom_bits']:.1f} bits below float16's max")
    g = h["gradient_summary"]
    lines.append(f"  gradients without loss scaling: {_share(g.get('flush_to_zero_share'))} flush to zero, "
                 f"{_share(g.get('subnormal_share'))} subnormal; {g.get('window_text') or 'no loss-scale window'}")
    d = g.get("default_scaler") or {}
    if d.get("lost_share") is not None:
        lines.append(f"  measured fp16 step with GradScaler at {_num(d['scale'], 'g')}: {_share(d['lost_share'])} of "
                     f"gradient elements lost, gradient error {_num(d.get('gradient_relative_error'))} vs fp32")
    for p, e in h["relative_error"].items():
        if "error" in e:
            lines.append(f"  {p} vs fp32: not measured ({e['error']})")
        else:
            lines.append(f"  {p} vs fp32: output rel. error {_num(e.get('output'))}, loss rel. error {_num(e.get('loss'))}")
    return lines
