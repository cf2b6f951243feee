"""[tool.amp-troubleshooter] in pyproject.toml: select/ignore/per-file-ignores; the CLI overrides it."""
import io
import json
import shutil
from pathlib import Path

import pytest

from troubleshooter.cli import main
from troubleshooter.errors import UserError
from troubleshooter.lint.config import find_pyproject, load_config

FIXTURES = Path(__file__).parent / "fixtures" / "lint"


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project with an AMP101 (error) script, an AMP117 (warning) script and a test copy."""
    shutil.copy(FIXTURES / "bad_AMP101.py", tmp_path / "train.py")
    shutil.copy(FIXTURES / "bad_AMP117.py", tmp_path / "loss.py")
    (tmp_path / "tests").mkdir()
    shutil.copy(FIXTURES / "bad_AMP101.py", tmp_path / "tests" / "test_train.py")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write_config(root: Path, body: str) -> None:
    (root / "pyproject.toml").write_text('[project]\nname = "demo"\n\n[tool.amp-troubleshooter]\n' + body)


def rules_by_file(capsys, *argv) -> tuple[int, dict]:
    code = main(["lint", ".", "--format", "json", *argv])
    out = capsys.readouterr().out
    found: dict = {}
    for f in json.loads(out)["findings"]:
        found.setdefault(Path(f["path"]).as_posix().removeprefix("./"), set()).add(f["rule"])
    return code, found


def test_without_config_every_rule_runs(project, capsys):
    code, found = rules_by_file(capsys)
    assert code == 1
    assert found == {"train.py": {"AMP101"}, "loss.py": {"AMP117"}, "tests/test_train.py": {"AMP101"}}


def test_select_ignore_and_per_file_ignores_apply(project, capsys):
    write_config(project, 'ignore = ["AMP117"]\nper-file-ignores = { "tests/*" = ["AMP101"] }\n')
    code, found = rules_by_file(capsys)
    assert found == {"train.py": {"AMP101"}} and code == 1
    write_config(project, 'select = ["AMP11"]\n')
    assert rules_by_file(capsys)[1] == {"loss.py": {"AMP117"}}


def test_a_pattern_without_slash_matches_the_file_name(project, capsys):
    write_config(project, 'per-file-ignores = { "test_*.py" = ["AMP1"], "loss.py" = ["ALL"] }\n')
    assert rules_by_file(capsys)[1] == {"train.py": {"AMP101"}}


def test_cli_select_and_ignore_replace_the_files_lists(project, capsys):
    write_config(project, 'ignore = ["AMP117"]\nselect = ["AMP101"]\n')
    assert rules_by_file(capsys)[1] == {"train.py": {"AMP101"}, "tests/test_train.py": {"AMP101"}}
    assert rules_by_file(capsys, "--select", "AMP117")[1] == {}  # the file's ignore still holds
    assert rules_by_file(capsys, "--select", "AMP117", "--ignore", "AMP101")[1] == {"loss.py": {"AMP117"}}
    assert rules_by_file(capsys, "--isolated")[1] == {"train.py": {"AMP101"}, "loss.py": {"AMP117"},
                                                       "tests/test_train.py": {"AMP101"}}


def test_config_is_found_from_a_subfolder_and_by_path(project, capsys, monkeypatch):
    write_config(project, 'ignore = ["AMP101"]\n')
    (project / "tests" / "pyproject.toml").write_text('[tool.black]\nline-length = 99\n')  # not ours: skipped
    monkeypatch.chdir(project / "tests")
    assert find_pyproject() == project / "pyproject.toml"
    assert main(["lint", "test_train.py"]) == 0
    capsys.readouterr()
    monkeypatch.chdir(project.parent)
    assert load_config(project / "pyproject.toml").ignore == ["AMP101"]
    assert main(["lint", str(project / "train.py"), "--config", str(project / "pyproject.toml")]) == 0


def test_exit_zero_keeps_findings_but_not_the_status(project, capsys):
    assert main(["lint", "train.py", "--exit-zero"]) == 0
    assert "AMP101" in capsys.readouterr().out
    assert main(["lint", "missing.py", "--exit-zero"]) == 2  # an unreadable input still fails


def test_fix_respects_per_file_ignores(project, capsys):
    from troubleshooter.lint import fix_text

    assert fix_text((project / "train.py").read_text(), path="train.py").applied, "AMP101 has a mechanical fix"
    write_config(project, 'per-file-ignores = { "tests/*" = ["AMP101"] }\n')
    before = (project / "tests" / "test_train.py").read_text()
    main(["lint", "tests/test_train.py", "train.py", "--fix"])
    capsys.readouterr()
    assert (project / "tests" / "test_train.py").read_text() == before
    assert (project / "train.py").read_text() != before


@pytest.mark.parametrize("body, message", [
    ('ignore = ["AMP999"]\n', "unknown rule id AMP999"),
    ('select = "AMP101"\nextend-exclude = ["x"]\n', "unknown key extend-exclude"),
    ('exclude = [3]\n', "must be a list of glob patterns"),
    ('ignore = [1]\n', "must be a list of rule ids"),
    ('per-file-ignores = ["tests/*"]\n', "per-file-ignores must be a table"),
    ('ignore = [\n', "not valid TOML"),
])
def test_bad_settings_are_one_clear_error(project, capsys, body, message):
    write_config(project, body)
    with pytest.raises(UserError, match=message):
        load_config(project / "pyproject.toml")
    assert main(["lint", "train.py"]) == 2  # found by the search too: a broken file naming our table is an error
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


@pytest.mark.parametrize("body", ["tool = 5\n", "[tool\nbroken = \n"])
def test_a_pyproject_that_is_not_ours_is_passed_over(project, capsys, body):
    """`tool = 5` crashed lint (`in 5`); a broken pyproject.toml that never names our table is
    someone else's to fix: linting goes on without settings."""
    (project / "pyproject.toml").write_text(body)
    assert find_pyproject(project) is None
    assert main(["lint", "loss.py"]) == 1 and "AMP117" in capsys.readouterr().out


