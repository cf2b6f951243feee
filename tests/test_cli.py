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
