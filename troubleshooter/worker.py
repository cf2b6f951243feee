"""Run a job in a child process so a crash, hang or out-of-memory cannot take the caller down,
and so that nothing the job starts outlives it.

The app runs every GPU-bound probe through here, and an opted-in user Python file is only ever
imported inside such a child. Each job gets a process tree of its own:

    caller ── zygote ── supervisor (new session, child subreaper) ── runner (runs the job) ── whatever it starts

The supervisor is forked from a *zygote* (`troubleshooter.zygote`): a long-lived interpreter the
caller started (with `subprocess`, exactly as a supervisor used to be: same flags, the jobs'
environment, its own session), which imported the preload modules and runs no torch operation and
no thread, so nothing unsafe is inherited. Without a usable zygote (TROUBLESHOOTER_WORKER_ZYGOTE=0,
or one that died) the supervisor is a fresh interpreter of its own, as before; either way it is in
a session of its own, forks the runner and then only reaps. Because it is a child subreaper, a
process the job starts stays below it even after `setsid()` or a double fork. When the job
answers, times out or dies, the caller kills the supervisor's whole tree (`proctree.kill_tree`),
so no child of a job is alive after it. The caller learns how the job ended from the supervisor's
exit status (a forked one writes it to a pipe: the caller is not its parent).

`LIMITS` (set by the app from `--job-memory-mb`) caps each runner's memory with RLIMIT_DATA
(inherited by what it starts) and gives jobs a minimal environment (`job_environment`) instead of
the server's, which may hold the login password and cloud keys.

Starting an interpreter and importing PyTorch costs seconds, so the app keeps one *standby* per
device (`run_in_warm_worker`): forked ahead, PyTorch already imported, it runs exactly one job and
is then replaced, by a fork that takes milliseconds instead of a new interpreter that imports
PyTorch again. Every job still gets a process tree of its own.
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Callable

from . import proctree
from .errors import UserError
from .heap import freeze_imports
from .zygote import ForkedSupervisor, Zygotes, start_python

log = logging.getLogger(__name__)

# Modules a standby child imports while it waits (the slow part of starting a job). torch._dynamo:
# every optimizer step imports it on its first call (torch.optim's `_use_grad`), 0.8 s on this
# 2-core VM, as much as torch itself: paid here instead of inside the job's budget, unless a job
# is already waiting (`preload`).
PRELOAD = ("torch", "torch._dynamo")

# What a job's environment keeps of the server's: what PyTorch, CUDA and the BLAS libraries read,
# locale and paths. Everything else (passwords, tokens, cloud keys) stays in the server.
ENV_NAMES = frozenset({"PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM",
                       "LD_LIBRARY_PATH", "PYTHONHASHSEED", "PYTHONUNBUFFERED", "CC", "CXX"})
ENV_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "CUDNN_", "NCCL_", "CUBLAS_", "CUBLASLT_", "TORCH_", "PYTORCH_",
                "TORCHINDUCTOR_", "TRITON_", "OMP_", "MKL_", "KMP_", "OPENBLAS_", "GOMP_", "HIP_", "ROCR_",
                "ROCM_", "HSA_", "TROUBLESHOOTER_")


@dataclass
class JobLimits:
    """What every job process gets; the app sets these from its options (`ui.server.apply`)."""

    memory_mb: float | None = None  # RLIMIT_DATA of the runner (and what it starts); None: no limit
    clean_env: bool = False  # True: the job sees only `job_environment()`, not the caller's environment


LIMITS = JobLimits()


class WorkerError(UserError):
    """The job did not return: it timed out, crashed, or raised. The message is for people,
    so it names neither server paths nor internal function names."""


def job_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The variables of `environ` (default: this process's) a job may see: ENV_NAMES and those
    starting with ENV_PREFIXES."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if k in ENV_NAMES or k.startswith(ENV_PREFIXES)}


# ---------------------------------------------------------------- the child side


def _child_entry() -> None:
    """`python -c ...` entry of a fresh supervisor (no zygote): become the supervisor."""
    become_supervisor(socket.socket(fileno=int(sys.argv[1])))


def become_supervisor(sock: socket.socket, status_fd: int | None = None) -> None:
    """Be a job's supervisor: child subreaper, fork the runner (which talks to the caller on
    `sock`), then reap. `status_fd`: where one forked by a zygote reports its job's exit status
    (`zygote.ForkedSupervisor`); a fresh one's parent, the caller, reads it from its exit."""
    proctree.become_subreaper()
    runner = os.fork()
    if runner == 0:
        if status_fd is not None:
            os.close(status_fd)  # the job must not hold it: its end-of-file says the supervisor is gone
        _runner_main(Connection(sock.detach()))
        os._exit(0)
    sock.close()  # only the runner talks to the caller: its death must read as end-of-file there
    _supervise(runner, status_fd)


