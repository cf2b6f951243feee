"""Find and stop every process a job started, including ones that left its process group.

Killing a job's process group misses a child that called `setsid()` (a daemon, a trace script's
helper), and a double-forked grandchild is re-parented away from the job altogether. So:

- the process that runs a job makes itself a *child subreaper* (Linux `PR_SET_CHILD_SUBREAPER`):
  orphans among its descendants are re-parented to it instead of to init, and so stay in its
  tree whatever sessions or groups they create;
- `kill_tree(pid)` walks that tree through /proc, stops every process in it with SIGSTOP (a
  stopped process cannot fork, so the walk converges), then SIGKILLs them all;
- the launcher is a subreaper too, so once the job's process is gone its killed descendants are
  re-parented to the launcher, which reaps them (no zombie is left behind for an init that does
  not reap).

Linux only; elsewhere the process itself and its process group are killed and the rest is
best effort.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

_PR_SET_CHILD_SUBREAPER = 36
_subreaper = False


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (once; True where supported)."""
    global _subreaper
    if _subreaper:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        _subreaper = libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        _subreaper = False
    return _subreaper


def _parents() -> dict[int, int]:
    """pid -> parent pid for every process /proc shows."""
    out = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue  # gone meanwhile
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1:
            out[int(name)] = int(fields[1])
    return out


def descendants(pid: int) -> list[int]:
    """Every process below `pid` in the process tree (children, grandchildren, ...)."""
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    out, todo = [], list(children.get(pid, ()))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, ()))
    return out


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def kill_tree(pid: int, include_root: bool = True, reap_s: float = 2.0, reap_root: bool = False) -> list[int]:
    """SIGKILL every descendant of `pid` (and `pid` itself with `include_root`), frozen first so
    none can fork meanwhile; reap those that end up as our children (`pid` itself only with
    `reap_root`: a `subprocess.Popen` reaps its own). Returns the pids killed."""
    frozen: list[int] = []
    seen: set[int] = set()
    if include_root:
        _signal(pid, signal.SIGSTOP)
    for _ in range(100):  # each round stops what the last one found; stopped processes cannot fork
        new = [p for p in descendants(pid) if p not in seen]
        if not new:
            break
        for p in new:
            _signal(p, signal.SIGSTOP)
            seen.add(p)
            frozen.append(p)
    for p in frozen:
        _signal(p, signal.SIGKILL)
    if include_root:
        try:
            os.killpg(pid, signal.SIGKILL)  # its group too, should /proc be unreadable
        except (ProcessLookupError, PermissionError, OSError):
            pass
        _signal(pid, signal.SIGKILL)
    _reap(frozen + ([pid] if include_root and reap_root else []), {pid, *frozen}, reap_s)
    return ([pid] if include_root else []) + frozen


def _reap(pids: list[int], dying: set[int], wait_s: float) -> None:
    """waitpid the killed processes that are, or become, our children (we are a subreaper: when
    their parent dies they come to us). One whose parent is neither us nor a process being killed
    is someone else's to reap."""
    pending = set(pids)
    deadline = time.monotonic() + wait_s
    while pending:
        for p in list(pending):
            try:
                done, _ = os.waitpid(p, os.WNOHANG)
            except ChildProcessError:  # not (yet) our child
                if _parent_of(p) not in dying:
                    pending.discard(p)  # gone, or another process's to reap
                continue
            if done:
                pending.discard(p)
        if not pending or time.monotonic() > deadline:
            return
        time.sleep(0.005)


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2:].split()
    return int(fields[1]) if len(fields) > 1 else None


def kill_new_descendants(before: set[int], spare: set[int] | frozenset = frozenset()) -> list[int]:
    """Kill (and reap) every descendant of this process that is not in `before` (what it had
    before it started a child), with all below them: a child's setsid() or double-forked helpers,
    which re-parent to us once we are a subreaper. The subtrees of `spare` stay: children of other
    jobs this process still runs side by side (their new processes are not this job's)."""
    me, parents = os.getpid(), _parents()

    def spared(p: int) -> bool:
        for _ in range(64):
            if p in spare:
                return True
            p = parents.get(p, me)
            if p == me:
                return False
        return False

    killed: list[int] = []
    for p in descendants(me):
        if p not in before and p not in killed and not spared(p):
            killed += kill_tree(p, reap_root=True)
    return killed
