"""Run a job in a child process so a crash, hang or out-of-memory cannot take the caller down.

The app runs every GPU-bound probe through here, and an opted-in user Python file is only ever
imported inside such a child. The child is started with `spawn` (a clean interpreter: no CUDA
state inherited from the parent, which `fork` would corrupt) and killed at the time limit.
"""
from __future__ import annotations

import multiprocessing
import signal
from typing import Any, Callable

from .errors import UserError


class WorkerError(UserError):
    """The job did not return: it timed out, crashed, or raised. The message is for people."""


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


def run_in_worker(func: Callable[..., Any], *args: Any, timeout_s: float, **kwargs: Any) -> Any:
    """Call module-level `func(*args, **kwargs)` in a spawned child; return its result.

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
    name = getattr(func, "__name__", "job")
    answered = False
    try:
        if not receiver.poll(timeout_s):
            raise WorkerError(f"{name} took longer than its time limit of {timeout_s:g} s and was stopped")
        try:
            status, payload = receiver.recv()
            answered = True
        except EOFError:
            proc.join(5)
            raise WorkerError(f"{name} {_describe_exit(proc.exitcode)}") from None
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
    raise WorkerError(f"{name} failed: {payload}")