def _supervise(runner: int, status_fd: int | None = None) -> None:
    """Reap every process that ends up below us; when the runner ends, stop what it left behind
    and exit as it did (the caller reads the runner's exit status as ours)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            _report_exit(status_fd, 0)
            os._exit(0)
        except InterruptedError:
            continue
        if pid != runner:
            continue  # an orphan of the job, re-parented to us and now reaped
        proctree.kill_tree(os.getpid(), include_root=False)
        _report_exit(status_fd, os.waitstatus_to_exitcode(status))
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            if sig not in (signal.SIGKILL, signal.SIGSTOP):
                signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)
        os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def _report_exit(status_fd: int | None, code: int) -> None:
    if status_fd is not None:
        try:
            os.write(status_fd, b"exit %d\n" % code)
        except OSError:
            pass  # the caller stopped listening


def preload(names: tuple[str, ...], job_waiting: Callable[[], bool]) -> list[str]:
    """Import `names` in order, the first always; the rest only while no job is waiting, since a job
    that needs one imports it itself (a device probe sent while a standby starts must not wait for
    `torch._dynamo`). Returns what was imported."""
    import importlib

    done = []
    for i, name in enumerate(names):
        if i and job_waiting():
            break
        try:
            importlib.import_module(name)
        except ImportError:
            continue
        done.append(name)
    return done


def _runner_main(conn: Connection) -> None:
    """Take the caller's set-up (sys.path, modules to preload), then one job; answer, then wait
    to be stopped with the rest of the tree."""
    try:
        setup = conn.recv()
    except (EOFError, OSError):
        return
    sys.path[:] = list(setup["sys_path"]) + [p for p in sys.path if p not in setup["sys_path"]]
    preload(setup["preload"], job_waiting=conn.poll)
    try:
        job = conn.recv()
    except (EOFError, OSError):
        return  # the caller went away or retired this standby
    except Exception as exc:  # noqa: BLE001 - the job's function could not be unpickled here
        _send(conn, ("error", f"the job could not be started ({type(exc).__name__}: {exc})"))
        job = None
    if job is not None:
        func, args, kwargs, memory_mb = job
        _limit_memory(memory_mb)
        freeze_imports()  # this process runs one job: what the preload and the job's unpickling imported stays
        _send(conn, _run(func, args, kwargs, memory_mb))
    try:
        conn.recv()  # the caller stops the whole tree once it has the answer
    except (EOFError, OSError):
        pass


def _limit_memory(memory_mb: float | None) -> None:
    """RLIMIT_DATA: heap and private writable mappings (what tensors on the CPU use). Unlike
    RLIMIT_AS it does not count the address space CUDA reserves without using it."""
    if not memory_mb:
        return
    import resource

    limit = int(memory_mb * 1024 * 1024)
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))


def _is_out_of_memory(exc: BaseException) -> bool:
    text = str(exc)
    return isinstance(exc, MemoryError) or "can't allocate memory" in text or "std::bad_alloc" in text


def _run(func: Callable, args: tuple, kwargs: dict, memory_mb: float | None) -> tuple:
    try:
        return ("ok", func(*args, **kwargs))
    except UserError as exc:  # a user's mistake found in the child: re-raised as-is in the parent
        return ("user_error", exc)
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the parent as a message
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return ("memory" if memory_mb and _is_out_of_memory(exc) else "error", text)


def _send(conn: Connection, message) -> None:
    try:
        conn.send(message)
    except Exception as exc:  # noqa: BLE001 - e.g. an unpicklable result
        try:
            conn.send(("error", f"the job's result could not be sent back ({type(exc).__name__}: {exc})"))
        except OSError:
            pass


# ---------------------------------------------------------------- the caller side

class _Worker:
    """One job process tree (supervisor and runner) and our end of the runner's socket. The
    supervisor comes from `zygotes` where it can (`zygote.ForkedSupervisor`), else it is a fresh
    interpreter (`subprocess.Popen`); both read alike (pid, poll, wait, returncode)."""

    def __init__(self, preload: tuple[str, ...], zygotes: Zygotes | None = None):
        proctree.become_subreaper()  # killed jobs' orphans come to us, to be reaped
        self.preload = tuple(preload)
        self._start(zygotes)

    def _start(self, zygotes: Zygotes | None) -> None:
        ours, theirs = socket.socketpair()
        env = job_environment() if LIMITS.clean_env else None
        try:
            self.proc = zygotes.fork(theirs, env) if zygotes is not None else None
            if self.proc is None:
                self.proc = start_python("worker", "_child_entry", theirs, env,
                                         subprocess._args_from_interpreter_flags())
        finally:
            theirs.close()
        self.conn = Connection(ours.detach())
        self.conn.send({"sys_path": list(sys.path), "preload": self.preload})

    @property
    def pid(self) -> int | None:
        """The supervisor's pid (None: its zygote ended before forking it)."""
        return self.proc.pid

    def usable(self) -> bool:
        return self.proc.poll() is None and not self.conn.closed

    def stop(self) -> None:
        """Kill the whole tree: supervisor, runner and everything the job started."""
        if self.proc.pid is not None:  # None: its zygote ended before forking it, nothing was started
            # a forked supervisor is its zygote's child to reap, or ours if that zygote is gone
            proctree.kill_tree(self.proc.pid, reap_root=isinstance(self.proc, ForkedSupervisor))
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
        self.conn.close()

    def run(self, func: Callable, args: tuple, kwargs: dict, timeout_s: float) -> Any:
        try:
            self._send_job((func, args, kwargs, LIMITS.memory_mb))
        except Exception as exc:  # noqa: BLE001 - an unpicklable argument, or a dead worker
            self.stop()
            if isinstance(exc, (OSError, EOFError)):
                raise
            raise WorkerError(f"the job could not be sent to its process ({type(exc).__name__}: {exc})") from None
        return _await(self, timeout_s)

    def _send_job(self, job: tuple) -> None:
        """Send the job; if a zygote was to fork our supervisor and ended first, start a fresh one
        and send it there. Sent before we wait for the fork, so a runner forked early (the zygote
        still importing) finds it waiting and skips the rest of the preload."""
        try:
            self.conn.send(job)
            error = None
        except (OSError, EOFError) as exc:  # a dead worker (or our zygote ended: below)
            error = exc
        if isinstance(self.proc, ForkedSupervisor) and self.proc.pid is None:
            log.warning("the worker zygote ended before starting a job's process; the job starts a fresh one")
            self.conn.close()
            self._start(None)
            self.conn.send(job)
        elif error is not None:
            raise error


