"""One renderer for a `CheckReport`: the Markdown sections the page shows and the CLI prints.

The page puts each section in its own box; `check --format text` prints the same sections
through `markdown_to_text`, so both say the same thing in the same words (the page then drops
command-line advice a browser user cannot follow). Tables for the page's data grids
(`alignment_rows`, `headroom_rows`) come from here too.
"""
from __future__ import annotations

import re
from typing import Any

from ..findings import Finding, Severity
from .check_report import CHECKS, CheckReport

TITLES = {"capability": "Capability", "alignment": "Alignment (tensor-core multiples)",
          "skiprate": "fp16 skip rate (GradScaler)", "nan": "NaN/Inf localisation",
          "headroom": "fp16/bf16 headroom"}
ALIGN_HEADERS = ["module", "layer", "dimension", "size", "pad to", "aligned", "share of FLOPs", "note"]
HEADROOM_HEADERS = ["module", "layer", "max |activation|", "headroom (bits)", "fp16 overflow"]
_MD_SPECIAL = re.compile(r"([\\*_<>\[\]#|`])")


def as_report(report: CheckReport | dict[str, Any]) -> CheckReport:
    return report if isinstance(report, CheckReport) else CheckReport.from_dict(report)


# ---------------------------------------------------------------- small formatting helpers


def esc(value: Any) -> str:
    """Text shown literally in Markdown and in table cells (module names like `<top level>`)."""
    return _MD_SPECIAL.sub(r"\\\1", str("" if value is None else value)).replace("\n", " ")


def num(x: Any, digits: int = 3) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


def share(x: Any) -> str:
    return f"{x:.1%}" if isinstance(x, (int, float)) and not isinstance(x, bool) else "n/a"


def _table(headers: list[str], rows: list[list[Any]]) -> list[str]:
    return (["| " + " | ".join(headers) + " |", "|" + " --- |" * len(headers)]
            + ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows])


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


# ---------------------------------------------------------------- the head of the report


def headline(report: CheckReport | dict) -> str:
    """Which model, on which device, seed, how many findings."""
    r = as_report(report)
    dev, spec = r.device or {}, r.spec or {}
    where = f"{dev.get('type', '?')}{':' + str(dev['index']) if dev.get('index') is not None else ''}"
    return (f"AMP check of **{esc(spec.get('name') or 'model')}** on {esc(dev.get('name') or where)} ({where}), "
            f"seed {r.seed}: {_plural(len(r.findings), 'finding')}.")


def not_verified_markdown(report: CheckReport | dict) -> str:
    """The checks that could not finish, each with its reason; empty when all finished."""
    failed = as_report(report).failed_checks
    if not failed:
        return ""
    lines = [f"> **NOT VERIFIED**: {_plural(len(failed), 'check')} could not run ({', '.join(failed)}); "
             "the report is incomplete:"]
    lines += [f"> - ERROR {esc(e.message)}" for e in failed.values()]
    return "\n".join(lines) + "\n"


# How to ask for the rest of a cut run, in each surface's own words ({n}: the suggested budget)
MORE = {"cli": "To measure the rest, run again with `--budget {n}`.",
        "page": "To measure the rest, set **Time budget (s), shared by the checks** to {n} and press **Run checks** "
                "again.",
        "api": "To measure the rest, call /check again with budget_s={n}."}


START_UP_WORTH_SAYING_S = 1.0  # below this the start-up explains no cut


def budget_markdown(report: CheckReport | dict, surface: str = "cli") -> str:
    """The time budget, the time used, what did not fit, and how to ask for more (`surface`:
    "cli", "page" or "api", whose words the last sentence uses)."""
    r = as_report(report)
    b = r.budget
    if b is None:
        return ""
    total, start_up = r.timings_s.get("total"), r.timings_s.get("start_up")
    used = f"; the run took {num(total, 3)} s" if isinstance(total, (int, float)) else ""
    if used and isinstance(start_up, (int, float)) and start_up >= START_UP_WORTH_SAYING_S:
        used += f", {num(start_up, 2)} s of it before the checks began (start-up and building the model)"
    if b.budget_s is None:
        return f"Time budget: none{used}.\n"
    lines = [f"Time budget {num(b.budget_s, 4)} s{used}."]
    if b.cut:
        lines[0] += " Not everything fit, so some results rest on less than asked (raise --budget):"
        lines += [""] + [f"- {esc(c)}" for c in b.cut]
        if b.suggested_s:
            lines += ["", MORE.get(surface, MORE["cli"]).format(n=f"{b.suggested_s:g}")]
    if b.exceeded_s:
        lines += ["", f"Note: the run took {b.exceeded_s:.1f} s more than the budget "
                      "(a step that had started is always finished)."]
    return "\n".join(lines) + "\n"


