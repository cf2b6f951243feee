"""Run generated training scripts as `python SCRIPT ARGS` would, without paying torch's import each time.

The recipe tests run dozens of generated scripts. In a fresh interpreter each one spends ~2 CPU
seconds importing torch before its first step; here one long-lived process (the zygote) imports
torch once and forks a child per script. The child is set up as a fresh `python SCRIPT ARGS`
would be: its own session, the working folder, the environment, stdin from /dev/null, stdout
and stderr to files, `sys.argv`, the script's folder first on `sys.path`, `__name__ ==
"__main__"`; it then runs the script and ends through the interpreter's own shutdown (an
uncaught exception prints its traceback and exits 1, `sys.exit(n)` exits n, atexit handlers
run). The zygote runs no torch operation before forking (no thread pool to lose in the fork).

`run(cmd, cwd, env, timeout)` returns a `subprocess.CompletedProcess`, like `subprocess.run(...,
capture_output=True, text=True)`. There is one zygote per set of the variables an interpreter,
torch or OpenMP read as they start (PYTHONPATH, OMP_NUM_THREADS, ...), started with them.
Commands that are not `[sys.executable, SCRIPT, ...]` go to `subprocess.run`, as do all of them
with AMP_TS_NO_ZYGOTE=1 (to compare with fresh interpreters).

`start(cmd, cwd, env, stdout_path, stderr_path)` is the `subprocess.Popen` of it (a `Child`: pid,
poll(), wait(), returncode), for `[sys.executable, SCRIPT, ...]` and `[sys.executable, "-m",
MODULE, ...]` (run as `python -m MODULE` would: the working folder first on `sys.path`); the
trace tests start `python -m troubleshooter.trace.child` through it (tests/conftest.py).
"""
from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading

# Variables read when an interpreter (or torch, or OpenMP) starts: a script needing other values
# than the zygote started with gets a fresh interpreter instead.
_STARTUP_VARS = ("PYTHONPATH", "PYTHONHASHSEED", "PYTHONWARNINGS", "PYTHONDONTWRITEBYTECODE", "PYTHONOPTIMIZE",
                 "PYTHONUNBUFFERED", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "LD_PRELOAD",
                 "LD_LIBRARY_PATH")
# ... and every variable torch may read as it is imported (a child inherits the zygote's torch).
_STARTUP_PREFIXES = ("TORCH_", "PYTORCH_")


# ---------------------------------------------------------------- the zygote (its own process)