def _describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "did not exit"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        if LIMITS.memory_mb:
            hint = f" (most likely over its memory limit of {LIMITS.memory_mb:g} MiB)" \
                if name in ("SIGKILL", "SIGSEGV", "SIGABRT", "SIGBUS") else ""
        else:
            hint = " (most likely out of memory)" if name == "SIGKILL" else ""
        return f"was killed by {name}{hint}"
    return f"exited with status {returncode} without a result"


def _memory_message(detail: str) -> str:
    return (f"the job ran out of memory: this server lets a job use at most {LIMITS.memory_mb:g} MiB "
            f"({detail.splitlines()[0][:200] if detail else 'MemoryError'}); try a smaller model or batch")


def _await(worker: _Worker, timeout_s: float) -> Any:
    """Wait for the job's answer; whatever happens, stop its whole tree; return or raise."""
    try:
        if not worker.conn.poll(timeout_s):
            raise WorkerError(f"the job took longer than its time limit of {timeout_s:g} s and was stopped")
        try:
            status, payload = worker.conn.recv()
        except (EOFError, OSError):
            try:
                worker.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
            raise WorkerError(f"the job's process {_describe_exit(worker.proc.returncode)}") from None
    finally:
        worker.stop()
    if status == "ok":
        return payload
    if status == "user_error":
        raise payload
    if status == "memory":
        raise WorkerError(_memory_message(payload))
    raise WorkerError(f"the job failed: {payload}")


