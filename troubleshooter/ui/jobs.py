"""Run a GPU-bound job in a worker process and relay its progress to the page.

The server process must survive whatever a probe does (CUDA error, OOM kill, a hang), so
check and speedup run through `troubleshooter.worker.run_in_worker`. Progress cannot be a
callback across that boundary, so the child appends `fraction<TAB>message` lines to a small
file and the parent polls it: no shared memory, nothing to leak if the child is killed.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
import time
import threading
from typing import Any, Callable

ProgressFn = Callable[[float, str], Any]


class _FileProgress:
    """The `progress(fraction, message)` callable the library calls inside the child."""

    def __init__(self, path: str):
        self.path = path

    def __call__(self, fraction: float, message: str = "") -> None:
        try:
            frac = min(max(float(fraction), 0.0), 1.0)
        except (TypeError, ValueError):
            frac = 0.0
        line = f"{frac:.4f}\t{str(message).replace(chr(10), ' ')}\n"
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line)


def call_with_progress_file(func: Callable, progress_path: str, *args: Any, **kwargs: Any) -> Any:
    """Module-level (picklable) trampoline run in the child: `func(*args, progress=..., **kwargs)`."""
    return func(*args, progress=_FileProgress(progress_path), **kwargs)


def _last_progress(path: str) -> tuple[float, str] | None:
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        frac, _, msg = line.partition("\t")
        try:
            return float(frac), msg
        except ValueError:
            continue
    return None


_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def device_lock(key: str) -> threading.Lock:
    """One lock per physical device: the queue admits one GPU job per accelerator, and this
    keeps two of them from landing on the same one."""
    with _locks_guard:
        return _locks.setdefault(key, threading.Lock())


def run_job(func: Callable, *args: Any, timeout_s: float, progress: ProgressFn | None = None,
            in_worker: bool = True, poll_s: float = 0.25, device_key: str | None = None,
            clock_kwarg: str | None = None, **kwargs: Any) -> Any:
    """Run `func(*args, progress=..., **kwargs)`; in a worker process unless `in_worker=False`.

    `in_worker=False` is for callers whose library call already isolates itself (an opted-in
    Python model file runs in its own child via `spec.run_with_workload`; a worker is a daemon
    and may not start another): `func` then gets `timeout_s` itself, so the operator's limit
    holds there too. With a `device_key`, jobs on one device run one at a time, each in that
    device's warm standby worker (see `worker.WarmPool`). With `clock_kwarg`, `func` gets the
    time the job got its device under that name (`started_at`): a budget then covers the hand-off
    to the worker too, and not the wait for another user's job.
    """
    with device_lock(device_key) if device_key is not None else contextlib.nullcontext():
        started = time.time()
        if clock_kwarg is not None:
            kwargs[clock_kwarg] = started
        result = _run_unlocked(func, args, kwargs, timeout_s, progress, in_worker, poll_s, device_key)
        return timed(result, started, device_key)


def _run_unlocked(func, args, kwargs, timeout_s, progress, in_worker, poll_s, device_key):
    if not in_worker:
        return func(*args, progress=progress, timeout_s=timeout_s, **kwargs)
    from ..worker import run_in_warm_worker, run_in_worker

    fd, path = tempfile.mkstemp(prefix="amp-progress-", suffix=".txt")
    os.close(fd)
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            if device_key is not None:
                outcome["result"] = run_in_warm_worker(device_key, call_with_progress_file, func, path, *args,
                                                       timeout_s=timeout_s, **kwargs)
            else:
                outcome["result"] = run_in_worker(call_with_progress_file, func, path, *args,
                                                  timeout_s=timeout_s, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            outcome["error"] = exc

    if progress is not None:
        try:
            progress(0.0, "handing the job to a worker process")
        except Exception:
            pass
    thread = threading.Thread(target=target, name="job", daemon=True)
    thread.start()
    seen = None
    try:
        while thread.is_alive():
            thread.join(poll_s)
            if progress is not None:
                last = _last_progress(path)
                if last is not None and last != seen:
                    seen = last
                    try:
                        progress(*last)
                    except Exception:  # a closed page must not fail the job
                        pass
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("result")


def timed(result: Any, started: float, device_key: str | None) -> Any:
    """Add the job's own server-side start/end (Unix seconds) to a result under `job` (a dict's
    key, or a typed report's `job` field), so a client can see when it really ran (queue status
    polled from outside can be stale)."""
    job = {"started": round(started, 3), "finished": round(time.time(), 3), "device": device_key}
    if isinstance(result, dict):
        result["job"] = job
    elif hasattr(result, "job"):
        result.job = job
    return result