def _zygote() -> None:
    import runpy  # noqa: F401 - imported before forking, as torch is

    import torch  # noqa: F401 - the point of the zygote: imported once, no operation run

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    requests = sys.stdin.buffer
    out = sys.stdout
    running: dict[int, str] = {}
    pending = b""
    while True:
        ready, _, _ = select.select([requests, wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
        while running:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            out.write(json.dumps({"id": running.pop(pid), "returncode": os.waitstatus_to_exitcode(status)}) + "\n")
            out.flush()
        if requests in ready:
            chunk = os.read(requests.fileno(), 65536)
            if not chunk:
                return  # the test session ended
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                req = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    signal.set_wakeup_fd(-1)
                    os.close(wake_r)
                    os.close(wake_w)
                    _child(req)  # never returns: the script ends this interpreter
                running[pid] = req["id"]
                out.write(json.dumps({"id": req["id"], "pid": pid}) + "\n")
                out.flush()


def _child(req: dict) -> None:
    """Become `python SCRIPT ARGS` in req's folder and environment, then run the script as __main__."""
    import runpy

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setsid()
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(f, fd)
        os.close(f)
    os.close(null)
    argv = list(req["argv"])
    if argv[0] == "-m":  # `python -m MODULE ARGS`: the working folder first on sys.path, argv[0] the module's file
        sys.argv = argv[1:]
        sys.path[0] = os.getcwd()
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")
    sys.exit(0)


# ---------------------------------------------------------------- the test side

class _Zygote:
    def __init__(self, env: dict):
        self.proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.path.pop(0); "
                                      f"sys.path.insert(0, {os.path.dirname(__file__)!r}); "
                                      "import _scriptrunner; _scriptrunner._zygote()"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=tempfile.gettempdir())
        self.changed = threading.Condition()
        self.replies: dict[str, dict] = {}
        self.count = 0
        self.gone = False  # the zygote's replies ended (it exited or was killed)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            msg = json.loads(line)
            with self.changed:
                self.replies.setdefault(msg["id"], {}).update(msg)
                self.changed.notify_all()
        with self.changed:
            self.gone = True
            self.changed.notify_all()

    def start(self, argv: list[str], cwd, env: dict, stdout: str, stderr: str) -> Child:
        with self.changed:
            self.count += 1
            rid = str(self.count)
            try:
                self.proc.stdin.write((json.dumps({"id": rid, "argv": argv, "cwd": str(cwd), "env": env,
                                                   "stdout": stdout, "stderr": stderr}) + "\n").encode())
                self.proc.stdin.flush()
            except OSError as exc:
                raise OSError(f"the zygote is gone: {exc}") from None
            self.changed.wait_for(lambda: "pid" in self.replies.get(rid, {}) or self.gone, 120)
            pid = self.replies.get(rid, {}).get("pid")
        if pid is None:
            raise OSError("the zygote did not fork the child")
        return Child(self, rid, pid, [sys.executable, *argv])


class Child:
    """A script forked from a zygote, as `subprocess.Popen` shows a child: `pid` (its session and
    process group too), `poll()`, `wait(timeout)`, `returncode`."""

    def __init__(self, zygote: _Zygote, rid: str, pid: int, args: list[str]):
        self._zygote, self._rid, self.pid, self.args = zygote, rid, pid, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            with self._zygote.changed:
                reply = self._zygote.replies.get(self._rid, {})
                if "returncode" in reply:
                    self.returncode = self._zygote.replies.pop(self._rid)["returncode"]
                elif self._zygote.gone:
                    self.returncode = -signal.SIGKILL  # its zygote was killed: nothing will say how it ended
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        with self._zygote.changed:
            if not self._zygote.changed.wait_for(lambda: self.poll() is not None, timeout):
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode


_ZYGOTES: dict[tuple, _Zygote] = {}  # one per set of interpreter start-up variables
_START = threading.Lock()


@atexit.register
def _stop_zygotes() -> None:
    """End of the test session: each zygote reads end-of-file and exits; it is waited for."""
    for zygote in _ZYGOTES.values():
        try:
            zygote.proc.stdin.close()
            zygote.proc.wait(30)
        except (OSError, subprocess.TimeoutExpired):
            zygote.proc.kill()


def zygote_pids() -> set[int]:
    """The zygotes' own processes (their forked children are not among them)."""
    return {z.proc.pid for z in list(_ZYGOTES.values())}


def _zygote_for(env: dict) -> _Zygote:
    key = tuple(env.get(k) for k in _STARTUP_VARS) + tuple(sorted(
        (k, v) for k, v in env.items() if k.startswith(_STARTUP_PREFIXES)))
    with _START:
        zygote = _ZYGOTES.get(key)
        if zygote is None or zygote.proc.poll() is not None:
            zygote = _ZYGOTES[key] = _Zygote(env)
    return zygote


def start(cmd: list[str], cwd, env: dict, stdout: str, stderr: str) -> Child:
    """`subprocess.Popen(cmd, cwd=cwd, env=env, stdin=DEVNULL, stdout=<file>, stderr=<file>,
    start_new_session=True)` for cmd `[sys.executable, SCRIPT, ...]` or `[sys.executable, "-m",
    MODULE, ...]`, forked from a zygote: stdout and stderr go to the files named."""
    if len(cmd) < 2 or cmd[0] != sys.executable or (str(cmd[1]).startswith("-") and cmd[1] != "-m"):
        raise ValueError(f"not `python SCRIPT ...` or `python -m MODULE ...`: {cmd}")
    cwd = os.path.abspath(cwd)  # paths relative to our folder, as Popen takes them (the zygote's is another)
    if not os.path.isdir(cwd):
        raise FileNotFoundError(2, "No such file or directory", cwd)  # what Popen raises
    return _zygote_for(env).start([str(c) for c in cmd[1:]], cwd, env, os.path.abspath(stdout), os.path.abspath(stderr))


def run(cmd: list[str], cwd, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    """`subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)`, with a
    forked child of a zygote when cmd is `[sys.executable, SCRIPT, ARGS...]`."""
    env = dict(os.environ if env is None else env)
    cwd = os.getcwd() if cwd is None else cwd
    if len(cmd) < 2 or cmd[0] != sys.executable or str(cmd[1]).startswith("-") or os.environ.get("AMP_TS_NO_ZYGOTE"):
        return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    with tempfile.TemporaryDirectory(prefix="scriptrun-") as tmp:
        out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        child = start(cmd, cwd, env, out, err)
        try:
            child.wait(timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(child.pid, signal.SIGKILL)  # the script's whole session
            except ProcessLookupError:
                pass
            raise
        with open(out, encoding="utf-8", errors="replace") as fo, open(err, encoding="utf-8", errors="replace") as fe:
            return subprocess.CompletedProcess([sys.executable, *cmd[1:]], child.returncode, fo.read(), fe.read())
