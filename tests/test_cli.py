import json
import os
import subprocess
import sys

from troubleshooter.cli import main


def test_help_lists_commands(capsys):
    assert main([]) == 2
    assert "usage" in capsys.readouterr().out


def test_module_entry_point_runs():
    proc = subprocess.run([sys.executable, "-m", "troubleshooter", "--version"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "troubleshooter" in proc.stdout


def test_a_bug_of_ours_is_one_readable_line_with_its_own_exit_status(capsys, monkeypatch):
    """An unexpected exception (say, a data file missing from a broken install) must not dump a
    traceback on the user: one line, exit 3, and the traceback on request."""
    from troubleshooter import cli

    def broken():
        raise FileNotFoundError("vocabulary.json")

    assert cli._guarded(broken, "lint") == cli.INTERNAL_ERROR_EXIT == 3
    err = capsys.readouterr().err
    assert "internal error" in err and "FileNotFoundError: vocabulary.json" in err and "Traceback" not in err
    monkeypatch.setenv(cli.DEBUG_ENV, "1")
    try:
        cli._guarded(broken, "lint")
    except FileNotFoundError:
        pass
    else:
        raise AssertionError("with the debug variable set the exception must propagate")


_ENTRY = """
import atexit, sys
atexit.register(lambda: print("atexit ran, torch imported:", "torch" in sys.modules))
sys.argv = ["amp-troubleshooter"] + sys.argv[1:]
from troubleshooter.cli import entry
entry()
"""


def test_a_torch_command_exits_fast_with_its_output_flushed_and_atexit_handlers_run():
    """`check`/`speedup`/`capability`/`inspect` skip the interpreter's teardown once torch is
    imported (it cost 0.5-2 s of a --budget on a busy host); the piped output must still arrive
    whole, the atexit handlers (worker pools, logging) still run and the exit status stay."""
    block_buffered = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    proc = subprocess.run([sys.executable, "-c", _ENTRY, "capability", "--format", "json"],
                          capture_output=True, text=True, timeout=300, env=block_buffered)
    assert proc.returncode == 0, proc.stderr
    body, _, tail = proc.stdout.rpartition("}")
    assert json.loads(body + "}")["device"]  # the whole JSON object, from a block-buffered pipe
    assert tail.strip() == "atexit ran, torch imported: True"
    bad = subprocess.run([sys.executable, "-c", _ENTRY, "check", "--preset", "no-such-preset"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "error:" in bad.stderr and "Traceback" not in bad.stderr


_LINT_ENTRY = _ENTRY.replace('import atexit, sys', '''import atexit, sys


class _Torn:
    def __del__(self):
        print("torn down")


_torn = _Torn()  # freed only by the interpreter's teardown''')


def test_lint_exits_without_teardown_with_its_output_whole_and_its_status():
    """`lint` skips the interpreter's teardown (~10 ms of a small tree's lint): the block-buffered
    report must still arrive whole, atexit handlers run, the findings' exit status stay, and the
    teardown must really be skipped (a module global's finalizer never runs)."""
    block_buffered = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    bad = os.path.join(os.path.dirname(__file__), "fixtures", "lint", "bad_AMP101.py")
    proc = subprocess.run([sys.executable, "-c", _LINT_ENTRY, "lint", "--no-cache", "--format", "json", bad],
                          capture_output=True, text=True, timeout=120, env=block_buffered)
    assert proc.returncode == 1, proc.stderr
    body, _, tail = proc.stdout.rpartition("}")
    assert {f["rule"] for f in json.loads(body + "}")["findings"]} == {"AMP101"}
    assert tail.strip() == "atexit ran, torch imported: False"
    usage = subprocess.run([sys.executable, "-c", _LINT_ENTRY, "lint", "--no-such-option"],
                           capture_output=True, text=True, timeout=120)
    assert usage.returncode == 2 and "usage:" in usage.stderr
    assert usage.stdout.strip().splitlines()[-1] == "torn down"  # argparse's exit tears down as before
