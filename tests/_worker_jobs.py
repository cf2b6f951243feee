"""Module-level jobs for test_worker.py (spawned children import them by name)."""
import os
import time

from troubleshooter.errors import SpecError


def add(a, b=0):
    return a + b


def sleep_forever():
    time.sleep(600)


def raise_value_error():
    raise ValueError("bad value 42")


def raise_spec_error():
    raise SpecError("spec is wrong", problems=["layer 3: unknown layer 'Linearr'"])


def die_hard():
    os._exit(3)


def kill_self():
    import signal
    os.kill(os.getpid(), signal.SIGKILL)


def unpicklable():
    return lambda: None


def pid_and_torch():
    """Which job tree ran the job (its supervisor, the runner's parent), and whether torch was
    already imported when it started."""
    import sys
    return os.getppid(), "torch" in sys.modules


def leave_children(pid_file, then="return"):
    """Start a forked child, a setsid() child and a double-forked daemon, all sleeping; write their
    pids to `pid_file`; then return, hang, or die, as `then` says."""
    import subprocess
    import sys

    pids = []
    child = os.fork()
    if child == 0:
        time.sleep(600)
        os._exit(0)
    pids.append(child)
    pids.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                 start_new_session=True).pid)
    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:  # the classic daemon: fork, setsid, fork again, the middle one exits
        os.setsid()
        grandchild = os.fork()
        if grandchild == 0:
            time.sleep(600)
            os._exit(0)
        os.write(w, str(grandchild).encode())
        os._exit(0)
    os.waitpid(middle, 0)
    pids.append(int(os.read(r, 32)))
    with open(pid_file, "w") as fh:
        fh.write(" ".join(map(str, pids)))
    if then == "hang":
        time.sleep(600)
    if then == "die":
        os._exit(4)
    return pids


def environment():
    """What a job sees of its environment: os.environ and the process's own initial block."""
    with open("/proc/self/environ", "rb") as fh:
        initial = fh.read().decode(errors="replace")
    return dict(os.environ), initial


def allocate(mb):
    block = bytearray(int(mb) * 1024 * 1024)
    return len(block)


def process_facts():
    """Where the job ran: its pid and session, its supervisor (parent) and the supervisor's parent,
    a number from `random` and a temporary file's name."""
    import random
    import tempfile

    supervisor = os.getppid()
    with open(f"/proc/{supervisor}/stat", "rb") as fh:
        above = int(fh.read().rsplit(b")", 1)[1].split()[1])
    return {"pid": os.getpid(), "sid": os.getsid(0), "supervisor": supervisor, "above": above,
            "random": random.random(), "temp": tempfile.mktemp()}


def imported(names):
    import sys
    return {name: name in sys.modules for name in names}


def environ_of(pid):
    with open(f"/proc/{pid}/environ", "rb") as fh:
        return fh.read().decode(errors="replace")
