"""Running the suite's sections: each step guarded, the results written after every step.

A GPU is lent for at most 30 minutes and 10 per command, so the suite must never lose what it
measured: every step's outcome is written to gpu_suite.json and gpu_suite.md as soon as it ends,
the section in flight is marked "running" first (a killed run shows where it stopped), a
failing step is recorded with its error while the next one runs, and a section whose estimate
would pass the suite's time limit is not started (it is listed with the command that runs it).
"""
from __future__ import annotations

import gc
import json
import os
import signal
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

from . import render

JSON_NAME, MD_NAME = "gpu_suite.json", "gpu_suite.md"
DRY_RUN = "cpu dry run"
GPU = "gpu"


class SuiteTimeLimit(BaseException):
    """Raised by the alarm when the suite's time limit passes: not an Exception, so no step's
    guard swallows it; the runner records where it stopped."""


@dataclass(frozen=True)
class Section:
    name: str
    title: str
    run: Callable[["Context", "SectionResult"], None]
    estimate_s: float  # on one H100, by reasoning (not measured): for the time limit only
    what: str  # one line: what it measures, for the report and --list
    waits: bool = False  # its time is spent waiting on other processes: a dry run runs it beside the rest
    alone: bool = False  # stops every process that appears below the suite while it runs: nothing beside it


@dataclass
class Context:
    """What every section gets: the mode, the device, the sizes, and the sections run so far."""
    mode: str  # GPU or DRY_RUN
    device: str  # "cuda:0", or "cpu" in the dry run
    sizes: Any
    out_dir: Path
    packages: dict
    results: dict[str, "SectionResult"]
    app_url: str | None = None
    environment: dict = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)
    deadline: float | None = None

    @property
    def dry_run(self) -> bool:
        return self.mode == DRY_RUN

    def seconds_left(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.perf_counter()

    def data_of(self, section: str) -> dict:
        """An earlier section's data in this run ({} when it did not run)."""
        result = self.results.get(section)
        return result.data if result is not None else {}


@dataclass
class SectionResult:
    name: str
    title: str
    mode: str
    status: str = "not run"  # running | ok | partial | failed | skipped | not run | interrupted
    reason: str | None = None
    error: dict | None = None
    elapsed_s: float | None = None
    estimate_s: float | None = None
    what: str = ""
    steps: list[dict] = field(default_factory=list)
    tables: list[dict] = field(default_factory=list)
    targets: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    data: dict = field(default_factory=dict)
    on_change: Callable[[], None] | None = field(default=None, repr=False)

    # -- what a section writes ----------------------------------------------------------------
    @contextmanager
    def step(self, name: str) -> Iterator[dict]:
        """One guarded unit of work: an exception is recorded as this step's error and the
        section goes on with its next step; the files are rewritten when the step ends."""
        entry = {"name": name, "status": "running", "elapsed_s": None}
        self.steps.append(entry)
        t0 = time.perf_counter()
        try:
            yield entry
            if entry["status"] == "running":
                entry["status"] = "ok"
        except SkipStep as skip:
            entry["status"], entry["reason"] = "skipped", str(skip)
        except Exception as exc:  # noqa: BLE001 - one failing step must not lose the others
            entry["status"], entry["error"] = "failed", error_entry(exc)
            broken = cuda_context_broken()
            if broken:
                self.notes.append(f"after the error in {name!r} the CUDA context is unusable ({broken}): "
                                  "later CUDA steps in this process will fail too")
        finally:
            entry["elapsed_s"] = round(time.perf_counter() - t0, 3)
            self.changed()

    def table(self, title: str, columns: list[str], rows: list[list[Any]], note: str | None = None) -> None:
        self.tables.append({"title": title, "columns": list(columns), "rows": [list(r) for r in rows],
                            "note": note})
        self.changed()

    def target(self, name: str, target: str, value: Any, met: bool | None, note: str | None = None) -> None:
        """A target of the issue: `met` None when it could not be judged (no value)."""
        self.targets.append({"name": name, "target": target, "value": value, "met": met, "note": note})

    def note(self, text: str) -> None:
        self.notes.append(text)

    def changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    # -- the outcome --------------------------------------------------------------------------
    def settle(self) -> None:
        """The section's status from its steps, once it has run without raising."""
        states = [s["status"] for s in self.steps]
        if states and all(s == "skipped" for s in states):
            self.status = "skipped"
            self.reason = self.reason or "; ".join(dict.fromkeys(s.get("reason", "") for s in self.steps))
        elif states and all(s in ("failed", "skipped") for s in states):
            self.status = "failed"
        elif "failed" in states:
            self.status = "partial"
        else:
            self.status = "ok"

    def to_dict(self) -> dict:
        return {"name": self.name, "title": self.title, "mode": self.mode, "status": self.status,
                "reason": self.reason, "error": self.error, "elapsed_s": self.elapsed_s,
                "estimate_s": self.estimate_s, "what": self.what, "steps": self.steps, "tables": self.tables,
                "targets": self.targets, "notes": self.notes, "data": self.data}


class SkipStep(Exception):
    """Raised inside a step that cannot run here (a package missing): recorded as skipped."""


def cpu_seconds() -> float:
    """CPU seconds of this process and of the children it has waited for (user + system)."""
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def cli_json(args: list[str], timeout_s: float = 300) -> tuple[dict, float]:
    """`python -m troubleshooter ARGS --format json` in a new process, as a user first runs it
    (importing torch and loading kernels inside the command's own budget): its JSON and the wall
    seconds timed from outside. Exit 0 and 1 (findings, a cut) are answers; anything else raises."""
    import subprocess
    import sys

    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "troubleshooter", *args, "--format", "json"], capture_output=True,
                          text=True, timeout=timeout_s, cwd=Path(__file__).resolve().parents[2])
    wall = time.perf_counter() - t0
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"exit {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout), wall