def emulation_markdown(report: CheckReport | dict) -> str:
    """Which autocast policy ran (CUDA's emulated on a CPU, or the host's own) and how half
    precision was computed on a CPU without instructions for it."""
    device = as_report(report).device or {}
    lines = []
    policy = device.get("autocast_policy")
    if isinstance(policy, dict) and policy.get("label") and policy.get("policy") != "device":
        note = f" ({esc(policy['note'])})" if policy.get("note") else ""
        lines.append(f"Autocast policy: {esc(policy['label'])}{note}.")
    emulated = device.get("half_emulation")
    if isinstance(emulated, dict) and emulated.get("note"):
        lines.append(f"Note: {esc(emulated['note'])}.")
    return "\n\n".join(lines) + "\n" if lines else ""


def status_markdown(report: CheckReport | dict, surface: str = "cli") -> str:
    """The page's status box: the headline, what could not be verified, the budget, how half
    precision was computed."""
    parts = (headline(report), not_verified_markdown(report), budget_markdown(report, surface),
             emulation_markdown(report))
    return "\n\n".join(x for x in parts if x)


def findings_markdown(report: CheckReport | dict) -> str:
    r = as_report(report)
    findings = r.findings
    lines = ["#### Findings"]
    if not findings:
        lines.append("No findings from the checks that ran." if r.failed_checks
                     else "No findings: nothing to fix for mixed precision.")
        return "\n".join(lines) + "\n"
    counts = {s: sum(1 for f in findings if f.severity is s) for s in Severity}
    lines += ["Findings: " + ", ".join(_plural(n, s.value) for s, n in counts.items() if n), ""]
    for f in sorted(findings, key=lambda f: -f.severity.rank):  # worst first; two trailing spaces break the line
        lines += [f"- **{f.severity.value.upper()} {f.rule} {esc(f.name)}** — {esc(_finding_where(f))}  ",
                  f"  {esc(f.message)}  ", f"  Fix: {esc(f.suggestion)}"]
    return "\n".join(lines) + "\n"


def _finding_where(f: Finding) -> str:
    where = f"module '{f.location.module}'" if f.location.module is not None else "model"
    return f"{where} ({f.precision})" if f.precision else where


# ---------------------------------------------------------------- one section per check


def _not_run(r: CheckReport, name: str) -> list[str]:
    """Why a check has no section (or an incomplete one)."""
    out = []
    if name in r.errors:
        out.append(f"**error:** {esc(r.errors[name].message)}")
    if getattr(r, name) is None and name not in r.errors:
        out.append(f"*skipped: {esc(r.skipped.get(name, 'not run'))}*")
    return out


def section_markdown(report: CheckReport | dict, name: str) -> str:
    """The Markdown section of one check (`capability`, `alignment`, ...)."""
    r = as_report(report)
    lines = [f"#### {TITLES[name]}"] + _not_run(r, name)
    if getattr(r, name) is not None:
        lines += _BODIES[name](r)
    return "\n\n".join(lines) + "\n"


def _capability(r: CheckReport) -> list[str]:
    c = r.section("capability") or {}
    lines = []
    if c.get("summary"):
        lines.append(f"**{esc(c['summary'])}**")
    if c.get("recommended_precision"):
        lines.append(f"Recommended precision: **{esc(c['recommended_precision'])}**"
                     + (f" — {esc(c['reason'])}" if c.get("reason") else ""))
    lines += [f"Note: {esc(n)}" for n in c.get("notes") or []]
    facts = {}
    for k, v in c.items():
        if k in ("summary", "recommended_precision", "reason", "notes"):
            continue
        for sub, val in (v.items() if isinstance(v, dict) else [("", v)]):
            if isinstance(val, (str, int, float, bool)):
                facts[f"{k} {sub}".strip()] = num(val)
    if facts:  # folded on the page; the CLI's `capability` command prints them all
        lines.append("\n".join(["<details><summary>All capability facts</summary>", ""]
                               + _table(["fact", "value"], [[k, v] for k, v in facts.items()])
                               + ["", "</details>"]))
    return lines


def alignment_rows(report: CheckReport | dict) -> list[list]:
    """Every checked size, for the page's table (ALIGN_HEADERS)."""
    rows = []
    for row in as_report(report).section("alignment") or []:
        rows.append([row.get("module"), row.get("class"), row.get("dimension"), row.get("value"), row.get("padded"),
                     "yes" if row.get("aligned") else f"NO (multiple of {row.get('multiple')})",
                     share(row.get("flops_share")) if row.get("flops_share") is not None else "—",
                     row.get("note") or ""])
    return rows


