"""N ranks of one of our modules under torch's own launcher (`trace --nproc`, `check --nproc`).

    python -m torch.distributed.run --standalone --nproc_per_node N --max-restarts 0 \
        --log-dir TMP/logs --redirects 3 -m MODULE TMP/config.json

is what `torchrun --standalone --nproc_per_node N` does; MODULE is `troubleshooter.trace.child`
(the user's script, traced) or `troubleshooter.engine.distributed_check` (the check's ranks). Each
rank reads CONFIG, writes its files through `rank_files.RankFiles` into CONFIG["distributed"]["dir"]
and its result to CONFIG["result"] with `{rank}` filled in. torchrun
starts every rank in a session of its own, so stopping torchrun's process group does not stop the
ranks: each rank writes a hello file (pid, main thread) before the script starts, and this module
stops ranks by their own process groups (their DataLoader workers with them), finds any rank that
had not said hello yet by its command line (it holds this run's unique config path), and at the
end kills every process the run left below it (`proctree`: this process is a child subreaper, so a
rank whose torchrun died, or a worker that called setsid(), is still ours), then checks that
nothing of the run is left.

A rank that raises, exits non-zero or dies is named; the others get FOLLOW_S to end on their own
(with gloo a peer's exit often makes them raise too), then each has its Python stack dumped
(faulthandler on SIGUSR1: it works while a rank is blocked inside a collective, where a Python
signal handler would not run), is sent SIGTERM (a rank running Python code writes what it saw and
the line it was at) and, GRACE_S later, SIGKILL. The time limit does the same to every rank.
"""
from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable

from . import proctree
from .errors import UserError
from .trace.locate import is_user_file
from .trace.runner import _PACKAGE_ROOT, _tail, device_env

FOLLOW_S = 5.0  # after a rank failed: time the others get to end on their own
DUMP_WAIT_S = 0.5  # for faulthandler to write a stack
GRACE_S = 3.0  # SIGTERM -> SIGKILL
POLL_S = 0.1
MAX_NPROC_ENV = "AMP_TROUBLESHOOTER_MAX_NPROC"  # the operator's cap on ranks per trace/check
FAILED = ("raised", "exited")


def host_max_nproc(device: str = "auto") -> int:
    """Ranks this host can run: one per visible GPU when the run uses GPUs, else one per CPU core,
    and never more than the operator's cap (AMP_TROUBLESHOOTER_MAX_NPROC)."""
    gpus = 0
    if (device or "auto").strip().lower() != "cpu":
        try:
            import torch
            gpus = torch.cuda.device_count()
        except Exception:  # noqa: BLE001 - no usable CUDA: a CPU host
            gpus = 0
    n = gpus if gpus else (os.cpu_count() or 1)
    cap = os.environ.get(MAX_NPROC_ENV, "").strip()
    if cap.isdigit() and int(cap) >= 1:
        n = min(n, int(cap))
    return max(1, n)


def check_nproc(nproc, device: str = "auto") -> int:
    """nproc as an int from 1 to what this host allows, or a UserError saying why not."""
    if isinstance(nproc, bool) or not isinstance(nproc, int):
        try:
            value = float(nproc)
        except (TypeError, ValueError):
            raise UserError(f"nproc must be a whole number of processes, got {nproc!r}") from None
        if value != int(value):
            raise UserError(f"nproc must be a whole number of processes, got {nproc!r}")
        nproc = int(value)
    limit = host_max_nproc(device)
    if not 1 <= nproc <= limit:
        raise UserError(f"nproc must be from 1 to {limit} on this host (one per "
                        f"{'GPU' if _uses_gpus(device) else 'CPU core'}"
                        + (f", capped by {MAX_NPROC_ENV}" if os.environ.get(MAX_NPROC_ENV) else "") + f"), got {nproc}")
    return nproc


def _uses_gpus(device: str) -> bool:
    if (device or "auto").strip().lower() == "cpu":
        return False
    try:
        import torch
        return torch.cuda.device_count() > 0
    except Exception:  # noqa: BLE001
        return False