def error_entry(exc: BaseException) -> dict:
    text = str(exc).strip()
    return {"type": type(exc).__name__, "message": text.splitlines()[0][:500] if text else "",
            "traceback": traceback.format_exception(type(exc), exc, exc.__traceback__)[-6:]}


def cuda_context_broken() -> str | None:
    """After an error: can the CUDA context still be used? (a device-side assert poisons it)."""
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None


class Suite:
    """The sections of one run, their results, and the two files they are written to."""

    def __init__(self, ctx: Context, sections: list[Section], environment: dict, argv: list[str],
                 time_limit_s: float | None):
        self.ctx, self.sections, self.environment, self.argv = ctx, sections, environment, argv
        self.time_limit_s = time_limit_s
        self.started_at = datetime.now(timezone.utc)
        self.finished_at: datetime | None = None
        if time_limit_s:
            ctx.deadline = ctx.started + time_limit_s
        for s in sections:
            ctx.results[s.name] = SectionResult(s.name, s.title, ctx.mode, estimate_s=s.estimate_s, what=s.what,
                                                on_change=self.write)

    def run(self) -> dict:
        previous = _arm_alarm(self.time_limit_s)
        # what is loaded now (torch, the package) stays: the engine's gc.collect() after each check
        # then walks only what the sections made (0.3 s a call otherwise, most of a tiny check)
        gc.freeze()
        try:
            # a GPU run measures one thing at a time; a dry run overlaps what only waits (the app's jobs)
            beside = [(s, *self._start_beside(s)) for s in self.sections if s.waits and self.ctx.dry_run]
            for section in self.sections:
                if section.alone:
                    self._join(beside)
                if not any(section is b[0] for b in beside):
                    self._run_one(section)
            self._join(beside)
        except SuiteTimeLimit:
            for result in self.ctx.results.values():
                if result.status == "running":
                    result.status = "interrupted"
                    result.reason = f"stopped by the suite's time limit ({self.time_limit_s:g} s) or a SIGTERM"
                elif result.status == "not run" and not result.reason:
                    result.reason = "not started: the suite's time limit had passed"
        finally:
            _disarm_alarm(previous)
            gc.unfreeze()
            self.finished_at = datetime.now(timezone.utc)
            self.write()
        return self.to_dict()

    def _run_one(self, section: Section) -> None:
        result = self.ctx.results[section.name]
        left = self.ctx.seconds_left()
        if left is not None and not self.ctx.dry_run and section.estimate_s > left:
            result.reason = (f"not started: its estimate ({section.estimate_s:.0f} s on one H100) would pass the "
                             f"suite's time limit ({left:.0f} s left); run it alone with --only {section.name}")
            self.write()
            return
        result.status = "running"
        self.write()
        self._execute(section, result)
        self.write()

    def _execute(self, section: Section, result: SectionResult) -> None:
        result.status = "running"
        t0, cpu0 = time.perf_counter(), cpu_seconds()
        try:
            section.run(self.ctx, result)
        except SkipStep as skip:
            result.status, result.reason = "skipped", str(skip)
        except Exception as exc:  # noqa: BLE001 - a broken section must not stop the others
            result.status, result.error = "failed", error_entry(exc)
        finally:
            result.elapsed_s = round(time.perf_counter() - t0, 3)
            # this process and its finished children (sections run beside each other share the count)
            result.data["cpu_s"] = round(cpu_seconds() - cpu0, 2)
        if result.status == "running":
            result.settle()

    def _join(self, beside: list) -> None:
        """Wait for the sections running beside the others and put their results in the report."""
        while beside:
            section, thread, result = beside.pop(0)
            thread.join()
            result.on_change = self.write
            self.ctx.results[section.name] = result
            self.write()

    def _start_beside(self, section: Section) -> tuple[threading.Thread, SectionResult]:
        """Run a section in a thread on a result of its own (the report shows it running until it is
        joined, so the files are never written from two threads)."""
        self.ctx.results[section.name].status = "running"
        self.write()
        own = SectionResult(section.name, section.title, self.ctx.mode, estimate_s=section.estimate_s,
                            what=section.what)
        thread = threading.Thread(target=self._execute, args=(section, own), name=f"section-{section.name}",
                                  daemon=True)
        thread.start()
        return thread, own

    # -- output -------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        from troubleshooter.jsonsafe import jsonable

        done = self.finished_at
        return jsonable({
            "suite": "gpu_suite", "format": 1, "mode": self.ctx.mode, "device": self.ctx.device,
            "started": self.started_at.isoformat(timespec="seconds"),
            "finished": done.isoformat(timespec="seconds") if done else None,
            "elapsed_s": round(time.perf_counter() - self.ctx.started, 1),
            "time_limit_s": self.time_limit_s, "argv": self.argv, "environment": self.environment,
            "order": [s.name for s in self.sections],
            "sections": {s.name: self.ctx.results[s.name].to_dict() for s in self.sections},
        }, nonfinite="null")

    def write(self) -> None:
        write_outputs(self.ctx.out_dir, self.to_dict())