def test_exclude_drops_findings_and_read_errors_of_matching_files(project, capsys):
    (project / "vendored").mkdir()
    shutil.copy(FIXTURES / "bad_AMP101.py", project / "vendored" / "old.py")
    (project / "vendored" / "py2.py").write_text("print 'hello'\n")  # not Python 3: a read error
    code, found = rules_by_file(capsys)
    assert code == 2 and "vendored/old.py" in found
    write_config(project, 'exclude = ["vendored", "loss.py"]\n')
    code, found = rules_by_file(capsys)
    assert code == 1 and found == {"train.py": {"AMP101"}, "tests/test_train.py": {"AMP101"}}
    # named on the command line (as pre-commit does), an excluded file is still skipped
    assert main(["lint", "vendored/py2.py", "loss.py"]) == 0
    capsys.readouterr()
    assert rules_by_file(capsys, "--exclude", "tests/*,vendored")[1] == {"train.py": {"AMP101"}, "loss.py": {"AMP117"}}


def test_comma_string_is_accepted_like_the_cli(project):
    write_config(project, 'select = "AMP101, AMP11"\n')
    assert load_config().select == ["AMP101", "AMP11"]


@pytest.mark.parametrize("header", ['[tool."amp\\u002Dtroubleshooter"]', "[tool.'amp-troubleshooter']",
                                    '[tool]\n"amp-troubleshooter" = { ignore = ["AMP117"] }\n#'])
def test_a_table_spelled_another_way_is_still_found(project, capsys, header):
    """A pyproject.toml whose bytes cannot spell our table is not parsed (no TOML parser on a small
    lint's start-up); a quoted key, a literal key or an escape still finds it."""
    (project / "pyproject.toml").write_text('[project]\nname = "demo"\n\n' + header + '\nignore = ["AMP117"]\n')
    assert find_pyproject(project) == project / "pyproject.toml"
    assert main(["lint", "loss.py"]) == 0 and "AMP117" not in capsys.readouterr().out


