"""Start the child that runs the user's script, enforce the time limit, read back its result.

The child is a fresh interpreter (`python -m troubleshooter.trace.child`) in its own process
group, so a script that starts DataLoader workers or hangs is stopped as a whole: SIGTERM first
(the child writes what it saw), SIGKILL after a grace period. Works the same when the caller is
itself a worker process (the app's GPU queue).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

from .. import proctree
from ..errors import UserError

GRACE_S = 5.0
OUTPUT_TAIL = 4000
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # the folder holding troubleshooter/


def validate_script(script: str | os.PathLike, cwd: str | None) -> Path:
    """The script as a readable, compilable Python file, or a UserError saying why not."""
    path = Path(script)
    if not path.is_absolute() and cwd and not path.exists():
        path = Path(cwd) / path  # relative to the script's working directory
    if not path.exists():
        raise UserError(f"cannot run {script}: no such file")
    if not path.is_file():
        raise UserError(f"cannot run {script}: not a file")
    try:
        source = path.read_bytes()
    except OSError as exc:
        raise UserError(f"cannot run {script}: {exc.strerror or exc}") from None
    try:
        compile(source, str(path), "exec")
    except SyntaxError as exc:
        raise UserError(f"cannot run {script}: syntax error at line {exc.lineno}: {exc.msg}") from None
    except ValueError as exc:  # e.g. null bytes
        raise UserError(f"cannot run {script}: {exc}") from None
    if cwd is not None and not Path(cwd).is_dir():
        raise UserError(f"cannot run {script}: working directory {cwd} does not exist")
    return path


def device_env(device: str) -> dict[str, str]:
    """Environment that makes the script see the requested device (it cannot be forced otherwise)."""
    d = (device or "auto").strip().lower()
    if d == "auto":
        return {}
    if d == "cpu":
        return {"CUDA_VISIBLE_DEVICES": ""}
    if d == "cuda":
        return {}
    if d.startswith("cuda:") and d[5:].isdigit():
        return {"CUDA_VISIBLE_DEVICES": d[5:]}
    raise UserError(f"unknown device {device!r}: use auto, cpu, cuda or cuda:N")


def run_child(script: Path, argv0: str, args: list[str], steps: int, timeout_s: float, nan: bool,
              headroom: bool, cwd: str | None, device: str,
              progress: Callable[[float, str], None] | None = None, autocast_policy: str = "cuda",
              steady: bool = True) -> dict:
    """Run the script in a child; returns the child's raw result plus how the process ended."""
    env = dict(os.environ)  # in the app a job's minimal environment already (worker.job_environment)
    env.update(device_env(device))
    env["PYTHONPATH"] = _PACKAGE_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    with tempfile.TemporaryDirectory(prefix="amp-trace-") as tmp:
        result_path = os.path.join(tmp, "result.json")
        config = {"script": str(script.resolve()), "argv0": argv0, "args": list(args), "steps": steps,
                  "nan": nan, "headroom": headroom, "result": result_path, "autocast_policy": autocast_policy,
                  "steady": steady}
        config_path = os.path.join(tmp, "config.json")
        with open(config_path, "w") as fh:
            json.dump(config, fh)
        out_path, err_path = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        proctree.become_subreaper()  # what the script daemonises stays ours, to be stopped below
        before = set(proctree.descendants(os.getpid()))
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "troubleshooter.trace.child", config_path],
                    cwd=cwd or str(script.parent), env=env, stdin=subprocess.DEVNULL, stdout=out,
                    stderr=err, start_new_session=True)
            except OSError as exc:
                raise UserError(f"cannot start {script}: {exc}") from None
            with _live_lock:
                _live.add(proc.pid)
            try:
                timed_out, wall = _wait(proc, timeout_s, result_path, steps, progress)
            finally:
                with _live_lock:
                    _live.discard(proc.pid)
            _kill_leftovers(proc, before, _other_traces())
        raw = _read(result_path)
        raw["process"] = {"returncode": proc.returncode, "timed_out": timed_out, "wall_s": round(wall, 3),
                          "stdout_tail": _tail(out_path), "stderr_tail": _tail(err_path)}
        return raw


def _wait(proc, timeout_s: float, result_path: str, steps: int, progress) -> tuple[bool, float]:
    start = time.monotonic()
    deadline = start + timeout_s
    last_seen = -1
    while proc.poll() is None:
        now = time.monotonic()
        if now >= deadline:
            _stop(proc)
            return True, time.monotonic() - start
        if progress is not None:
            seen = _steps_in(result_path)
            if seen != last_seen:
                last_seen = seen
                progress(min(0.99, max(seen, 0) / max(steps, 1)), f"traced {max(seen, 0)} of {steps} steps")
        time.sleep(0.1)
    return False, time.monotonic() - start


def _stop(proc) -> None:
    """SIGTERM to the process group (the child writes its result), SIGKILL after the grace period."""
    for sig, wait in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, GRACE_S)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(wait)
            break
        except subprocess.TimeoutExpired:
            continue
    try:  # the group may outlive the child (DataLoader workers)
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


_live: set[int] = set()  # children of the traces still running in this process (trace_script from threads)
_live_lock = threading.Lock()


def _other_traces() -> set[int]:
    """The children of the other traces this process is running now: their process trees are not
    leftovers of this one (two trace_script calls from threads ran side by side, and the first to
    end killed the other's script, or its DataLoader worker, as a "new descendant")."""
    with _live_lock:
        return set(_live)


def _kill_leftovers(proc, before: set[int], spare: set[int] = frozenset()) -> None:
    """Processes the script started (DataLoader workers, a setsid() or double-forked helper) must
    not outlive the trace: its group, then every process below us that was not there before, but
    for the process trees of the other traces running beside it (`spare`)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proctree.kill_new_descendants(before, spare)


def _steps_in(result_path: str) -> int:
    try:
        with open(result_path) as fh:
            return int(json.load(fh).get("steps_observed", 0))
    except (OSError, ValueError):
        return -1


def _read(result_path: str) -> dict:
    try:
        with open(result_path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


def _tail(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - OUTPUT_TAIL))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
