"""The trace report: the JSON object of the `trace` contract, its exit code, and its text and
Markdown renderings (CLI and app)."""
from __future__ import annotations

from typing import Any

from ..findings import Finding, Severity, findings_to_markdown, has_problems, sort_key
from ..jsonsafe import jsonable
import re

from .locate import display_path, short_path as _short
from .precision import ran_without_mixed_precision

STATUS_TEXT = {
    "stopped": "stopped cleanly after the requested steps",
    "finished": "ran to its end",
    "exited": "exited with a non-zero status",
    "raised": "raised an exception",
    "timeout": "hit the time limit and was stopped",
    "crashed": "died without reporting (killed, out of memory, or a crash in native code)",
}


# what `steps_observed` counts: optimizer steps, or in a loop without a torch.optim optimizer
# (weights updated by hand) backward passes
STEPS_COUNTED = {"optimizer": "optimizer steps",
                 "backward": "backward passes (no torch.optim optimizer stepped, so each backward() was a step)"}


def build(script: str, argv: list[str], device_req: str, raw: dict, findings: list[Finding],
          explained: list[dict], nan: bool, headroom: bool, scale: list, skipped: list[int],
          precision: dict) -> dict:
    proc = raw.get("process") or {}
    exit_info = dict(raw.get("exit") or {})
    if not raw.get("final"):
        exit_info = {"status": "timeout" if proc.get("timed_out") else "crashed", "exception": None,
                     "code": proc.get("returncode")}
    exc = exit_info.get("exception")
    if exc:
        exc = {**exc, "explain": explained}
    numerics = raw.get("numerics") or {}
    findings = sorted(findings, key=lambda f: (-f.severity.rank, *sort_key(f)))
    report = {
        "script": script,
        "argv": argv,
        "device": {"requested": device_req, **(raw.get("device") or {"type": None, "index": None, "name": None})},
        "precision": precision,
        "autocast_policy": raw.get("autocast_policy"),
        "steps_observed": int(raw.get("steps_observed") or 0),
        "steps_counted": STEPS_COUNTED.get(raw.get("step_unit"), STEPS_COUNTED["optimizer"]),
        "exit": {"status": exit_info.get("status"), "exception": exc, "code": exit_info.get("code"),
                 "message": exit_info.get("message"), "description": STATUS_TEXT.get(exit_info.get("status"), ""),
                 "wall_s": proc.get("wall_s"), "stdout_tail": proc.get("stdout_tail", ""),
                 "stderr_tail": proc.get("stderr_tail", "")},
        "findings": [{**f.to_dict(), "step": _first_step(f)} for f in findings],
        "timeline": raw.get("timeline") or [],
        "scale": scale,
        "skipped_steps": skipped,
        "nan": {k: v for k, v in numerics.items() if k != "headroom_steps"} | {"enabled": nan},
        "headroom": {"enabled": headroom, "steps": numerics.get("headroom_steps", []) if headroom else []},
        "overhead": raw.get("overhead") or {"steps_timed": 0, "total_s": None, "per_step_ms": None,
                                            "step_ms": None, "share": None, "steps_sampled": 0},
        "steady": raw.get("steady") or {"enabled": False, "after": None, "steps": 0},
    }
    return jsonable(report)


def _first_step(f: Finding) -> int | None:
    """The first optimizer step (0-based) where the finding was seen, None when not tied to one."""
    d = f.data
    for key in ("step", "steps", "skipped_steps"):
        v = d.get(key)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
        if isinstance(v, list) and v and isinstance(v[0], int):
            return v[0]
    return None


def exit_code(report: dict) -> int:
    """0 without error/warning findings, 1 with some (a script that raised or timed out counts)."""
    findings = [Finding.from_dict(f) for f in report.get("findings", [])]
    bad_exit = (report.get("exit") or {}).get("status") in ("raised", "timeout", "crashed", "exited")
    return 1 if has_problems(findings) or bad_exit else 0


def _head(report: dict) -> str:
    dev = report.get("device") or {}
    ex = report.get("exit") or {}
    argv = " ".join(report.get("argv") or [])
    return (f"Traced `python {argv}` on {dev.get('name') or dev.get('requested')}: "
            f"{report.get('steps_observed')} {report.get('steps_counted') or 'optimizer steps'} observed; "
            f"the script {ex.get('description') or ex.get('status')}"
            + (f" after {ex['wall_s']:.1f} s" if isinstance(ex.get("wall_s"), (int, float)) else ""))


def _precision_line(report: dict) -> str | None:
    section = report.get("precision") or {}
    return f"Precision in effect: {section['summary']}." if section.get("summary") else None


def overhead_line(report: dict) -> str | None:
    """What tracing cost the script per step, as measured in the run (none with fewer than two steps)."""
    o = report.get("overhead") or {}
    per_step, step = o.get("per_step_ms"), o.get("step_ms")
    if per_step is None or step is None:
        return None
    share = o.get("share")
    of_step = f" ({share:.1%} of the step without it)" if share is not None else ""
    sampled = o.get("steps_sampled")
    how = f", {sampled} of them steady steps given a sampled steady step's time" if sampled else ""
    return (f"Tracing added about {per_step:.3g} ms per step{of_step}: the tracer's own code, timed in "
            f"the run (median of {o.get('steps_timed')} steps{how}; a step took {step:.3g} ms with it).")


