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
