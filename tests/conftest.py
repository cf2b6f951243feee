"""Shared fixtures. `app_server`: one `python app.py` on a free loopback port for the whole
session, shared by the API test and the browser test (starting it costs ~10 s)."""
from __future__ import annotations

import gc
import os
import subprocess
import sys

import pytest


def pytest_collection_finish(session):
    """Once every test module is imported: the tests' models are tiny, so torch runs them on one
    thread here (two threads spin against each other and the other jobs on a 2-core machine for no
    gain), and what the imports made (torch, gradio, transformers: hundreds of thousands of objects
    that live as long as the session) leaves the garbage collector's walks, which otherwise cost
    about 40% of the in-process check tests' CPU time (BENCHMARKS.md, "Test suite and start-up")."""
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)
    gc.collect()
    gc.freeze()


@pytest.fixture(scope="session")
def app_server():
    from tests.test_app_harness import AppServer

    server = AppServer()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def overflow_spec(tmp_path):
    """tests/fixtures/check/overflow.yaml with the weights it names: layer 2 scaled by 1e5, so its
    outputs pass float16's 65504 (finite in float32 and bfloat16)."""
    from tests.fixtures.check.planted import write_overflow_spec

    write_overflow_spec(tmp_path)
    return tmp_path / "overflow.yaml"


@pytest.fixture(scope="session", autouse=True)
def _lint_cache_outside_the_checkout(tmp_path_factory):
    """`lint` caches results beside the project (.amp_troubleshooter_cache): in tests, in a temporary folder."""
    import os

    folder = tmp_path_factory.mktemp("lint-cache")
    old = os.environ.get("AMP_TROUBLESHOOTER_CACHE_DIR")
    os.environ["AMP_TROUBLESHOOTER_CACHE_DIR"] = str(folder)
    yield folder
    if old is None:
        os.environ.pop("AMP_TROUBLESHOOTER_CACHE_DIR", None)
    else:
        os.environ["AMP_TROUBLESHOOTER_CACHE_DIR"] = old


class _SubprocessForkingTheTraceChild:
    """What `troubleshooter.trace.runner` sees as `subprocess` in tests: its Popen of the trace child
    (`python -m troubleshooter.trace.child CONFIG`, stdout and stderr to files, a session of its own)
    forks from a warm interpreter (tests/_scriptrunner.py); any other call is the real one."""

    def __getattr__(self, name):
        return getattr(subprocess, name)

    @staticmethod
    def Popen(cmd, *, cwd=None, env=None, stdin=None, stdout=None, stderr=None, start_new_session=False, **other):
        from tests import _scriptrunner

        if (not other and start_new_session and stdin == subprocess.DEVNULL and env is not None
                and list(cmd[:3]) == [sys.executable, "-m", "troubleshooter.trace.child"]
                and isinstance(getattr(stdout, "name", None), str) and isinstance(getattr(stderr, "name", None), str)):
            return _scriptrunner.start(cmd, cwd or os.getcwd(), env, stdout.name, stderr.name)
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdin=stdin, stdout=stdout, stderr=stderr,
                                start_new_session=start_new_session, **other)


@pytest.fixture(scope="session", autouse=True)
def _trace_child_from_a_warm_interpreter():
    """An in-process `trace_script` starts its child by forking a zygote that imported torch once,
    not as a fresh interpreter that imports it again (about 1.3 CPU-seconds per trace, ~45 a run).
    The child then runs exactly as `python -m troubleshooter.trace.child` (which imports torch
    first thing anyway). The fresh interpreter stays tested: tests marked `fresh_trace_child`, and
    every trace the app, a worker or the CLI starts (other processes, not patched). Session-wide,
    so module fixtures that trace are covered too. AMP_TS_NO_ZYGOTE=1: fresh interpreters.
    A zygote first started during a trace is a new descendant of this process, which the trace
    would kill as the script's leftover: it holds only other traces' children (a script's
    orphans come to us, the subreaper), so it is spared as they are."""
    try:
        from troubleshooter.trace import runner  # imported at collection already (tests/test_trace.py)
    except ImportError:
        yield None
        return
    if os.environ.get("AMP_TS_NO_ZYGOTE"):
        yield None
        return
    from tests import _scriptrunner

    other_traces = runner._other_traces
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runner, "subprocess", _SubprocessForkingTheTraceChild())
        mp.setattr(runner, "_other_traces", lambda: other_traces() | _scriptrunner.zygote_pids())
        yield runner


@pytest.fixture(autouse=True)
def _fresh_trace_child_where_marked(request, _trace_child_from_a_warm_interpreter, monkeypatch):
    """`@pytest.mark.fresh_trace_child`: this test's traces start `python -m troubleshooter.trace.child`
    as users get it, a fresh interpreter."""
    runner = _trace_child_from_a_warm_interpreter
    if runner is not None and request.node.get_closest_marker("fresh_trace_child"):
        monkeypatch.setattr(runner, "subprocess", subprocess)