def _alignment(r: CheckReport) -> list[str]:
    rows = r.section("alignment") or []
    s = r.alignment_summary or {}
    bad = [row for row in rows if not row["aligned"]]
    worth = s.get("misaligned_flops_share")
    lines = [f"{_plural(len(rows), 'size')} checked, {len(bad)} not aligned"
             + ("" if not bad else "; none worth padding (see the notes)" if worth == 0
                else f"; layers with a misalignment worth fixing do {share(worth)} of the FLOPs") + "."]
    if bad:
        lines.append("\n".join(_table(["module", "layer", "dimension", "size", "pad to", "share of FLOPs"],
                                      [[b["module"], b["class"], b["dimension"], b["value"], b["padded"],
                                        share(b.get("flops_share"))] for b in bad])))
    if s.get("note"):
        lines.append(f"Note: {esc(s['note'])}")
    return lines


def _skiprate(r: CheckReport) -> list[str]:
    sec = r.section("skiprate")
    s, rec = sec.get("summary") or {}, sec.get("recommendation") or {}
    rate = s.get("skip_rate")
    lines = [f"{s.get('steps', '?')} fp16 steps: {s.get('skipped', '?')} skipped"
             + (f" ({rate:.0%})" if isinstance(rate, (int, float)) else "")
             + f", {s.get('skipped_calibration', '?')} in calibration and {s.get('skipped_after_calibration', '?')} "
               f"of {s.get('steps_after_calibration', '?')} after; final loss scale {num(s.get('final_scale'), 6)}."]
    if rec:
        lines.append(f"Recommendation: **{esc(str(rec.get('action', '')).replace('_', ' '))}**"
                     + (f" (init_scale={num(rec['init_scale'], 6)})" if rec.get("init_scale") else "")
                     + f" — {esc(rec.get('reason', ''))}")
    series = " ".join("x" if st.get("skipped") else "." for st in sec.get("steps") or [])
    if series:
        lines.append(f"Steps (x = skipped): `{series}`")
    if s.get("note"):
        lines.append(f"Note: {esc(s['note'])}")
    return lines


def where(entry: Any) -> str:
    """A first non-finite event in words: module, class, what, step."""
    if not entry:
        return "none (all finite)"
    if not isinstance(entry, dict):
        return str(entry)
    what = entry.get("value") or entry.get("kind") or entry.get("what") or ("gradient of the loss" if entry.get("grad_of") == "loss" else "")
    parts = [f"'{entry['module']}'" if entry.get("module") is not None else "the loss",
             f"({entry['class']})" if entry.get("class") else None, what or None,
             f"at step {entry['step']}" if entry.get("step") is not None else None]
    return " ".join(p for p in parts if p)


def _nan(r: CheckReport) -> list[str]:
    rows, found = [], []
    for p, sec in ((r.nan or {}).get("precisions") or {}).items():
        if not isinstance(sec, dict):
            continue
        if sec.get("summary"):  # the NaN hunt's own account of the run (e.g. a scaled-backward overflow)
            found.append(f"- {p}: {esc(sec['summary'])}")
        if sec.get("not_run"):
            rows.append([p, "—", f"not run ({sec['not_run']})", ""])
            continue
        loss = "NON-FINITE" if sec.get("loss") is None and sec.get("loss_finite") is False else (
            num(sec.get("loss"), 4) + ("" if sec.get("loss_finite", True) else " (NON-FINITE)"))
        if sec.get("error"):
            rows.append([p, loss, f"error: {sec['error']}", ""])
            continue
        rows.append([p, loss, where(sec.get("first_forward")), where(sec.get("first_backward"))])
    if not rows:
        return ["No precision measured."]
    lines = ["\n".join(_table(["precision", "loss", "first non-finite (forward)", "first non-finite (backward)"],
                              rows))]
    if found:
        lines.append("\n".join(["What each run found first:", ""] + found))
    return lines


def headroom_rows(report: CheckReport | dict) -> list[list]:
    """One row per module's activations, for the page's table (HEADROOM_HEADERS)."""
    rows = []
    for a in (as_report(report).section("headroom") or {}).get("activations") or []:
        bits = a.get("headroom_bits")
        rows.append([a.get("module") or "<model>", a.get("class"), num(a.get("max_abs")),
                     f"{bits:.1f}" if isinstance(bits, (int, float)) else num(bits),
                     "OVERFLOWS" if a.get("overflows_fp16") else ("non-finite" if a.get("finite") is False else "ok")])
    return rows


