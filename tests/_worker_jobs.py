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
    """Which process ran the job, and whether torch was already imported when it started."""
    import sys
    return os.getpid(), "torch" in sys.modules
