"""The flake8 plugin (`AMP` prefix): flake8 --select AMP reports what `lint` reports, and flake8's
own noqa/ignore apply. flake8 is a dev dependency; these tests skip without it."""
import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from troubleshooter.flake8_plugin import AmpChecker
from troubleshooter.lint import lint_paths

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "lint"


def test_entry_point_is_declared_with_the_amp_prefix():
    entry = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["flake8.extension"]
    assert entry == {"AMP": "troubleshooter.flake8_plugin:AmpChecker"}


def test_checker_yields_flake8_tuples_for_our_findings():
    path = FIXTURES / "bad_AMP101.py"
    lines = path.read_text().splitlines(keepends=True)
    got = list(AmpChecker(ast.parse("".join(lines)), lines, str(path)).run())
    expected = lint_paths([str(path)]).findings
    assert [(line, col + 1, msg.split()[0]) for line, col, msg, _ in got] == \
           [(f.location.line, f.location.column, f.rule) for f in expected]
    assert all(kind is AmpChecker and msg.startswith("AMP") for _, _, msg, kind in got)


def run_flake8(cwd: Path, *argv: str) -> subprocess.CompletedProcess:
    (cwd / ".flake8").write_text(
        "[flake8:local-plugins]\nextension =\n    AMP = troubleshooter.flake8_plugin:AmpChecker\n"
        f"paths = {ROOT}\n")
    return subprocess.run([sys.executable, "-m", "flake8", "--config", ".flake8", *argv],
                          cwd=cwd, capture_output=True, text=True, timeout=120)


def test_flake8_select_amp_runs_our_rules(tmp_path):
    pytest.importorskip("flake8", reason="flake8 is a dev dependency (requirements-dev.txt)")
    for name in ("bad_AMP101.py", "bad_AMP117.py", "good_script_nanogpt.py"):
        shutil.copy(FIXTURES / name, tmp_path / name)
    proc = run_flake8(tmp_path, "--select", "AMP", ".")
    assert proc.returncode == 1, proc.stderr
    got = sorted(proc.stdout.splitlines())
    expected = sorted(f"./{Path(f.location.path).name}:{f.location.line}:{f.location.column}: {f.rule} {f.message}"
                      for f in lint_paths([str(tmp_path / n) for n in ("bad_AMP101.py", "bad_AMP117.py",
                                                                       "good_script_nanogpt.py")]).findings)
    assert got == expected
    assert {line.split(": ")[1].split()[0] for line in got} >= {"AMP101", "AMP117"}


def test_flake8_ignore_and_noqa_apply_to_our_codes(tmp_path):
    pytest.importorskip("flake8", reason="flake8 is a dev dependency (requirements-dev.txt)")
    src = (FIXTURES / "bad_AMP101.py").read_text().splitlines()
    (tmp_path / "train.py").write_text((FIXTURES / "bad_AMP101.py").read_text())
    proc = run_flake8(tmp_path, "--select", "AMP", "--extend-ignore", "AMP101", "train.py")
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout + proc.stderr
    src[12] += "  # noqa: AMP101"
    (tmp_path / "train.py").write_text("\n".join(src) + "\n")
    proc = run_flake8(tmp_path, "--select", "AMP", "train.py")
    lines = proc.stdout.splitlines()
    assert lines and not any(line.startswith("train.py:13:") for line in lines)
