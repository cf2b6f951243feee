"""Starting the real server (`python app.py`) on a free loopback port, for the API and browser
tests, plus the serving options themselves (arguments, auth, refusals)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "tests" / "artifacts"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AppServer:
    """`python app.py --port N ...` as a subprocess; `.url` once it answers HTTP."""

    def __init__(self, *args: str, env: dict | None = None, startup_s: float = 120.0):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.log_path = ARTIFACTS / f"server-{self.port}.log"
        full_env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONUNBUFFERED": "1",
                    **(env or {})}
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "app.py", "--host", "127.0.0.1", "--port", str(self.port), *args],
            cwd=ROOT, env=full_env, stdout=self._log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + startup_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"app.py exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(self.url, timeout=2) as resp:
                    if resp.status == 200:
                        break
            except urllib.error.HTTPError as exc:  # 401 etc: up, but behind a login
                if exc.code < 500:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"app.py did not answer within {startup_s:g} s:\n{self.log()}")
            time.sleep(0.2)
        # what the server process had loaded when its page first answered (its jobs run in workers)
        with open(f"/proc/{self.proc.pid}/maps") as maps:
            self.torch_at_start = any("libtorch" in line for line in maps)

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-5000:]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()


def run_app(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", **(env or {})}
    return subprocess.run([sys.executable, "app.py", *args], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


# --- the serving options, parsed without starting anything ------------------------------

from troubleshooter.errors import UserError  # noqa: E402
from troubleshooter.ui import server  # noqa: E402


def test_defaults_bind_loopback_only():
    s = server.settings_from_args([], environ={})
    assert (s.host, s.port, s.auth, s.allow_exec) == ("127.0.0.1", 7860, None, False)
    kw = server.launch_kwargs(s)
    assert kw["server_name"] == "127.0.0.1" and kw["auth"] is None
    assert kw["max_file_size"] == int(server.DEFAULT_MAX_FILE_MB * 1024 * 1024)


def test_auth_from_flag_or_environment():
    assert server.settings_from_args(["--auth", "ann:s3:cret"], environ={}).auth == ("ann", "s3:cret")
    env = {server.AUTH_ENV: "bob:pw"}
    assert server.settings_from_args([], environ=env).auth == ("bob", "pw")
    assert server.settings_from_args(["--auth", "x:y"], environ=env).auth == ("x", "y")
    with pytest.raises(UserError, match="USER:PASS"):
        server.settings_from_args(["--auth", "nopassword"], environ={})


def test_exec_on_network_needs_auth():
    with pytest.raises(UserError, match="--allow-exec"):
        server.settings_from_args(["--host", "0.0.0.0", "--allow-exec"], environ={})
    s = server.settings_from_args(["--host", "0.0.0.0", "--allow-exec", "--auth", "a:b"], environ={})
    assert s.allow_exec and s.auth == ("a", "b")
    assert server.settings_from_args(["--allow-exec"], environ={}).allow_exec


def test_bad_values_are_refused():
    for argv in (["--port", "0"], ["--max-file-mb", "-1"], ["--job-timeout", "0"], ["--job-memory-mb", "100"]):
        with pytest.raises(UserError):
            server.settings_from_args(argv, environ={})
    assert server.settings_from_args(["--job-memory-mb", "4096"], environ={}).job_memory_mb == 4096
    with pytest.raises(UserError, match="IPv6"):  # Gradio wrote http://::1:7860/ and died with a traceback
        server.settings_from_args(["--host", "::1"], environ={})
    with pytest.raises(UserError, match="too broad"):  # every file in the upload folder counts as an upload
        server.settings_from_args([], environ={"GRADIO_TEMP_DIR": "/tmp"})


def test_bad_arguments_exit_2_without_traceback():
    proc = run_app("--auth", "nocolon", "--port", str(free_port()))
    assert proc.returncode == 2, proc.stderr
    assert "error: auth must look like USER:PASS" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_scratch_folders_older_than_the_ttl_are_pruned(monkeypatch, tmp_path):
    """Downloads and uploaded spec files share one scratch root that a long-running server prunes."""
    import os

    from troubleshooter.ui import common

    monkeypatch.setattr(common, "_download_root", tmp_path)
    old = common.fresh_dir(prefix="amp-spec-")
    assert old.parent == tmp_path and old.name.startswith("amp-spec-")
    os.utime(old, (0, 0))  # an hour and more ago
    new = common.fresh_dir()
    assert new.is_dir() and not old.exists()
