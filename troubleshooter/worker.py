"""Run a job in a child process so a crash, hang or out-of-memory cannot take the caller down.

The app runs every GPU-bound probe through here, and an opted-in user Python file is only ever
imported inside such a child. The child is started with `spawn` (a clean interpreter: no CUDA
state inherited from the parent, which `fork` would corrupt) and killed at the time limit.

Starting a child and importing PyTorch costs seconds, so the app keeps one *standby* child
per device (`run_in_warm_worker`): spawned ahead, PyTorch already imported, it runs exactly
one job and is then replaced. Every job still gets a process of its own.
"""
from __future__ import annotations

import multiprocessing
import signal
import threading
from typing import Any, Callable

from .errors import UserError

# Modules a standby child imports while it waits (the slow part of starting a job).
PRELOAD = ("torch",)


class WorkerError(UserError):
    """The job did not return: it timed out, crashed, or raised. The message is for people,
    so it names neither server paths nor internal function names."""


def _child_main(conn, func: Callable, args: tuple, kwargs: dict) -> None:
    try:
        result = func(*args, **kwargs)
    except UserError as exc:  # a user's mistake found in the child: re-raised as-is in the parent
        _send(conn, ("user_error", exc))
        return
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the parent as a message
        _send(conn, ("error", f"{type(exc).__name__}: {exc}"))
        return
    _send(conn, ("ok", result))


def _standby_main(conn, preload: tuple[str, ...]) -> None:
    """A warm child: import the heavy modules, then wait for one job and run it."""
    import importlib

    for name in preload:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    try:
        job = conn.recv()
    except (EOFError, OSError):
        return  # the parent went away or retired this standby
    if job is None:
        return
    func, args, kwargs = job
    _child_main(conn, func, args, kwargs)


def _send(conn, message) -> None:
    try:
        conn.send(message)
    except Exception as exc:  # e.g. an unpicklable result
        conn.send(("error", f"the job's result could not be sent back ({type(exc).__name__}: {exc})"))
    finally:
        conn.close()


def _describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "did not exit"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = " (most likely out of memory)" if name == "SIGKILL" else ""
        return f"was killed by {name}{hint}"
    return f"exited with status {exitcode} without a result"


def _await(proc, receiver, timeout_s: float) -> Any:
    """Wait for the child's answer; kill it on time-out; return the payload or raise."""
    answered = False
    try:
        if not receiver.poll(timeout_s):
            raise WorkerError(f"the job took longer than its time limit of {timeout_s:g} s and was stopped")
        try:
            status, payload = receiver.recv()
            answered = True
        except EOFError:
            proc.join(5)
            raise WorkerError(f"the job's process {_describe_exit(proc.exitcode)}") from None
    finally:
        receiver.close()
        if answered:
            proc.join(5)  # let a finished child exit cleanly (flush, free GPU memory)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
    if status == "ok":
        return payload
    if status == "user_error":
        raise payload
    raise WorkerError(f"the job failed: {payload}")


def run_in_worker(func: Callable[..., Any], *args: Any, timeout_s: float, **kwargs: Any) -> Any:
    """Call module-level `func(*args, **kwargs)` in a freshly spawned child; return its result.

    Raises the child's own `UserError` unchanged, and `WorkerError` on a time-out, a crash or
    any other exception (type and message, no traceback).
    """
    if timeout_s <= 0:
        raise ValueError("timeout_s must be positive")
    ctx = multiprocessing.get_context("spawn")
    receiver, sender = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child_main, args=(sender, func, args, kwargs), daemon=True)
    proc.start()
    sender.close()  # only the child writes; our copy must close so a dead child reads as EOF
    return _await(proc, receiver, timeout_s)


class _Standby:
    """One spawned child waiting for a job, and our end of its pipe."""

    def __init__(self, preload: tuple[str, ...]):
        ctx = multiprocessing.get_context("spawn")
        self.conn, child_conn = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_standby_main, args=(child_conn, preload), daemon=True)
        self.proc.start()
        child_conn.close()

    def usable(self) -> bool:
        return self.proc.is_alive() and not self.conn.closed

    def retire(self) -> None:
        try:
            self.conn.send(None)
            self.conn.close()
        except OSError:
            pass
        self.proc.join(2)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)


class WarmPool:
    """At most one standby child per key (a device); taken by a job, replaced right after it."""

    def __init__(self, preload: tuple[str, ...] = PRELOAD):
        self.preload = preload
        self._standby: dict[str, _Standby] = {}
        self._lock = threading.Lock()

    def prepare(self, key: str) -> None:
        """Spawn the standby for `key` now (if none is waiting), so the next job starts warm."""
        with self._lock:
            current = self._standby.get(key)
            if current is not None and current.usable():
                return
            self._standby[key] = _Standby(self.preload)

    def standby_pid(self, key: str) -> int | None:
        with self._lock:
            s = self._standby.get(key)
            return s.proc.pid if s is not None and s.usable() else None

    def _take(self, key: str) -> _Standby:
        with self._lock:
            s = self._standby.pop(key, None)
        if s is None or not s.usable():
            if s is not None:
                s.retire()
            s = _Standby(self.preload)
        return s

    def run(self, key: str, func: Callable[..., Any], *args: Any, timeout_s: float, **kwargs: Any) -> Any:
        """`run_in_worker`, in the standby child for `key`; a new standby is spawned afterwards."""
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        standby = self._take(key)
        try:
            standby.conn.send((func, args, kwargs))
        except Exception as exc:  # noqa: BLE001 - an unpicklable argument, or a dead standby
            standby.retire()
            if isinstance(exc, (OSError, EOFError)):
                return run_in_worker(func, *args, timeout_s=timeout_s, **kwargs)
            raise WorkerError(f"the job could not be sent to its process ({type(exc).__name__}: {exc})") from None
        try:
            return _await(standby.proc, standby.conn, timeout_s)
        finally:
            threading.Thread(target=self._refill, args=(key,), daemon=True).start()

    def _refill(self, key: str) -> None:
        try:
            self.prepare(key)
        except Exception:  # noqa: BLE001 - no standby only means the next job starts cold
            pass

    def close(self) -> None:
        with self._lock:
            standbys, self._standby = list(self._standby.values()), {}
        for s in standbys:
            s.retire()


POOL = WarmPool()


def run_in_warm_worker(key: str, func: Callable[..., Any], *args: Any, timeout_s: float, **kwargs: Any) -> Any:
    """`run_in_worker` through the process-wide pool's standby child for device `key`."""
    return POOL.run(key, func, *args, timeout_s=timeout_s, **kwargs)
