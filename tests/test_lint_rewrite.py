"""`lint --diff/--fix/--add-noqa` on scripts and notebooks, `--stdin-filename`, and the result cache."""
import io
import json
import sys
from pathlib import Path

import pytest

from troubleshooter.cli import main
from troubleshooter.lint import fix_text, lint_text
from troubleshooter.lint.cache import CACHE_DIR_ENV, LintCache
from troubleshooter.lint.engine import active_rules
from troubleshooter.lint.runner import lint_inputs

FIXTURES = Path(__file__).parent / "fixtures" / "lint"
STEP_ENDS_CELL = ["import torch\nscaler = torch.amp.GradScaler('cuda')\n",
                  "for x in data:\n    scaler.scale(model(x).sum()).backward()\n    scaler.step(opt)",
                  "print('done')\n"]


def run(capsys, *argv):
    code = main(["lint", *argv, "--isolated"])
    out = capsys.readouterr()
    return code, out.out, out.err


def notebook(sources, indent=1) -> str:
    cells = [{"cell_type": "markdown", "metadata": {}, "source": ["# Training\n"]}]
    cells += [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
               "source": src.splitlines(True)} for src in sources]
    nb = {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    return json.dumps(nb, indent=indent, ensure_ascii=False) + "\n"


def test_diff_exits_one_only_when_it_would_change_something(tmp_path, capsys):
    bad, good = tmp_path / "bad.py", tmp_path / "good.py"
    bad.write_text((FIXTURES / "bad_AMP113.py").read_text())
    good.write_text((FIXTURES / "good_AMP113.py").read_text())
    assert run(capsys, str(good), "--diff")[:2] == (0, "")
    code, out, _ = run(capsys, str(bad), str(good), "--diff")
    assert code == 1 and "+        scaler.update()" in out
    assert bad.read_text() == (FIXTURES / "bad_AMP113.py").read_text()


def test_fix_rewrites_notebook_cells_in_place_keeping_its_layout(tmp_path, capsys):
    path = tmp_path / "train.ipynb"
    raw = notebook(STEP_ENDS_CELL)
    path.write_text(raw)
    code, out, err = run(capsys, str(path), "--diff")
    assert code == 1 and out.startswith(f"--- a/{str(path).lstrip('/')}:cell 2\n")
    assert path.read_text() == raw
    code, out, err = run(capsys, str(path), "--fix")
    assert code == 0 and "fixed 1 problem" in err and "No mixed-precision problems found" in out
    nb = json.loads(path.read_text())
    # update() lands at the end of cell 2 (the step's cell), not at the top of cell 3
    assert nb["cells"][2]["source"][-2:] == ["    scaler.step(opt)\n", "    scaler.update()"]
    assert nb["cells"][3]["source"] == ["print('done')\n"]
    before, after = raw.splitlines(), path.read_text().splitlines()
    assert [line for line in after if line not in before] == ['    "    scaler.step(opt)\\n",', '    "    scaler.update()"']
    assert lint_text(path.read_text(), "train.ipynb").findings == []


def test_notebook_in_a_hand_made_layout_is_not_rewritten_and_says_why(tmp_path, capsys):
    path = tmp_path / "train.ipynb"
    raw = notebook(STEP_ENDS_CELL, indent=3).replace('"cells": [', '"cells":   [')
    path.write_text(raw)
    code, out, err = run(capsys, str(path), "--fix")
    assert path.read_text() == raw and "not rewritten" in err and "Jupyter" in err
    assert code == 1 and "AMP113" in out  # still reported


def test_add_noqa_silences_each_finding_once_and_keeps_other_codes(tmp_path, capsys):
    src = ("import torch\nscaler = torch.cuda.amp.GradScaler()  # noqa: E501\n"
           "with torch.autocast('cuda', dtype=torch.float16):\n    loss = model(x)\n"
           "loss.backward()\nopt.step()\nscaler.update()\n"
           "x = f(torch.cuda.amp.autocast(), '''text\nmore''')\n")
    path = tmp_path / "t.py"
    path.write_text(src)
    before = {(f.rule, f.location.line) for f in lint_text(src).findings}
    assert {("AMP106", 2), ("AMP127", 7), ("AMP106", 8)} <= before
    code, out, err = run(capsys, str(path), "--add-noqa")
    new = path.read_text()
    assert code == 0 and "added" in err and "1 line cannot take a `# noqa`" in err
    assert "# noqa: E501, AMP106\n" in new and "scaler.update()  # noqa: AMP127\n" in new
    assert {(f.rule, f.location.line) for f in lint_text(new).findings} == {("AMP106", 8)}  # its line ends in a string
    code, _, _ = run(capsys, str(path), "--add-noqa")
    assert path.read_text() == new


def test_add_noqa_in_a_notebook_cell(tmp_path, capsys):
    path = tmp_path / "nb.ipynb"
    path.write_text(notebook(STEP_ENDS_CELL))
    assert run(capsys, str(path), "--add-noqa")[0] == 0
    assert json.loads(path.read_text())["cells"][2]["source"][-1] == "    scaler.step(opt)  # noqa: AMP113"
    assert lint_text(path.read_text(), "nb.ipynb").findings == []


def test_stdin_filename_names_findings_picks_notebooks_and_matches_per_file_ignores(tmp_path, capsys, monkeypatch):
    def stdin(data: str):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data.encode())))

    stdin((FIXTURES / "bad_AMP113.py").read_text())
    code, out, _ = run(capsys, "--stdin-filename", "src/train.py", "--format", "json")
    assert code == 1 and {f["path"] for f in json.loads(out)["findings"]} == {"src/train.py"}
    stdin(notebook(STEP_ENDS_CELL))
    code, out, _ = run(capsys, "-", "--stdin-filename", "nb.ipynb", "--format", "json")
    assert [(f["rule"], f["cell"]) for f in json.loads(out)["findings"]] == [("AMP113", 2)]
    stdin(notebook(STEP_ENDS_CELL))
    code, out, _ = run(capsys, "--stdin-filename", "nb.ipynb", "--fix")
    assert code == 0 and json.loads(out)["cells"][2]["source"][-1] == "    scaler.update()"
    (tmp_path / "pyproject.toml").write_text('[tool.amp-troubleshooter]\nper-file-ignores = {"legacy/*" = ["AMP113"]}\n')
    monkeypatch.chdir(tmp_path)
    stdin((FIXTURES / "bad_AMP113.py").read_text())
    assert main(["lint", "--stdin-filename", "legacy/old.py"]) == 0
    capsys.readouterr()
    assert main(["lint"]) == 2 and "needs a PATH" in capsys.readouterr().err


