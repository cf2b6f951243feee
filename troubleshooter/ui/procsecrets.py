"""Keep the server's secrets out of what a job can read about the server process.

Jobs get a minimal environment of their own (`worker.job_environment`), but a process can also
read another's initial environment and command line through /proc/PID/environ and
/proc/PID/cmdline (the command line is world-readable; the environment is readable by the same
user, and by root). So once the options are parsed, the server blanks, in place, the values of
its environment variables a job would not get, and the `--auth` password in its command line:
/proc then shows `AWS_SECRET_ACCESS_KEY=` and `--auth alice:` with the value zeroed. Python's
own copies (`os.environ`, `sys.argv`) are untouched, except the login variable, which the server
has read and needs no longer. Linux only; elsewhere nothing changes.
"""
from __future__ import annotations

import ctypes
import os
import sys
from typing import Callable


def _block(first_field: int) -> tuple[int, int] | None:
    """(start, end) addresses of this process's argv (field 48) or environment (field 50) block."""
    try:
        with open("/proc/self/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2:].split()
    index = first_field - 3  # fields after "pid (comm)" start at field 3
    try:
        start, end = int(fields[index]), int(fields[index + 1])
    except (IndexError, ValueError):
        return None
    return (start, end) if 0 < start < end else None


def _zero(address: int, length: int) -> None:
    if length > 0:
        ctypes.memset(address, 0, length)


def blank_environment(keep: Callable[[str], bool]) -> list[str]:
    """Zero the values of the variables `keep` rejects in this process's initial environment
    block (what /proc/self/environ shows); returns their names."""
    if not sys.platform.startswith("linux"):
        return []
    block = _block(50)
    if block is None:
        return []
    try:
        with open("/proc/self/environ", "rb") as fh:
            data = fh.read()
    except OSError:
        return []
    blanked, offset = [], 0
    for entry in data.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep and value.strip(b"\0") and not keep(name.decode("utf-8", "replace")):
            _zero(block[0] + offset + len(name) + 1, len(value))
            blanked.append(name.decode("utf-8", "replace"))
        offset += len(entry) + 1
    return blanked


def blank_auth_argument() -> bool:
    """Zero the password of `--auth USER:PASS` (or `--auth=USER:PASS`) in this process's command
    line block (what /proc/self/cmdline shows); True when one was found."""
    if not sys.platform.startswith("linux"):
        return False
    block = _block(48)
    if block is None:
        return False
    try:
        with open("/proc/self/cmdline", "rb") as fh:
            data = fh.read()
    except OSError:
        return False
    found, offset, after_flag = False, 0, False
    for arg in data.split(b"\0"):
        value_at = None
        if after_flag:
            value_at = 0
        elif arg.startswith(b"--auth="):
            value_at = len(b"--auth=")
        if value_at is not None and b":" in arg[value_at:]:
            password_at = arg.index(b":", value_at) + 1
            _zero(block[0] + offset + password_at, len(arg) - password_at)
            found = True
        after_flag = arg == b"--auth"
        offset += len(arg) + 1
    return found


def hide_server_secrets(auth: tuple[str, str] | None, auth_env: str) -> None:
    """What the app calls once its options are parsed."""
    from ..worker import ENV_NAMES, ENV_PREFIXES

    keep = lambda name: name in ENV_NAMES or name.startswith(ENV_PREFIXES)  # noqa: E731
    blank_environment(keep)
    if auth is not None:
        blank_auth_argument()
    os.environ.pop(auth_env, None)
