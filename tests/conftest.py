"""Shared fixtures. `app_server`: one `python app.py` on a free loopback port for the whole
session, shared by the API test and the browser test (starting it costs ~10 s)."""
from __future__ import annotations

import gc
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