def launcher_command(nproc: int, module: str, config_path: str, log_dir: str) -> list[str]:
    """torch's own launcher, as `torchrun --standalone --nproc_per_node N -m MODULE CONFIG` runs it."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
            "--max-restarts", "0", "--log-dir", log_dir, "--redirects", "3", "-m", module, config_path]


def run_ranks(module: str, config: dict, nproc: int, timeout_s: float, cwd: str, device: str = "auto",
              steps: int = 1, progress: Callable[[float, str], None] | None = None) -> dict:
    """Launch, watch and stop N ranks of `module`; returns {"ranks": [each rank's result, with
    "process" and "rank_process" added], "launcher": {...}}. `steps`: what the ranks' state files
    count towards, for `progress`."""
    env = dict(os.environ)
    env.update(device_env(device))
    env["PYTHONPATH"] = _PACKAGE_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.pop("TORCHELASTIC_RUN_ID", None)  # started from inside a torchrun job: still a run of its own
    with tempfile.TemporaryDirectory(prefix="amp-ranks-") as tmp:
        config = {**config, "result": os.path.join(tmp, "result.rank{rank}.json"), "distributed": {"dir": tmp}}
        config_path = os.path.join(tmp, "config.json")
        with open(config_path, "w") as fh:
            json.dump(config, fh)
        log_dir = os.path.join(tmp, "logs")
        command = launcher_command(nproc, module, config_path, log_dir)
        out_path, err_path = os.path.join(tmp, "launcher.stdout"), os.path.join(tmp, "launcher.stderr")
        proctree.become_subreaper()  # ranks (sessions of their own) and what they start stay below us
        before = set(proctree.descendants(os.getpid()))
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            try:
                proc = subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                        stdout=out, stderr=err, start_new_session=True)
            except OSError as exc:
                raise UserError(f"cannot start torch.distributed.run: {exc}") from None
            watch = _Watch(proc, tmp, nproc, config_path, timeout_s, progress, steps, before)
            try:
                watch.run()
            finally:
                leftovers = watch.cleanup()
        ranks = [watch.rank_raw(r) for r in range(nproc)]
        launcher = {"command": command, "nproc": nproc, "returncode": proc.returncode, "timed_out": watch.timed_out,
                    "timeout_s": timeout_s,
                    "wall_s": round(watch.wall, 3), "first_failure": watch.first_failure,
                    "stopped": sorted(watch.stopped), "pids": {"launcher": proc.pid, **{str(r): h.get("pid")
                                                                                        for r, h in watch.hello.items()}},
                    "leftover_processes": leftovers, "stdout_tail": _tail(out_path), "stderr_tail": _tail(err_path)}
        return {"ranks": ranks, "launcher": launcher}


class _Watch:
    """The supervision loop: who said hello, who ended how, when to stop whom."""

    def __init__(self, proc, folder: str, nproc: int, config_path: str, timeout_s: float, progress, steps: int,
                 before: set[int]):
        self.proc, self.folder, self.nproc, self.config_path = proc, folder, nproc, config_path
        self.before = before  # our descendants before the launch: not the run's
        self.timeout_s, self.progress, self.steps = timeout_s, progress, steps
        self.hello: dict[int, dict] = {}
        self.ended: dict[int, dict] = {}  # rank -> {"status", "time"} from its state file
        self.dead: dict[int, float] = {}  # rank -> when its process was found gone without a final result
        self.stopped: set[int] = set()  # ranks this module stopped (after a failure or at the time limit)
        self.starting: set[int] = set()  # ranks stopped before they said hello
        self.stacks: dict[int, str] = {}
        self.timed_out = False
        self.first_failure: dict | None = None
        self.start = time.monotonic()
        self.wall = 0.0
        self._last_steps = -1

    def path(self, rank: int, what: str) -> str:
        return os.path.join(self.folder, f"rank{rank}.{what}")

    def run(self) -> None:
        deadline = self.start + self.timeout_s
        failed_at = None
        while True:
            now = time.monotonic()
            self._poll()
            if len(self.ended) + len(self.dead) >= self.nproc:
                break
            if self.proc.poll() is not None and not any(_alive(self.hello[r]["pid"]) for r in self._running()
                                                        if r in self.hello):
                self._poll()  # torchrun is gone and so is every rank: read what they left
                for r in self._running():
                    self.dead.setdefault(r, time.time())  # never said hello, or died without a result
                break
            if failed_at is None and self._failure() is not None:
                failed_at = now
            if failed_at is not None and now - failed_at >= FOLLOW_S:
                self._stop(self._running())
                break
            if now >= deadline:
                self.timed_out = True
                self._stop(self._running())
                break
            time.sleep(POLL_S)
        self.wall = time.monotonic() - self.start

    def _poll(self) -> None:
        for rank in range(self.nproc):
            if rank not in self.hello:
                hello = _read_json(self.path(rank, "hello.json"))
                if hello:
                    self.hello[rank] = hello
            if rank not in self.ended:
                state = _read_json(self.path(rank, "state.json"))
                if state and state.get("final"):
                    self.ended[rank] = state
            if rank in self.hello and rank not in self.ended and rank not in self.dead \
                    and not _alive(self.hello[rank]["pid"]):
                state = _read_json(self.path(rank, "state.json"))  # it may have ended just now
                if state and state.get("final"):
                    self.ended[rank] = state
                else:
                    self.dead[rank] = time.time()
        if self.progress is not None:
            state = _read_json(self.path(0, "state.json")) or {}
            seen = int(state.get("steps") or 0)
            if seen != self._last_steps:
                self._last_steps = seen
                self.progress(min(0.99, seen / max(self.steps, 1)), f"rank 0 traced {seen} of {self.steps} steps")

    def _failure(self) -> dict | None:
        """The first rank seen to raise, exit non-zero or die (the report decides which one caused it)."""
        failures = [(s.get("time") or 0.0, r, s.get("status")) for r, s in self.ended.items() if s.get("status") in FAILED]
        failures += [(t, r, "crashed") for r, t in self.dead.items()]
        if not failures:
            return None
        when, rank, status = min(failures)
        self.first_failure = {"rank": rank, "status": status}
        return self.first_failure

    def _running(self) -> list[int]:
        return [r for r in range(self.nproc) if r not in self.ended and r not in self.dead]

    def _stop(self, ranks: list[int]) -> None:
        """Stack dump, SIGTERM, SIGKILL for the ranks still running; the launcher after them. A rank
        that has not said hello is still starting (importing torch): killed at once, nothing to say."""
        self._poll()
        known = [r for r in ranks if r in self.hello and _alive(self.hello[r]["pid"])]
        starting = [r for r in ranks if r not in self.hello]
        if starting:
            said = {h["pid"] for h in self.hello.values()}
            for pid in _pids_with(self.config_path):  # torchrun's children not yet ranks that said hello
                if pid != self.proc.pid and pid not in said and proctree._parent_of(pid) == self.proc.pid:
                    proctree.kill_tree(pid)
            self.starting.update(starting)
        for r in known:
            _signal(self.hello[r]["pid"], signal.SIGUSR1, group=False)
        if known:
            time.sleep(DUMP_WAIT_S)
        for r in known:
            self.stacks[r] = _read_text(self.path(r, "stack"))
            _signal(self.hello[r]["pid"], signal.SIGTERM)
        self.stopped.update(ranks)
        end = time.monotonic() + GRACE_S
        while time.monotonic() < end and any(_alive(self.hello[r]["pid"]) for r in known):
            time.sleep(POLL_S)
        for r in known:
            _signal(self.hello[r]["pid"], signal.SIGKILL)
        self._poll()

    def cleanup(self) -> list[dict]:
        """Stop torchrun and every process of the run; the ones still there after that (none expected)."""
        if self.proc.poll() is None:
            try:
                self.proc.wait(GRACE_S)  # all ranks ended: torchrun exits on its own
            except subprocess.TimeoutExpired:
                pass
        proctree.kill_new_descendants(self.before)  # torchrun, the ranks, their workers, what they daemonised
        for pid in _pids_with(self.config_path):  # a rank that left our tree (no subreaper on this system)
            proctree.kill_tree(pid)
        for r, hello in self.hello.items():
            _signal(hello["pid"], signal.SIGKILL)  # its process group, should /proc be unreadable
        try:
            self.proc.wait(GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        end = time.monotonic() + GRACE_S
        left = _pids_with(self.config_path)
        while left and time.monotonic() < end:
            time.sleep(POLL_S)
            left = _pids_with(self.config_path)
        return [{"pid": pid, "command": _cmdline(pid)[:200]} for pid in left]

    def rank_raw(self, rank: int) -> dict:
        """The rank's child result plus how it ended, in the shape `run_child` returns."""
        raw = _read_json(os.path.join(self.folder, f"result.rank{rank}.json")) or {}
        out, err = self._logs(rank)
        hello = self.hello.get(rank, {})
        stopped = rank in self.stopped
        raw["process"] = {"returncode": None, "timed_out": stopped and self.timed_out, "wall_s": round(self.wall, 3),
                          "stdout_tail": out, "stderr_tail": err}
        ended = self.ended.get(rank, {}).get("time") or self.dead.get(rank)
        said = bool(hello) and rank not in self.starting
        raw["rank_process"] = {"rank": rank, "pid": hello.get("pid"), "said_hello": said, "ended_at": ended,
                               "stopped": stopped, "stopped_because": ("time limit" if self.timed_out else
                                                                       "another rank failed") if stopped else None,
                               "died": rank in self.dead,
                               "blocked": _blocked_at(self.stacks.get(rank, ""), hello.get("thread"))
                               if stopped else None}
        return raw

    def _logs(self, rank: int) -> tuple[str, str]:
        """Its stdout/stderr tails from torchrun's --log-dir (LOCAL_RANK folders; one node)."""
        base = glob.glob(os.path.join(self.folder, "logs", "*", "attempt_0", str(rank)))
        if not base:
            return "", ""
        return _tail(os.path.join(base[0], "stdout.log")), _tail(os.path.join(base[0], "stderr.log"))


