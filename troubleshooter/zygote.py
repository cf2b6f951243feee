"""Fork each job's supervisor from a warm interpreter instead of starting a fresh one per job.

A job's process tree (`worker._Worker`) starts with its *supervisor*. A fresh interpreter for it
costs the interpreter's start and then, in the runner, the preload (`import torch, torch._dynamo`:
~2.4 CPU-s on the 2-core VM, 7+ s wall on a GPU host), paid again by every standby that replaces
a used one. A *zygote* pays that once: a long-lived interpreter, started exactly as a supervisor
was (same executable, interpreter flags and environment, stdin /dev/null, a session of its own),
imports the preload modules, runs no torch operation, starts no thread, and then forks one
supervisor per request. The forked child makes itself what the fresh one was: a session of its
own, signal handling back to the defaults, the caller's working folder now; then
`worker.become_supervisor` (child subreaper, fork the runner, reap). CPython reseeds `random` in
a forked child and `tempfile` notices the new pid; what jobs now share is the zygote's
string-hash seed, and its start-up environment in /proc/PID/environ (`VOLATILE` aside).

There is one zygote per owner (a `WarmPool`, and `run_in_worker`'s) for what a fresh supervisor
would be started with: environment, interpreter flags and sys.path. When those change, a new one
starts and the old one ends once its last job has (`Zygotes`).
The control socket (SOCK_SEQPACKET, one message per request) carries the setup first (sys.path,
preload), then per job the job's socket and the write end of a *status pipe*. The caller is no
longer the supervisor's parent, so the supervisor writes its pid there, and the exit status of
its job just before it exits; end-of-file without a status means it was killed (`ForkedSupervisor`
reads this as `subprocess.Popen` would: pid, poll, wait, returncode).

- Priority to a waiting job: a request that arrives while the zygote imports is forked as soon as
  the first preload module (torch) is in, before the rest; the runner then skips what its job
  does not wait for, as a standby always did (`worker.preload`).
- Ending: when the control socket reaches end-of-file (the owner retired the zygote, or died,
  however hard) the zygote kills every job tree still below it, reaps them, and exits. Not
  PR_SET_PDEATHSIG: that fires when the *thread* that started the zygote ends, and standbys are
  refilled from short-lived threads.
- Reaping: the zygote reaps the supervisors (its children). It becomes a subreaper only to shut
  down; while it serves, what a killed job tree leaves goes to the caller (a subreaper,
  `proctree`), which reaps it before its `kill_tree` returns, as before.
- Fallback: a zygote that dies, fails to start, or finds a Python thread running or CUDA
  initialized (forking then is not safe) ends; the caller logs it once and starts fresh
  interpreters from then on, and a job whose request the zygote never forked is started fresh:
  no job fails for it. TROUBLESHOOTER_WORKER_ZYGOTE=0 turns zygotes off.
"""
from __future__ import annotations

import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from . import proctree

log = logging.getLogger(__name__)

SWITCH = "TROUBLESHOOTER_WORKER_ZYGOTE"  # "0": every job's supervisor is a fresh interpreter
FORK_WAIT_S = 120.0  # the longest wait for a fork: the zygote's first import can take 10+ s on a busy host
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])  # the folder holding troubleshooter/
_BOOT = "import sys; sys.path.insert(0, {root!r}); from troubleshooter.{module} import {entry}; {entry}()"
_UNSAFE = 3  # the zygote's exit status when it stopped because forking was no longer safe
# Variables that change from one call to the next and that nothing reads as it starts: pytest names
# the running test in one. A zygote is kept while the rest of the environment is unchanged; the
# job gets these set as the caller has them now.
VOLATILE = ("PYTEST_CURRENT_TEST",)


# ---------------------------------------------------------------- the zygote process


def serve() -> None:
    """`python -c ...` entry of a zygote: import the preload modules, serving requests between
    them, then serve requests until the control socket closes."""
    import importlib

    from .heap import freeze_imports
    from .worker import become_supervisor  # what every supervisor runs, imported once

    ctl = socket.socket(fileno=int(sys.argv[1]))
    setup = json.loads(ctl.recv(1 << 20) or b"null")
    if not setup:
        os._exit(0)
    sys.path[:] = list(setup["sys_path"]) + [p for p in sys.path if p not in setup["sys_path"]]
    wake_r, wake_w = os.pipe()  # SIGCHLD wakes the select loop, to reap finished supervisors
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    own = (ctl, wake_r, wake_w, become_supervisor)
    for i, name in enumerate(setup["preload"]):
        if i:
            _serve(own, block=False)  # a job waiting is forked before the next import
        try:
            importlib.import_module(name)
        except ImportError:
            continue  # the job imports it itself, as in a fresh interpreter
        freeze_imports()  # children do not walk (nor copy) what was imported
    _serve(own, block=True)


