"""Job supervisors forked from a warm interpreter (troubleshooter/zygote.py). What a job must
find is what a fresh interpreter gave it (tests/test_worker.py, which now runs through a zygote);
here: where the processes come from, and the zygote's own life, end and fallbacks."""
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from troubleshooter import worker, zygote
from troubleshooter.worker import WarmPool, WorkerError, run_in_worker

from . import _worker_jobs as jobs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _gone(pid: int, within_s: float = 10.0) -> bool:
    """Whether process `pid` has ended (a zombie has), or does within `within_s`."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                if fh.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    return True
        except OSError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


def _reap(pid: int) -> None:
    """Reap `pid` if it became our child (we are a subreaper: orphans come to us)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


@pytest.fixture
def clean_limits(monkeypatch):
    monkeypatch.setattr(worker, "LIMITS", worker.JobLimits())
    monkeypatch.delenv(zygote.SWITCH, raising=False)
    return worker.LIMITS


def test_each_job_is_forked_from_the_zygote_into_a_session_of_its_own(clean_limits):
    a = run_in_worker(jobs.process_facts, timeout_s=60)
    b = run_in_worker(jobs.process_facts, timeout_s=60)
    z = worker._ZYGOTES.pid()
    assert z is not None and z != os.getpid()
    for job in (a, b):
        assert job["sid"] == job["supervisor"] != os.getsid(0)  # the supervisor leads the job's session
        assert job["above"] == z  # forked by the zygote, not started by us
    assert a["pid"] != b["pid"] and a["supervisor"] != b["supervisor"]
    assert a["random"] != b["random"] and a["temp"] != b["temp"]  # CPython reseeds a forked child


def test_a_zygote_serves_while_only_a_volatile_variable_changes(clean_limits, monkeypatch):
    """pytest renames the running test in PYTEST_CURRENT_TEST: no new zygote for that, and the job
    sees the value of the moment; any other change gets a zygote started with it."""
    first = run_in_worker(jobs.process_facts, timeout_s=60)["above"]
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "renamed")
    assert run_in_worker(jobs.environment, timeout_s=60)[0]["PYTEST_CURRENT_TEST"] == "renamed"
    assert run_in_worker(jobs.process_facts, timeout_s=60)["above"] == first
    monkeypatch.setenv("AMP_TEST_OTHER", "1")
    assert run_in_worker(jobs.process_facts, timeout_s=60)["above"] != first
    assert _gone(first)  # retired: nothing of it ran any more


def test_the_zygote_starts_with_the_jobs_environment(clean_limits, monkeypatch):
    """A job can read its ancestors' /proc/PID/environ: the zygote's holds only the jobs' variables."""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-key")
    clean_limits.clean_env = True
    facts = run_in_worker(jobs.process_facts, timeout_s=60)
    assert "s3cr3t" not in run_in_worker(jobs.environ_of, facts["above"], timeout_s=60)


def test_without_the_zygote_each_job_starts_a_fresh_interpreter(clean_limits, monkeypatch):
    monkeypatch.setenv(zygote.SWITCH, "0")
    assert run_in_worker(jobs.process_facts, timeout_s=60)["above"] == os.getpid()
    with pytest.raises(WorkerError, match="exited with status 3"):
        run_in_worker(jobs.die_hard, timeout_s=60)
    with pytest.raises(WorkerError, match="SIGKILL.*out of memory"):
        run_in_worker(jobs.kill_self, timeout_s=60)


def test_a_waiting_job_is_forked_before_the_rest_of_the_preload(clean_limits, monkeypatch, tmp_path):
    """As with `torch` then `torch._dynamo`: a job sent while the zygote imports its first module
    (held here until the gate opens, after the job is sent) is forked as soon as that module is in,
    and runs without the rest."""
    gate = tmp_path / "gate"
    monkeypatch.setenv("AMP_TEST_GATE", str(gate))
    zygotes = zygote.Zygotes(("tests._gate_import", "xml.dom.minidom"))
    job = worker._Worker(zygotes.preload, zygotes)
    try:
        job.conn.send((jobs.imported, (["tests._gate_import", "xml.dom.minidom"],), {}, None))
        gate.touch()
        assert worker._await(job, 60) == {"tests._gate_import": True, "xml.dom.minidom": False}
    finally:
        gate.touch()
        job.stop()
        zygotes.close()


def test_the_zygote_and_the_standby_end_with_close(clean_limits):
    pool = WarmPool(preload=())
    pool.prepare("k")
    standby, z = pool.standby_pid("k"), pool._zygotes.pid()
    assert standby is not None and z is not None
    pool.close()
    assert _gone(z, 0) and _gone(standby)


def test_the_zygote_and_its_jobs_end_when_their_owner_dies(tmp_path):
    """However hard the owner dies, the zygote reads end-of-file and stops every job below it."""
    code = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {ROOT!r})
        from troubleshooter.worker import WarmPool
        pool = WarmPool(preload=())
        pool.prepare("k")
        print(pool.standby_pid("k"), pool._zygotes.pid(), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGKILL, done.stderr
    standby, z = map(int, done.stdout.split())
    assert _gone(z) and _gone(standby)
    _reap(z)


def test_a_killed_zygote_is_replaced_by_fresh_interpreters(clean_limits, caplog):
    pool = WarmPool(preload=())
    try:
        pool.prepare("k")
        assert pool.standby_pid("k") is not None
        z = pool._zygotes.pid()
        os.kill(z, signal.SIGKILL)
        assert _gone(z)
        with caplog.at_level(logging.WARNING, logger="troubleshooter.zygote"):
            pool.run("k", jobs.add, 1, timeout_s=60)  # the standby it forked before still works
            facts = pool.run("k", jobs.process_facts, timeout_s=60)
        assert facts["above"] == os.getpid()  # a fresh interpreter, started by us
        assert "ended with status -9; jobs start fresh interpreters" in caplog.text
        with pytest.raises(WorkerError, match="exited with status 3"):
            pool.run("k", jobs.die_hard, timeout_s=60)
    finally:
        pool.close()


@pytest.mark.parametrize("module", ["tests._thread_import", "tests._cuda_initialized_import"])
def test_a_zygote_forks_nothing_once_forking_is_unsafe(clean_limits, caplog, module):
    """Beside a running thread, or once CUDA is initialized, a forked child would be broken: the
    zygote stops and the job starts fresh."""
    pool = WarmPool(preload=(module,))
    try:
        with caplog.at_level(logging.WARNING):
            facts = pool.run("k", jobs.process_facts, timeout_s=60)
        assert facts["above"] == os.getpid()
        assert "ended before starting a job's process" in caplog.text
    finally:
        pool.close()