def steady_line(report: dict) -> str | None:
    """How many steps ran with the costly instruments standing down (docs/trace.md, "Steady state")."""
    st = report.get("steady") or {}
    if not st.get("enabled"):
        return None
    n, total = st.get("steps") or 0, report.get("steps_observed") or 0
    return (f"Steady state: {n} of {total} steps ran with the loss watch and the output-gradient keeper standing "
            f"down (after {st.get('after')} identical clean steps, until a step deviates; --no-steady keeps them "
            "armed).")


def _clean_line(report: dict) -> str:
    """What no finding means: a clean protocol, and whether mixed precision ran at all."""
    section = report.get("precision") or {}
    if ran_without_mixed_precision(section):
        return ("No findings, and no mixed precision ran: every traced step computed in "
                f"{section.get('compute')}, so these steps say nothing about AMP on this script.")
    return "No findings: the AMP protocol looked right on every traced step."


def _scale_line(report: dict) -> str | None:
    scale = [s for s in report.get("scale") or [] if s is not None]
    if not scale:
        return None
    skipped = report.get("skipped_steps") or []
    return (f"Loss scale per step: {' '.join(f'{s:g}' for s in scale[:40])}" + (" ..." if len(scale) > 40 else "")
            + f"; skipped steps: {', '.join(map(str, skipped)) if skipped else 'none'}")


_FILE = re.compile(r'File "([^"]+)"')


def _traceback_tail(exc: dict, n: int = 8) -> list[str]:
    """The last lines of the script's traceback (the tool's own frames are never in it), with
    installed packages' paths from the package folder on."""
    lines = (exc.get("traceback") or "").rstrip().splitlines()[-n:]
    return [_FILE.sub(lambda m: f'File "{display_path(m.group(1))}"', line) for line in lines]


def render_text(report: dict) -> str:
    """The terminal report: header, findings with file:line, loss scale, exception."""
    out = [_head(report)]
    if _precision_line(report):
        out.append(_precision_line(report))
    out.append("")
    findings = report.get("findings") or []
    if not findings:
        out.append(_clean_line(report))
    for f in findings:
        where = f"{_short(f['path'])}:{f['line']}" if f.get("path") else ""
        if f.get("module") is not None:
            where += f" module '{f['module'] or '<root>'}'"
        if f.get("precision"):
            where += f" ({f['precision']})"
        out.append(f"{f['severity'].upper():7} {f['rule']} {f['name']} - {where.strip() or 'run'}")
        out.append(f"        {f['message']}")
        if f.get("suggestion"):
            out.append(f"        fix: {f['suggestion']}")
    line = _scale_line(report)
    if line:
        out += ["", line]
    if overhead_line(report):
        out += ["", overhead_line(report)]
    if steady_line(report):
        out += [steady_line(report)] if overhead_line(report) else ["", steady_line(report)]
    exc = (report.get("exit") or {}).get("exception")
    if exc and not exc.get("caused_by_tool"):  # the tool's own failure is AMP219, with no traceback of ours
        out += ["", "Traceback of the script (last lines):", *_traceback_tail(exc)]
    return "\n".join(out)


def render_markdown(report: dict) -> str:
    """For the app: the header, the findings table (marked as seen at run time), loss scale."""
    findings = [Finding.from_dict({**f, "path": _short(f["path"]) if f.get("path") else None})
                for f in report.get("findings") or []]
    parts = [_head(report), ""]
    if _precision_line(report):
        parts += [_precision_line(report), ""]
    parts.append(findings_to_markdown(findings, "Seen at run time"))
    if not findings:
        parts.append(_clean_line(report))
    line = _scale_line(report)
    if line:
        parts.append(line)
    if overhead_line(report):
        parts += ["", overhead_line(report)]
    if steady_line(report):
        parts += ["", steady_line(report)]
    exc = (report.get("exit") or {}).get("exception")
    if exc and not exc.get("caused_by_tool"):
        tb = "\n".join(_traceback_tail(exc))
        parts += ["", "<details><summary>Traceback of the script</summary>", "", "```", tb, "```", "</details>"]
    return "\n".join(parts) + "\n"


def severity_counts(report: dict) -> dict[str, Any]:
    counts = {s.value: 0 for s in Severity}
    for f in report.get("findings") or []:
        counts[f["severity"]] = counts.get(f["severity"], 0) + 1
    return counts


def render_github(report: dict) -> str:
    """GitHub Actions annotations (`::error file=...,line=...::`), one per finding."""
    from ..lint.output import _GH_LEVEL, _gh_escape

    out = []
    for f in report.get("findings") or []:
        props = [f"file={_gh_escape(f['path'], True)}"] if f.get("path") else []
        if f.get("line"):
            props.append(f"line={f['line']}")
        props.append(f"title={_gh_escape(f['rule'] + ' ' + f['name'] + ' (seen at run time)', True)}")
        module = f" [module '{f['module'] or '<root>'}']" if f.get("module") is not None else ""
        out.append(f"::{_GH_LEVEL[f['severity']]} {','.join(props)}::"
                   f"{_gh_escape(f['message'] + module + '. Fix: ' + (f.get('suggestion') or ''))}")
    return "\n".join(out) + ("\n" if out else "")