def _serve(own: tuple, block: bool) -> None:
    """Fork a supervisor per request and reap the ones that ended; forever when `block`, else
    until no request is waiting."""
    ctl, wake_r = own[:2]
    while True:
        ready = select.select([ctl, wake_r], [], [], None if block else 0)[0]
        if wake_r in ready:
            os.read(wake_r, 4096)
            _reap()
        if ctl not in ready:
            if not block:
                return
            continue
        message, fds, _, _ = socket.recv_fds(ctl, 65536, 2)
        if not message:
            _shutdown()
        if len(fds) != 2:
            for fd in fds:
                os.close(fd)
            continue
        _fork_supervisor(json.loads(message), *fds, own)


def _unsafe_to_fork() -> str | None:
    """Why a forked child would be broken, if it would: a thread would be lost mid-work (with any
    lock it holds), or CUDA, once initialized, does not work in a forked child."""
    if threading.active_count() > 1:
        return f"{threading.active_count()} Python threads are running"
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch, "cuda", None) is not None and torch.cuda.is_initialized():
        return "CUDA is initialized"
    return None


def _fork_supervisor(request: dict, job_fd: int, status_fd: int, own: tuple) -> None:
    reason = _unsafe_to_fork()
    if reason:
        print(f"troubleshooter: the worker zygote stops: {reason}, so forking is not safe (jobs start fresh "
              "interpreters)", file=sys.stderr, flush=True)
        os._exit(_UNSAFE)  # this request and any queued are lost: their callers start fresh interpreters
    pid = os.fork()
    if pid:
        os.close(job_fd)
        os.close(status_fd)
        return
    try:  # the child: become what `python -c _child_entry` was
        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        own[0].close()
        os.close(own[1])
        os.close(own[2])
        os.set_inheritable(status_fd, False)
        for name, value in request["volatile"].items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if request.get("cwd"):
            try:
                os.chdir(request["cwd"])
            except OSError:
                pass
        os.write(status_fd, b"%d\n" % os.getpid())
        own[3](socket.socket(fileno=job_fd), status_fd)  # worker.become_supervisor
    except BaseException:  # noqa: BLE001 - said on stderr, as a fresh interpreter would
        import traceback

        traceback.print_exc()
    finally:
        os._exit(1)  # never back into the zygote's loop


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _shutdown() -> None:
    """The owner closed the control socket or died: stop every job tree still below us, reap, exit."""
    proctree.become_subreaper()  # what the killed supervisors leave comes to us, to be reaped
    proctree.kill_tree(os.getpid(), include_root=False)
    os._exit(0)


# ---------------------------------------------------------------- the caller side


def start_python(module: str, entry: str, sock: socket.socket, env: dict[str, str] | None,
                 flags: list[str]) -> subprocess.Popen:
    """A fresh interpreter running `troubleshooter.MODULE.ENTRY()` with `sock`'s descriptor as its
    argument: how a zygote and a fresh supervisor (`worker`, without a zygote) both start, so a
    forked supervisor begins from what a fresh one would: the same interpreter flags and
    environment, stdin /dev/null, a session of its own."""
    return subprocess.Popen(
        [sys.executable, *flags, "-c", _BOOT.format(root=_PACKAGE_ROOT, module=module, entry=entry),
         str(sock.fileno())],
        pass_fds=[sock.fileno()], env=env, stdin=subprocess.DEVNULL, start_new_session=True)


