"""The lint/rules command line: formats, exit codes, select/ignore, noqa, stdin, fixes."""
import io
import json
import sys
from pathlib import Path

import pytest

from troubleshooter.cli import main
from troubleshooter.lint import fix_text, lint_paths, lint_text
from troubleshooter.lint.rules import RULES

FIXTURES = Path(__file__).parent / "fixtures" / "lint"
BAD101 = str(FIXTURES / "bad_AMP101.py")
CLEAN = sorted(FIXTURES.glob("good_script_*.py")) + [FIXTURES / "good_notebook.ipynb"]


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("path", CLEAN, ids=lambda p: p.name)
def test_realistic_correct_scripts_have_no_error_or_warning(path):
    report = lint_paths([str(path)])
    assert report.errors == []
    assert [(f.rule, f.location.line) for f in report.findings if f.severity.value != "info"] == []
    assert report.exit_code == 0


def test_json_format_is_the_contract(capsys):
    code, out, _ = run(capsys, "lint", BAD101, "--format", "json")
    assert code == 1
    data = json.loads(out)
    assert set(data) == {"findings", "errors"} and data["errors"] == []
    f = data["findings"][0]
    assert {"path", "line", "column", "rule", "name", "severity", "message", "suggestion"} <= set(f)
    assert (f["rule"], f["name"], f["severity"], f["line"]) == ("AMP101", "clip-before-unscale", "error", 13)


def test_text_and_github_formats(capsys):
    code, out, _ = run(capsys, "lint", BAD101)
    assert code == 1
    assert f"{BAD101}:13:9: AMP101 [error]" in out and "fix: add `scaler.unscale_(optimizer)`" in out
    assert "Found 4 problems (4 errors, 0 warnings, 0 info)" in out
    code, out, _ = run(capsys, "lint", BAD101, "--format", "github")
    first = out.splitlines()[0]
    assert first.startswith(f"::error file={BAD101},line=13,col=9,title=AMP101 clip-before-unscale::")


def test_select_ignore_prefixes_and_unknown_ids(capsys):
    bad106 = str(FIXTURES / "bad_AMP106.py")
    assert {f.rule for f in lint_paths([bad106], select="AMP10").findings} == {"AMP106"}
    assert lint_paths([bad106], select="AMP101,AMP102").findings == []
    assert "AMP106" not in {f.rule for f in lint_paths([bad106], ignore="amp106").findings}
    for option in ("--select", "--ignore"):
        code, _, err = run(capsys, "lint", bad106, option, "AMP999")
        assert code == 2 and "unknown rule id" in err and "AMP999" in err
    code, _, err = run(capsys, "rules", "AMP000")
    assert code == 2 and "unknown rule id" in err


def test_noqa_bare_and_with_codes():
    src = ("import torch\nscaler = torch.amp.GradScaler('cuda')\nscaler.scale(loss).backward()\n"
           "torch.nn.utils.clip_grad_norm_(ps, 1.0){}\nscaler.step(opt)\nscaler.update()\n")
    assert [f.rule for f in lint_text(src.format("")).findings] == ["AMP101"]
    assert lint_text(src.format("  # noqa")).findings == []
    assert lint_text(src.format("  # noqa: AMP101")).findings == []
    assert lint_text(src.format("  # noqa: AMP102, AMP101")).findings == []
    assert lint_text(src.format("  # NOQA:AMP1")).findings == []
    assert [f.rule for f in lint_text(src.format("  # noqa: AMP102")).findings] == ["AMP101"]


def test_exit_zero_when_only_info(capsys):
    code, out, _ = run(capsys, "lint", str(FIXTURES / "bad_AMP121.py"))
    assert code == 0 and "AMP121 [info]" in out


def test_stdin_and_rules_listing(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(Path(BAD101).read_bytes())))
    code, out, _ = run(capsys, "lint", "-", "--format", "json")
    assert code == 1 and json.loads(out)["findings"][0]["path"] == "-"
    code, out, _ = run(capsys, "rules")
    assert code == 0 and all(rule.id in out for rule in RULES)
    code, out, _ = run(capsys, "rules", "amp101")
    assert code == 0 and "scaler.unscale_(optimizer)" in out and "Why it matters" in out
    code, out, _ = run(capsys, "rules", "--format", "json")
    listed = json.loads(out)
    assert [r["id"] for r in listed] == [rule.id for rule in RULES]
    assert all(r["summary"] and r["why"] and r["severity"] in ("error", "warning", "info") for r in listed)
    assert [r["url"].rsplit("/", 1)[1] for r in listed] == [f"{rule.id}.md" for rule in RULES]
    assert {r["id"] for r in listed if r["fixable"]} == {rule.id for rule in RULES if rule.fixable}


