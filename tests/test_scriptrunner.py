"""tests/_scriptrunner.py: a child forked from the warm zygote behaves as `python -m MODULE ARGS`
started with `subprocess.Popen` would (what the trace tests rely on: tests/conftest.py)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests import _scriptrunner

PROBE = """import json, os, sys, time
if sys.argv[1:] == ["sleep"]:
    time.sleep(600)
print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "name": __name__, "cwd": os.getcwd(),
                  "session": os.getsid(0) == os.getpid(), "stdin": sys.stdin.read(), "env": os.environ.get("PROBE")}))
print("to stderr", file=sys.stderr)
sys.exit(3)
"""


def test_a_module_runs_as_python_dash_m_would_and_reports_its_exit(tmp_path):
    (tmp_path / "probe_mod.py").write_text(PROBE)
    out, err = tmp_path / "out", tmp_path / "err"
    env = {**os.environ, "PROBE": "seen"}
    child = _scriptrunner.start([sys.executable, "-m", "probe_mod", "a", "--b"], tmp_path, env, str(out), str(err))
    assert child.wait(120) == 3 and child.poll() == 3 and child.returncode == 3
    seen = json.loads(out.read_text())
    assert seen == {"argv": [str(tmp_path / "probe_mod.py"), "a", "--b"], "path0": str(tmp_path), "name": "__main__",
                    "cwd": str(tmp_path), "session": True, "stdin": "", "env": "seen"}
    assert err.read_text() == "to stderr\n"


def test_a_running_child_times_out_and_is_stopped_through_its_group(tmp_path):
    (tmp_path / "probe_mod.py").write_text(PROBE)
    child = _scriptrunner.start([sys.executable, "-m", "probe_mod", "sleep"], tmp_path, dict(os.environ),
                                str(tmp_path / "out"), str(tmp_path / "err"))
    assert child.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(0.5)
    os.killpg(child.pid, signal.SIGTERM)
    assert child.wait(60) == -signal.SIGTERM


def test_a_relative_folder_is_ours_and_a_missing_one_fails_as_popen_does(tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "probe_mod.py").write_text(PROBE)
    monkeypatch.chdir(tmp_path)
    child = _scriptrunner.start([sys.executable, "-m", "probe_mod"], "sub", dict(os.environ), "out", "err")
    assert child.wait(120) == 3 and json.loads((tmp_path / "out").read_text())["cwd"] == str(tmp_path / "sub")
    with pytest.raises(FileNotFoundError):
        _scriptrunner.start([sys.executable, "-m", "probe_mod"], "missing", dict(os.environ), "out", "err")


def test_other_command_lines_are_refused(tmp_path):
    with pytest.raises(ValueError):
        _scriptrunner.start([sys.executable, "-c", "pass"], tmp_path, dict(os.environ), "o", "e")
