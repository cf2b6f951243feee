import os
import time

import pytest

from troubleshooter.errors import SpecError
from troubleshooter.worker import WorkerError, run_in_worker

from . import _worker_jobs as jobs


def test_returns_result():
    assert run_in_worker(jobs.add, 2, b=3, timeout_s=60) == 5


def test_timeout_kills_child_quickly():
    start = time.monotonic()
    with pytest.raises(WorkerError, match="time limit of 1 s"):
        run_in_worker(jobs.sleep_forever, timeout_s=1)
    assert time.monotonic() - start < 30


def test_exception_becomes_readable_message():
    with pytest.raises(WorkerError, match="ValueError: bad value 42") as info:
        run_in_worker(jobs.raise_value_error, timeout_s=60)
    assert "Traceback" not in str(info.value)


def test_user_error_is_reraised_unchanged():
    with pytest.raises(SpecError, match="unknown layer 'Linearr'"):
        run_in_worker(jobs.raise_spec_error, timeout_s=60)


def test_crash_and_signal_are_reported():
    with pytest.raises(WorkerError, match="exited with status 3"):
        run_in_worker(jobs.die_hard, timeout_s=60)
    with pytest.raises(WorkerError, match="SIGKILL.*out of memory"):
        run_in_worker(jobs.kill_self, timeout_s=60)


def test_unpicklable_result():
    with pytest.raises(WorkerError, match="could not be sent back"):
        run_in_worker(jobs.unpicklable, timeout_s=60)


def test_messages_name_no_internal_function():
    with pytest.raises(WorkerError) as info:
        run_in_worker(jobs.sleep_forever, timeout_s=1)
    assert "sleep_forever" not in str(info.value) and "the job" in str(info.value)


def test_warm_pool_runs_each_job_in_the_standby_spawned_ahead():
    from troubleshooter.worker import WarmPool

    pool = WarmPool(preload=("torch",))
    try:
        pool.prepare("cpu")
        ahead = pool.standby_pid("cpu")
        pid, torch_ready = pool.run("cpu", jobs.pid_and_torch, timeout_s=120)
        assert pid == ahead and torch_ready  # the job found PyTorch imported already
        deadline = time.monotonic() + 30  # replaced in the background by a fresh one
        while pool.standby_pid("cpu") in (None, ahead) and time.monotonic() < deadline:
            time.sleep(0.05)
        again = pool.standby_pid("cpu")
        assert again not in (None, ahead)
        # a crash or a time-out in the standby is reported like in a cold worker, and replaced too
        with pytest.raises(WorkerError, match="exited with status 3"):
            pool.run("cpu", jobs.die_hard, timeout_s=60)
        with pytest.raises(WorkerError, match="time limit of 1 s"):
            pool.run("cpu", jobs.sleep_forever, timeout_s=1)
        assert pool.run("cpu", jobs.add, 2, b=3, timeout_s=60) == 5
    finally:
        pool.close()


def test_a_waiting_job_cuts_the_standby_preload_short():
    """The standby imports torch._dynamo after torch (0.8 s here); a job already waiting, such as
    the page's device probe at start-up, must not wait for that: it imports what it needs itself."""
    from troubleshooter.worker import PRELOAD, preload

    assert PRELOAD[:2] == ("torch", "torch._dynamo")
    asked = []

    def waiting():
        asked.append(True)
        return True

    assert preload(("json", "this_module_does_not_exist", "csv"), job_waiting=lambda: False) == ["json", "csv"]
    assert preload(("json", "xml.dom.minidom"), job_waiting=waiting) == ["json"] and asked == [True]


# --- nothing of a job outlives it; jobs see neither the server's secrets nor unbounded memory -----

def _alive(pid: int) -> bool:
    """A live process (a zombie awaiting its parent counts as alive: it is not gone yet)."""
    return os.path.exists(f"/proc/{pid}")


@pytest.mark.parametrize("then, match", [("return", None), ("hang", "time limit"), ("die", "status 4")])
def test_no_process_a_job_started_outlives_it(tmp_path, then, match):
    """A forked child, a setsid() child and a double-forked daemon: none is alive after the job,
    whether it returned, hit its time limit or died."""
    pid_file = tmp_path / "pids"
    if match is None:
        run_in_worker(jobs.leave_children, str(pid_file), then, timeout_s=60)
    else:
        with pytest.raises(WorkerError, match=match):
            run_in_worker(jobs.leave_children, str(pid_file), then, timeout_s=3)
    pids = [int(p) for p in pid_file.read_text().split()]
    assert len(pids) == 3
    assert [p for p in pids if _alive(p)] == []


@pytest.fixture
def job_limits(monkeypatch):
    from troubleshooter import worker

    monkeypatch.setattr(worker, "LIMITS", worker.JobLimits())
    return worker.LIMITS


def test_a_job_sees_a_minimal_environment(job_limits, monkeypatch):
    monkeypatch.setenv("AMP_TROUBLESHOOTER_AUTH", "alice:hunter2")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-key")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    job_limits.clean_env = True
    environ, initial = run_in_worker(jobs.environment, timeout_s=60)
    assert "hunter2" not in initial and "s3cr3t" not in initial
    assert "AMP_TROUBLESHOOTER_AUTH" not in environ and "AWS_SECRET_ACCESS_KEY" not in environ
    assert environ["CUDA_VISIBLE_DEVICES"] == "0" and environ["PATH"] == os.environ["PATH"]
    job_limits.clean_env = False  # the command line's own jobs keep the user's environment
    assert run_in_worker(jobs.environment, timeout_s=60)[0]["AWS_SECRET_ACCESS_KEY"] == "s3cr3t-key"


def test_a_job_over_its_memory_limit_is_told_so(job_limits):
    job_limits.memory_mb = 200
    with pytest.raises(WorkerError, match="ran out of memory.*at most 200 MiB"):
        run_in_worker(jobs.allocate, 400, timeout_s=60)
    assert run_in_worker(jobs.allocate, 20, timeout_s=60) == 20 * 1024 * 1024