def test_fix_text_rewrites_deprecated_api_and_inserts_unscale():
    src = ("import torch\nfrom torch.cuda.amp import autocast, GradScaler\n\nscaler = GradScaler(init_scale=1024)\n\n\n"
           "def train(model, loader, opt):\n    for x in loader:\n        with autocast(dtype=torch.float16):\n"
           "            loss = model(x).sum()\n        scaler.scale(loss).backward()\n"
           "        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n        scaler.step(opt)\n"
           "        scaler.update()\n    with torch.cuda.amp.autocast(enabled=True):\n        pass\n")
    result = fix_text(src, "train.py")
    assert sorted(f.rule for f in result.applied) == ["AMP101", "AMP106", "AMP106"]
    fixed = result.fixed_text
    assert "from torch.amp import autocast, GradScaler" in fixed
    assert 'GradScaler("cuda", init_scale=1024)' in fixed and 'autocast("cuda", dtype=torch.float16)' in fixed
    assert 'torch.amp.autocast("cuda", enabled=True)' in fixed
    assert "        scaler.unscale_(opt)\n        torch.nn.utils.clip_grad_norm_" in fixed
    assert result.diff.startswith("--- a/train.py\n+++ b/train.py")
    assert {f.rule for f in lint_text(fixed).findings} == set()
    assert fix_text(fixed).applied == []


def test_fix_text_leaves_unsafe_forms_alone():
    # positional args would change meaning in the torch.amp signatures; a noqa line is not touched
    src = ("import torch\nwith torch.cuda.amp.autocast(True):\n    pass\n"
           "s = torch.cuda.amp.GradScaler()  # noqa: AMP106\n")
    result = fix_text(src)
    assert result.applied == [] and result.fixed_text == src and result.diff == ""


def test_cli_diff_and_fix(tmp_path, capsys):
    p = tmp_path / "t.py"
    p.write_text("import torch\nscaler = torch.cuda.amp.GradScaler()\n")
    code, out, _ = run(capsys, "lint", str(p), "--diff")
    assert code == 1 and '+scaler = torch.amp.GradScaler("cuda")' in out  # 1: --diff would change something
    assert "torch.cuda.amp" in p.read_text()
    code, out, _ = run(capsys, "lint", str(p), "--fix")
    assert code == 0 and p.read_text() == 'import torch\nscaler = torch.amp.GradScaler("cuda")\n'


def test_exit_two_when_a_path_fails_but_others_are_reported(tmp_path, capsys):
    bad = tmp_path / "broken.py"
    bad.write_text("def f(:\n")
    code, out, err = run(capsys, "lint", str(bad), BAD101, "--format", "json")
    assert code == 2
    data = json.loads(out)
    assert data["errors"][0]["line"] == 1 and data["findings"]
    assert "Traceback" not in err


def test_columns_count_characters_not_bytes():
    src = "import torch\nπ = 1; s = torch.cuda.amp.GradScaler()\n"
    (f,) = lint_text(src).findings
    assert (f.rule, f.location.line, f.location.column) == ("AMP106", 2, 12)
    assert fix_text(src).fixed_text == 'import torch\nπ = 1; s = torch.amp.GradScaler("cuda")\n'


def test_python_api_contract():
    from troubleshooter.errors import UserError
    from troubleshooter.lint import all_rules, explain_rule, get_rule

    nb = (FIXTURES / "bad_notebook.ipynb").read_text()
    report = lint_text(nb, "nb.ipynb")
    assert [(f.rule, f.location.cell) for f in report.findings] == [("AMP101", 3)]
    assert report.to_dict()["findings"][0]["cell"] == 3 and report.exit_code == 1
    assert lint_text("x = 1\n").exit_code == 0 and lint_text("def (:\n").exit_code == 2
    with pytest.raises(UserError):
        get_rule("AMP999")
    with pytest.raises(UserError):
        lint_text("x = 1\n", select="NOPE")
    assert explain_rule("AMP106").startswith("# AMP106 deprecated-amp-api (warning)")
    assert all(hasattr(r, "fix") and r.example_bad for r in all_rules())


def test_fix_optimizer_step_and_unscaled_backward():
    src = ("import torch\nscaler = torch.amp.GradScaler('cuda')\n\n\ndef a(model, x, opt):\n"
           "    scaler.scale(model(x).sum()).backward()\n    opt.step()\n    scaler.update()\n\n\n"
           "def b(model, x, opt):\n    loss = model(x).sum()\n    loss.backward()\n    scaler.step(opt)\n    scaler.update()\n")
    result = fix_text(src)
    assert sorted(f.rule for f in result.applied) == ["AMP115", "AMP116"]
    assert "    scaler.step(opt)\n    scaler.update()\n\n\ndef b" in result.fixed_text
    assert "    scaler.scale(loss).backward()\n" in result.fixed_text
    assert lint_text(result.fixed_text).findings == []


def test_lint_command_imports_only_what_linting_needs(tmp_path):
    """Start-up is most of linting a few files (issue 28): `lint` imports neither the GPU tables
    (`troubleshooter.hardware`; AMP121 reads its sizes from hardware_sizes) nor a TOML parser when no
    pyproject.toml is read, and leaves the cycle collector as it found it."""
    import subprocess

    script = tmp_path / "train.py"
    script.write_text("import torch\nx = torch.nn.Linear(100, 30)\n")
    code = ("import gc, sys\nfrom troubleshooter.cli import main\ncode = main(['lint', '--isolated', '--no-cache', "
            f"{str(script)!r}])\nprint(code, gc.isenabled(), sorted(m for m in sys.modules "
            "if m in ('troubleshooter.hardware', 'tomllib', 'tomli')))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parents[1])
    assert done.stdout.splitlines()[-1] == "0 True []", done.stdout + done.stderr  # info findings only: exit 0
    assert "AMP121" in done.stdout