# -- processes ----------------------------------------------------------------------------------
def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its parent to reap it counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False


def _signal(pid: int, sig: int, group: bool = True) -> None:
    """To the process group a rank leads (its workers too), or the process alone."""
    try:
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError, OSError):
        if group:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError, OSError):
                pass


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return ""


def _pids_with(marker: str) -> list[int]:
    """Live processes whose command line holds `marker` (this run's config path is unique to it)."""
    out = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    me = os.getpid()
    for name in entries:
        if name.isdigit() and int(name) != me and marker in _cmdline(int(name)) and _alive(int(name)):
            out.append(int(name))
    return out


# -- a rank's stack (faulthandler's format) -------------------------------------------------------------
_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-f]+)", re.M)
_FRAME = re.compile(r'^\s+File "(.+)", line (\d+) in (\S+)', re.M)


def _blocked_at(text: str, thread: int | None) -> dict | None:
    """Where the rank's main thread was when it was stopped: the innermost line of the user's files
    and what it was doing there (in a collective, in backward(), or running)."""
    if not text:
        return None
    blocks = list(_THREAD.finditer(text))
    chosen = None
    for i, m in enumerate(blocks):
        end = blocks[i + 1].start() if i + 1 < len(blocks) else len(text)
        if thread is not None and int(m.group(1), 16) == int(thread):
            chosen = text[m.end():end]
    if chosen is None and blocks:
        chosen = text[blocks[-1].end():]
    frames = [(p, int(n), f) for p, n, f in _FRAME.findall(chosen or "")]  # innermost first
    user = next(((p, n, f) for p, n, f in frames if is_user_file(p)), None)
    inner = frames[:frames.index(user)] if user in frames else frames
    norm = [p.replace(os.sep, "/") for p, _, _ in inner]
    if any("/torch/distributed/" in p for p in norm):
        doing = "in a collective (waiting for the other ranks)"
    elif any("/torch/autograd/" in p for p in norm):
        doing = "in backward() (a gradient all-reduce waits for the other ranks)"
    else:
        doing = "running"
    return {"path": user[0] if user else None, "line": user[1] if user else None,
            "function": user[2] if user else None, "doing": doing}


# -- files --------------------------------------------------------------------------------------------
def _read_json(path: str) -> dict | None:
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def _read_text(path: str) -> str:
    try:
        with open(path, errors="replace") as fh:
            return fh.read()[-20000:]
    except OSError:
        return ""