def test_a_pyproject_without_our_table_is_not_parsed(project):
    import subprocess
    import sys

    (project / "pyproject.toml").write_text('[project]\nname = "demo"\n\n[tool.ruff]\nline-length = 100\n')
    code = ("import sys\nfrom troubleshooter.cli import main\nmain(['lint', '--no-cache', 'loss.py'])\n"
            "print(sorted(m for m in sys.modules if m in ('tomllib', 'tomli')))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=project,
                          env={**__import__("os").environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    assert done.stdout.splitlines()[-1] == "[]", done.stdout + done.stderr


@pytest.mark.parametrize("body", [
    '[tool]\namp-troubleshooter.ignore = ["AMP117"]\n',
    'tool.amp-troubleshooter.ignore = ["AMP117"]\n[project]\nname = "demo"\n',
    'tool = { amp-troubleshooter = { ignore = ["AMP117"] } }\n',
    '[ "tool" . \'amp-troubleshooter\' ]\nignore = ["AMP117"]\n',
    '[project]\ndependencies = ["amp-troubleshooter"]\n\n[tool.amp-troubleshooter]\nignore = ["AMP117"]\n',
])
def test_every_place_toml_can_hold_our_table_is_parsed(project, capsys, body):
    (project / "pyproject.toml").write_text(body)
    assert find_pyproject(project) == project / "pyproject.toml"
    assert main(["lint", "loss.py"]) == 0 and "AMP117" not in capsys.readouterr().out


def test_a_pyproject_naming_the_tool_only_as_a_dependency_or_script_is_not_parsed(project):
    """Such a file (this checkout's own, a project that installs the linter) cannot hold our table:
    no TOML parser on the start-up (~4 ms of a small lint)."""
    import subprocess
    import sys

    (project / "pyproject.toml").write_text(
        '[project]\nname = "demo"\ndependencies = ["amp-troubleshooter>=0.1"]\n\n'
        '[project.scripts]\namp-troubleshooter = "troubleshooter.cli:entry"\n\n[tool.ruff]\nline-length = 100\n')
    assert find_pyproject(project) is None
    code = ("import sys\nfrom troubleshooter.cli import main\nmain(['lint', '--no-cache', 'loss.py'])\n"
            "print(sorted(m for m in sys.modules if m in ('tomllib', 'tomli')))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=project,
                          env={**__import__("os").environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    assert done.stdout.splitlines()[-1] == "[]", done.stdout + done.stderr


def test_the_linted_paths_settings_apply_when_run_from_elsewhere(project, capsys, monkeypatch, tmp_path_factory):
    """As ruff and the editor integration: the nearest table above the linted files, not the
    working folder's; a closer table wins; the working folder's when the files have none."""
    write_config(project, 'ignore = ["AMP101"]\nper-file-ignores = { "loss.py" = ["AMP117"] }\n')
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    monkeypatch.chdir(elsewhere)
    assert main(["lint", str(project / "train.py"), str(project / "loss.py")]) == 0
    assert main(["lint", str(project)]) == 0
    capsys.readouterr()
    (project / "tests" / "pyproject.toml").write_text('[tool.amp-troubleshooter]\nselect = ["AMP101"]\n')
    assert main(["lint", str(project / "tests" / "test_train.py")]) == 1  # the closer table: AMP101 selected
    capsys.readouterr()
    shutil.copy(FIXTURES / "bad_AMP101.py", elsewhere / "own.py")
    write_config(elsewhere, 'ignore = ["AMP1"]\n')
    outside = tmp_path_factory.mktemp("outside")
    shutil.copy(FIXTURES / "bad_AMP101.py", outside / "train.py")
    assert main(["lint", str(outside / "train.py")]) == 0  # no table above it: the working folder's
    assert find_pyproject(outside) is None


def test_stdin_takes_the_settings_above_its_name(project, capsys, monkeypatch, tmp_path_factory):
    write_config(project, 'ignore = ["AMP101"]\n')
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
    monkeypatch.setattr("sys.stdin", io.StringIO((FIXTURES / "bad_AMP101.py").read_text()))
    assert main(["lint", "-", "--stdin-filename", str(project / "train.py")]) == 0
    monkeypatch.setattr("sys.stdin", io.StringIO((FIXTURES / "bad_AMP101.py").read_text()))
    assert main(["lint", "-", "--stdin-filename", "train.py"]) == 1  # a bare name: the working folder's (none)
