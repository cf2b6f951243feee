"""Shared fixtures. `app_server`: one `python app.py` on a free loopback port for the whole
session, shared by the API test and the browser test (starting it costs ~10 s)."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def app_server():
    from tests.test_app_harness import AppServer

    server = AppServer()
    try:
        yield server
    finally:
        server.close()