def _headroom(r: CheckReport) -> list[str]:
    h = r.section("headroom")
    lines = []
    if h.get("first_nonfinite_fp32") is not None:
        lines.append(f"The fp32 reference step itself is not finite from module '{esc(h['first_nonfinite_fp32'])}' "
                     "(see the NaN/Inf section): the figures below cover the finite part only.")
    first = h.get("first_overflow")
    lines.append(f"First module past float16's 65504: **{esc(repr(first) if first is not None else 'none')}**.")
    acts = [a for a in h.get("activations") or [] if isinstance(a.get("headroom_bits"), (int, float))]
    if acts:
        tight = min(acts, key=lambda a: a["headroom_bits"])
        lines.append(f"Least headroom: '{esc(tight['module'])}' ({esc(tight['class'])}), max |x| "
                     f"{num(tight['max_abs'])}, {tight['headroom_bits']:.1f} bits below float16's max.")
    g = h.get("gradient_summary") or {}
    if g:
        lines.append(f"Gradients without loss scaling: {share(g.get('flush_to_zero_share'))} flush to zero, "
                     f"{share(g.get('subnormal_share'))} subnormal; {esc(g.get('window_text') or 'no loss-scale window')}.")
    d = g.get("default_scaler") or {}
    if d.get("lost_share") is not None:
        lines.append(f"Measured fp16 step with GradScaler at {num(d.get('scale'), 6)}: {share(d['lost_share'])} of "
                     f"gradient elements lost, gradient error {num(d.get('gradient_relative_error'))} vs fp32.")
    rel = []
    for p, e in (h.get("relative_error") or {}).items():
        rel.append(f"{p} not measured ({esc(e['error'])})" if "error" in e
                   else f"{p} output {num(e.get('output'))}, loss {num(e.get('loss'))}")
    if rel:
        lines.append("Relative error vs fp32: " + "; ".join(rel) + ".")
    return lines


_BODIES = {"capability": _capability, "alignment": _alignment, "skiprate": _skiprate, "nan": _nan,
           "headroom": _headroom}


# ---------------------------------------------------------------- the whole report


def report_markdown(report: CheckReport | dict) -> str:
    """The whole report in Markdown: head, findings, one section per check."""
    r = as_report(report)
    parts = [status_markdown(r), findings_markdown(r)] + [section_markdown(r, c) for c in CHECKS]
    return "\n".join(p.rstrip() + "\n" for p in parts if p)


_ESCAPED = re.compile(r"\\([\\*_<>\[\]#|`])")


def _plain(text: str) -> str:
    text = re.sub(r"\*\*(.+?)\*\*", r"\1", text)
    text = re.sub(r"(?<![\\\w])\*(?!\s)(.+?)(?<![\s\\])\*", r"\1", text)
    text = re.sub(r"(?<!\\)`([^`]*)(?<!\\)`", r"\1", text)
    return _ESCAPED.sub(r"\1", text)


def _cells(line: str) -> list[str]:
    cells, cur, i = [], "", 1
    body = line.strip()
    while i < len(body) - 1 or (i == len(body) - 1 and body[i] != "|"):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            cur += body[i:i + 2]
            i += 2
            continue
        if ch == "|":
            cells.append(cur.strip())
            cur = ""
        else:
            cur += ch
        i += 1
    cells.append(cur.strip())
    return [_plain(c) for c in cells]


def markdown_to_text(md: str) -> str:
    """The terminal form of these sections: `#### T` -> `== T`, emphasis dropped, tables as
    aligned columns, folded `<details>` blocks left out (the page's extras)."""
    out: list[str] = []
    table: list[list[str]] = []
    folded = False
    indent = ""  # body lines of a `== section` are indented

    def flush() -> None:
        if not table:
            return
        widths = [max(len(row[i]) if i < len(row) else 0 for row in table) for i in range(len(table[0]))]
        for row in table:
            out.append("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        table.clear()

    for line in md.splitlines():
        if line.startswith("<details"):
            folded = True
        if folded:
            folded = not line.startswith("</details>")
            continue
        if line.startswith("|"):
            if not re.fullmatch(r"\|(\s*---\s*\|)+", line.strip()):
                table.append(_cells(line))
            continue
        flush()
        if line.startswith("#### "):
            out += ["", f"== {_plain(line[5:])}"]
            indent = "  "
        elif line.startswith("> - ERROR "):
            out.append(f"  ERROR   {_plain(line[10:])}")
        elif line.startswith("> "):
            out.append(indent + _plain(line[2:]))
        elif line.startswith("- "):
            out.append(f"{indent}- {_plain(line[2:].rstrip())}")
        elif line.startswith("  ") and line.strip():  # a list item's next line
            out.append(f"{indent}    {_plain(line.strip())}")
        elif line.strip():
            out.append(indent + _plain(line.rstrip()))
    flush()
    return "\n".join(out).strip("\n") + "\n"


def render_text(report: CheckReport | dict) -> str:
    """`check --format text`: the page's sections, for a terminal."""
    return markdown_to_text(report_markdown(report))