class ForkedSupervisor:
    """A supervisor a zygote forked, seen as `subprocess.Popen` shows a fresh one: `pid`, `poll()`,
    `wait(timeout)` and `returncode` (negative: killed by that signal). Read from its status
    pipe: its pid first, then `exit N` just before it exits; end-of-file without that means it
    was killed (-SIGKILL). `pid` is None if the zygote ended before forking it."""

    def __init__(self, status_fd: int, zygote: Zygote):
        self._fd = status_fd
        self._zygote = zygote
        self._text = b""
        self._pid: int | None = None
        self._exit: int | None = None
        self.returncode: int | None = None
        os.set_blocking(status_fd, False)

    @property
    def pid(self) -> int | None:
        self._read_until(lambda: self._pid is not None, FORK_WAIT_S)
        if self._pid is None and self.returncode is None:  # the zygote is stuck: end it, and so this wait
            log.warning("the worker zygote forked nothing in %g s; killing it", FORK_WAIT_S)
            self._zygote.kill()
            self._read_until(lambda: self._pid is not None, None)
        return self._pid

    def poll(self) -> int | None:
        self._read_until(lambda: False, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._read_until(lambda: False, timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired("job supervisor", timeout)
        return self.returncode

    def _read_until(self, done, timeout: float | None) -> None:
        """Read the status pipe until `done()`, its end, or `timeout` seconds (None: no limit)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pipe = select.poll()  # not select(): a server's descriptors may number above 1024
        pipe.register(self._fd, select.POLLIN)
        while self.returncode is None and not done():
            left = None if deadline is None else max(0, round((deadline - time.monotonic()) * 1000))
            if not pipe.poll(left):
                return
            chunk = os.read(self._fd, 256)
            if not chunk:
                self._ended()
                return
            self._text += chunk
            *lines, self._text = self._text.split(b"\n")
            for line in lines:
                if line.startswith(b"exit "):
                    self._exit = int(line[5:])
                else:
                    self._pid = int(line)

    def _ended(self) -> None:
        os.close(self._fd)
        self.returncode = -signal.SIGKILL if self._exit is None else self._exit
        self._zygote.release()


def _cwd() -> str | None:
    try:
        return os.getcwd()
    except OSError:
        return None


class Zygote:
    """One zygote process and our end of its control socket. Retired, it ends once the last
    supervisor it forked has (closing the socket would kill that job)."""

    def __init__(self, preload: tuple[str, ...], env: dict[str, str], flags: list[str], key: tuple):
        self.key = key
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = start_python("zygote", "serve", theirs, env, flags)
        finally:
            theirs.close()
        self._ctl = ours
        self._ctl.send(json.dumps({"sys_path": list(sys.path), "preload": list(preload)}).encode())
        self._lock = threading.Lock()
        self._live = 0  # supervisors forked (or asked for) and not yet seen ending
        self._retired = False
        self.reported = False  # its unexpected end was logged

    def fork(self, job_sock: socket.socket, env: dict[str, str]) -> ForkedSupervisor:
        """Ask for a supervisor for the runner's end of the job socket, in `env` (which differs
        from the zygote's at most in VOLATILE); returns at once (the zygote may still be
        importing its first module)."""
        request = {"cwd": _cwd(), "volatile": {name: env.get(name) for name in VOLATILE}}
        read, write = os.pipe()
        try:
            with self._lock:
                socket.send_fds(self._ctl, [json.dumps(request).encode()], [job_sock.fileno(), write])
                self._live += 1
        except BaseException:
            os.close(read)
            raise
        finally:
            os.close(write)
        return ForkedSupervisor(read, self)

    def release(self) -> None:
        with self._lock:
            self._live -= 1
            idle = self._retired and self._live == 0
        if idle:
            self._close()

    def retire(self) -> None:
        with self._lock:
            self._retired = True
            idle = self._live == 0
        if idle:
            self._close()

    def kill(self) -> None:
        """Only the zygote: supervisors it forked go on (they come to us, a subreaper)."""
        self.proc.kill()
        self.proc.wait()

    def _close(self) -> None:
        self._ctl.close()  # end-of-file: the zygote stops what is left below it and exits
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            proctree.kill_tree(self.proc.pid)
            self.proc.wait()


class Zygotes:
    """Where one preload set's supervisors come from (a `WarmPool`'s, or `run_in_worker`'s): one
    zygote for the environment, interpreter flags and sys.path a fresh supervisor would get now,
    started on first need and retired when those change. If a zygote ends on its own or cannot be
    reached, that is logged and this owner starts fresh interpreters from then on."""

    def __init__(self, preload: tuple[str, ...]):
        self.preload = tuple(preload)
        self._current: Zygote | None = None
        self._failed = False
        self._lock = threading.Lock()

    def fork(self, job_sock: socket.socket, env: dict[str, str] | None) -> ForkedSupervisor | None:
        """A supervisor forked for the job socket, or None: start a fresh interpreter instead."""
        if os.environ.get(SWITCH, "1") == "0" or not sys.platform.startswith("linux"):
            return None  # off, or not Linux (as `proctree`, this relies on Linux's /proc and prctl)
        env = dict(os.environ) if env is None else env
        flags = subprocess._args_from_interpreter_flags()
        key = (tuple(sorted((k, v) for k, v in env.items() if k not in VOLATILE)), tuple(flags), tuple(sys.path))
        retired = None
        with self._lock:
            z = self._current
            if z is not None and self.ended(z):
                self._current, z = None, None
                self._failed = True
            if self._failed:
                return None
            if z is not None and z.key != key:
                retired, z = z, None
            try:
                if z is None:
                    z = self._current = Zygote(self.preload, env, flags, key)
                    log.debug("worker zygote %d started for preload %s%s", z.proc.pid, self.preload,
                              " (the environment, flags or sys.path changed)" if retired else "")
                forked = z.fork(job_sock, env)
            except OSError as exc:
                log.warning("the worker zygote cannot be used (%s); jobs start fresh interpreters", exc)
                self._current, self._failed = None, True
                forked = None
        if retired is not None:
            retired.retire()
        return forked

    @staticmethod
    def ended(z: Zygote) -> bool:
        """Whether `z` has ended (died, or was killed as stuck: we never retire the current one); logged once."""
        code = z.proc.poll()
        if code is not None and not z.reported:
            z.reported = True
            log.warning("the worker zygote (pid %d) ended with status %d; jobs start fresh interpreters",
                        z.proc.pid, code)
        return code is not None

    def pid(self) -> int | None:
        """The current zygote's pid (None before the first fork, after `close`, and on fresh launches)."""
        z = self._current
        return z.proc.pid if z is not None else None

    def close(self) -> None:
        """Retire the zygote: it ends now, or when the last job it forked has."""
        with self._lock:
            z, self._current = self._current, None
        if z is not None:
            z.retire()