def run_in_worker(func: Callable[..., Any], *args: Any, timeout_s: float, **kwargs: Any) -> Any:
    """Call module-level `func(*args, **kwargs)` in a fresh child process tree; return its result.

    Raises the child's own `UserError` unchanged, and `WorkerError` on a time-out, a crash or
    any other exception (type and message, no traceback).
    """
    if timeout_s <= 0:
        raise ValueError("timeout_s must be positive")
    return _Worker((), _ZYGOTES).run(func, args, kwargs, timeout_s)


class WarmPool:
    """At most one standby per key (a device); taken by a job, replaced right after it."""

    def __init__(self, preload: tuple[str, ...] = PRELOAD):
        self.preload = preload
        self._zygotes = Zygotes(preload)  # one zygote, whatever the key: a device is chosen by the job
        self._standby: dict[str, _Worker] = {}
        self._lock = threading.Lock()

    def prepare(self, key: str) -> None:
        """Start the standby for `key` now (if none is waiting), so the next job starts warm."""
        with self._lock:
            current = self._standby.get(key)
            if current is not None and current.usable():
                return
            self._standby[key] = _Worker(self.preload, self._zygotes)

    def standby_pid(self, key: str) -> int | None:
        """The pid of the standby's supervisor (the job's runner is its child)."""
        with self._lock:
            s = self._standby.get(key)
            return s.pid if s is not None and s.usable() else None

    def _take(self, key: str) -> _Worker:
        with self._lock:
            s = self._standby.pop(key, None)
        if s is None or not s.usable():
            if s is not None:
                s.stop()
            s = _Worker(self.preload, self._zygotes)
        return s

    def run(self, key: str, func: Callable[..., Any], *args: Any, timeout_s: float, **kwargs: Any) -> Any:
        """`run_in_worker`, in the standby for `key`; a new standby is started afterwards."""
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        standby = self._take(key)
        try:
            try:
                return standby.run(func, args, kwargs, timeout_s)
            except (OSError, EOFError):  # the standby died before it took the job
                return run_in_worker(func, *args, timeout_s=timeout_s, **kwargs)
        finally:
            threading.Thread(target=self._refill, args=(key,), daemon=True).start()

    def _refill(self, key: str) -> None:
        try:
            self.prepare(key)
        except Exception:  # noqa: BLE001 - no standby only means the next job starts cold
            pass

    def close(self) -> None:
        """Stop the standbys and retire the zygote (it ends once no job it started runs)."""
        with self._lock:
            standbys, self._standby = list(self._standby.values()), {}
        for s in standbys:
            s.stop()
        self._zygotes.close()


_ZYGOTES = Zygotes(())  # run_in_worker's: the job starts with nothing preloaded, as in a fresh interpreter
POOL = WarmPool()


def run_in_warm_worker(key: str, func: Callable[..., Any], *args: Any, timeout_s: float, **kwargs: Any) -> Any:
    """`run_in_worker` through the process-wide pool's standby for device `key`."""
    return POOL.run(key, func, *args, timeout_s=timeout_s, **kwargs)