def test_fix_text_keeps_the_ipython_lines_of_an_exported_notebook():
    src = "!pip install torch\nimport torch\nscaler = torch.cuda.amp.GradScaler()\n%matplotlib inline\n"
    result = fix_text(src)
    assert result.fixed_text == src.replace("torch.cuda.amp.GradScaler()", 'torch.amp.GradScaler("cuda")')


def test_cache_reuses_results_until_the_file_rules_configs_or_tool_change(tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text((FIXTURES / "bad_AMP101.py").read_text())
    rules = active_rules()

    def lint(cache_rules=rules):
        cache = LintCache(tmp_path / "cache", cache_rules)
        report = lint_inputs([str(script)], cache_rules, cache=cache)
        return report, (cache.hits, cache.misses)

    first, counts = lint()
    assert counts == (0, 1)
    again, counts = lint()
    assert counts == (1, 0) and again.to_dict() == first.to_dict() and again.fixes == first.fixes
    script.write_text(script.read_text().replace("1.0)", "2.0)"))
    assert lint()[1] == (0, 1)
    assert lint(active_rules(ignore="AMP121"))[1] == (0, 1)  # another rule set
    (tmp_path / "ds_config.json").write_text('{"fp16": {"enabled": true}}')  # framework rules may read it
    assert lint()[1] == (0, 1) and lint()[1] == (1, 0)
    tool = LintCache(tmp_path / "cache", rules)
    tool.tool = "0" * 16  # another version of the tool: its own folder, the old one removed on write
    tool.folder = tool.root / tool.tool
    lint_inputs([str(script)], rules, cache=tool)
    assert tool.misses == 1 and [p.name for p in (tmp_path / "cache").iterdir() if p.is_dir()] == ["0" * 16]


def test_cache_folder_default_place_and_no_cache(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(CACHE_DIR_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.py").write_text("x = 1\n")
    assert main(["lint", "a.py", "--no-cache"]) == 0 and not (tmp_path / ".amp_troubleshooter_cache").exists()
    assert main(["lint", "a.py"]) == 0
    folder = tmp_path / ".amp_troubleshooter_cache"
    assert (folder / ".gitignore").read_text().rstrip().endswith("*") and (folder / "CACHEDIR.TAG").is_file()
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro" / "cache").write_text("a file where the folder should be")
    assert main(["lint", "a.py", "--cache-dir", str(tmp_path / "ro" / "cache")]) == 0
    assert "cannot write the lint cache" in capsys.readouterr().err
    assert main(["lint", "a.py", "--cache-dir", "."]) == 0  # a project folder is never used (nor pruned) as a cache
    assert "not a lint cache" in capsys.readouterr().err and not (tmp_path / ".gitignore").exists()


def test_a_fix_that_would_not_parse_is_refused():
    """The safety net under every fix: the statements an edit touches must still parse."""
    import ast

    from troubleshooter.lint.analysis import FileModel
    from troubleshooter.lint.edits import Edit
    from troubleshooter.lint.fix import _still_parses

    text = "import torch\n\n\ndef f(opt):\n    opt.step()\n\n\nx = 1\n"
    model = FileModel(ast.parse(text), text)
    assert _still_parses(model, text, [Edit(5, 5, 5, 15, "scaler.step(opt)")])
    assert not _still_parses(model, text, [Edit(5, 5, 5, 15, "scaler.step(opt")])
    assert not _still_parses(model, text, [Edit(6, 1, 6, 1, "  )")])  # between statements: the whole file