def write_outputs(out_dir: Path, report: dict) -> None:
    """gpu_suite.json and gpu_suite.md, each replaced whole (never half-written)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    _replace(out_dir / JSON_NAME, json.dumps(report, indent=1, sort_keys=False) + "\n")
    _replace(out_dir / MD_NAME, render.markdown(report))


def _replace(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _alarm(signum, frame):  # noqa: ARG001
    raise SuiteTimeLimit()


def _arm_alarm(seconds: float | None):
    """SIGALRM (and SIGTERM, as `timeout` sends) end the run with its results written."""
    if not seconds or not hasattr(signal, "SIGALRM"):
        return None
    try:
        old = (signal.signal(signal.SIGALRM, _alarm), signal.signal(signal.SIGTERM, _alarm))
    except ValueError:  # not the main thread: no alarm, the estimates alone keep the limit
        return None
    signal.setitimer(signal.ITIMER_REAL, seconds)
    return old


def _disarm_alarm(previous) -> None:
    if previous is None:
        return
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous[0])
    signal.signal(signal.SIGTERM, previous[1])


def merge(reports: list[dict]) -> dict:
    """Several runs (e.g. two device calls) into one report: each section from the last run that
    ran it; every run's environment is kept, so a reader sees whether the GPU was the same."""
    if not reports:
        raise ValueError("nothing to merge")
    merged = dict(reports[-1])
    sections, order = {}, []
    for rep in reports:
        for name in rep.get("order", []):
            sec = rep["sections"][name]
            if name not in order:
                order.append(name)
            if sec["status"] != "not run" or name not in sections:
                sections[name] = {**sec, "run_started": rep.get("started")}
    merged.update(order=order, sections=sections,
                  merged_from=[{"started": r.get("started"), "argv": r.get("argv"),
                                "environment": r.get("environment")} for r in reports])
    modes = {r.get("mode") for r in reports}
    if len(modes) > 1:
        raise ValueError(f"cannot merge a GPU run with a CPU dry run ({', '.join(sorted(map(str, modes)))})")
    return merged
