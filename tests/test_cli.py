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
