"""Bad input never raises: each unreadable path becomes an `errors` entry, exit 2, others still linted."""
import json
import time

import pytest

from troubleshooter.lint import lint_paths, lint_text
from troubleshooter.lint.source import MAX_BYTES

BAD = "import torch\nscaler = torch.amp.GradScaler('cuda')\nscaler.scale(loss).backward()\noptimizer.step()\n"


def _write(tmp_path, name, data):
    p = tmp_path / name
    p.write_bytes(data if isinstance(data, bytes) else data.encode())
    return str(p)


def test_each_bad_input_is_an_error_and_the_rest_is_linted(tmp_path):
    good = _write(tmp_path, "train.py", BAD)
    nb_no_code = _write(tmp_path, "empty.ipynb", json.dumps({"cells": [{"cell_type": "markdown", "source": "hi"}]}))
    inputs = {
        "empty": _write(tmp_path, "empty.py", ""),
        "binary": _write(tmp_path, "blob.py", b"\x00\x01\x02torch\x00"),
        "latin1": _write(tmp_path, "latin.py", b"x = '\xe9t\xe9'\n"),
        "syntax": _write(tmp_path, "broken.py", "import torch\n\ndef f(:\n    pass\n"),
        "malformed": _write(tmp_path, "bad.ipynb", "{not json"),
        "nocells": _write(tmp_path, "nocells.ipynb", json.dumps({"metadata": {}})),
        "missing": str(tmp_path / "nope.py"),
    }
    report = lint_paths([*inputs.values(), nb_no_code, good])
    assert report.exit_code == 2
    by_path = {e.path: e for e in report.errors}
    assert set(by_path) == set(inputs.values())
    assert "empty" in by_path[inputs["empty"]].message
    assert "binary" in by_path[inputs["binary"]].message
    assert "UTF-8" in by_path[inputs["latin1"]].message or "utf-8" in by_path[inputs["latin1"]].message
    assert by_path[inputs["syntax"]].line == 3 and "syntax error" in by_path[inputs["syntax"]].message
    assert nb_no_code not in by_path  # a notes-only notebook is not bad input: a note, exit unaffected
    assert any("no code cells" in n for n in report.notes)
    assert "malformed notebook" in by_path[inputs["malformed"]].message
    assert "malformed notebook" in by_path[inputs["nocells"]].message
    assert "no such file" in by_path[inputs["missing"]].message
    assert [f.rule for f in report.findings if f.location.path == good] == ["AMP116"]
    json.dumps(report.to_dict())  # serialisable


def test_coding_declaration_is_honoured(tmp_path):
    p = _write(tmp_path, "legacy.py", "# -*- coding: latin-1 -*-\nname = '\xe9'\n".encode("latin-1"))
    assert lint_paths([p]).errors == []


def test_big_file_is_refused_quickly(tmp_path):
    line = "x = torch.randn(8, 8) @ torch.randn(8, 8)  # padding padding padding padding\n"
    p = _write(tmp_path, "huge.py", "import torch\n" + line * (5 * 1024 * 1024 // len(line)))
    t0 = time.perf_counter()
    report = lint_paths([p])
    assert time.perf_counter() - t0 < 2
    assert report.exit_code == 2 and "MB" in report.errors[0].message
    assert MAX_BYTES < 5 * 1024 * 1024


def test_syntax_error_in_one_notebook_cell(tmp_path):
    nb = {"cells": [
        {"cell_type": "code", "source": ["import torch\n"]},
        {"cell_type": "code", "source": ["def broken(:\n"]},
        {"cell_type": "code", "source": ["scaler = torch.amp.GradScaler('cuda')\n", "scaler.scale(loss).backward()\n",
                                         "optimizer.step()\n"]},
    ]}
    report = lint_paths([_write(tmp_path, "nb.ipynb", json.dumps(nb))])
    assert [(e.cell, e.line) for e in report.errors] == [(2, 1)]
    assert [(f.rule, f.location.cell, f.location.line) for f in report.findings] == [("AMP116", 3, 3)]


def test_directory_recursion_skips_hidden_and_empty_init(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / ".venv").mkdir()
    _write(tmp_path, "pkg/__init__.py", "")
    _write(tmp_path, "pkg/train.py", BAD)
    _write(tmp_path, ".venv/bad.py", BAD)
    report = lint_paths([str(tmp_path)])
    assert report.errors == []
    assert [f.location.path.endswith("pkg/train.py") for f in report.findings] == [True]


def test_lint_text_never_raises_on_odd_source():
    for src in ["", "\n\n", "x = (" * 50 + ")" * 50, "def f():\n    return\n" * 3, "async def f():\n    async with a: await b\n",
                "match x:\n    case 1:\n        loss.backward()\n", "lambda: 0\n", "class A:\n    scaler = None\n"]:
        report = lint_text(src)
        assert report.exit_code in (0, 1, 2)
    deep = "x = " + "(" * 300 + "1" + ")" * 300 + "\n"
    assert lint_text(deep).exit_code in (0, 2)


def test_mutated_scripts_never_crash_the_linter():
    """Drop and reorder lines of the fixtures at random: always a report, never an exception."""
    import random
    from pathlib import Path

    from troubleshooter.lint import fix_text

    rng = random.Random(0)
    sources = [p.read_text() for p in sorted((Path(__file__).parent / "fixtures" / "lint").glob("*.py"))]
    for i in range(150):
        lines = rng.choice(sources).splitlines()
        k = rng.randrange(1, max(2, len(lines) // 4))
        for _ in range(k):
            j = rng.randrange(len(lines))
            if rng.random() < 0.5:
                del lines[j]
            else:
                lines.insert(rng.randrange(len(lines) + 1), lines[j])
            if not lines:
                break
        src = "\n".join(lines) + "\n"
        report = lint_text(src, f"m{i}.py")
        assert report.exit_code in (0, 1, 2)
        if not report.errors:
            fix_text(src)


def test_markdown_only_notebook_is_clean_with_a_note(tmp_path):
    nb = _write(tmp_path, "notes.ipynb", json.dumps({"cells": [{"cell_type": "markdown", "source": ["# AMP\n"]}]}))
    report = lint_paths([nb])
    assert report.exit_code == 0 and report.errors == [] and report.findings == []
    assert report.to_dict()["notes"] == [f"{nb}: notebook has no code cells: nothing to lint"]


COLAB_EXPORT = """# -*- coding: utf-8 -*-
!pip install -q timm \\
    torchmetrics
%matplotlib inline
import torch
model = Net().cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

%%time
for x, y in loader:
    with torch.autocast("cuda"):
        loss = model(x)
    loss.backward()
    optimizer.step()
files = !ls
%time evaluate(model)
"""


def test_colab_export_with_shell_and_magic_lines_is_linted_in_place(tmp_path):
    report = lint_paths([_write(tmp_path, "colab.py", COLAB_EXPORT)])
    assert report.errors == []
    assert ("AMP103", 11) in {(f.rule, f.location.line) for f in report.findings}


def test_plain_python_syntax_errors_still_reported(tmp_path):
    report = lint_paths([_write(tmp_path, "bad.py", "import torch\n!pip install x\ndef f(:\n    pass\n")])
    assert report.exit_code == 2 and report.errors[0].line == 3


def test_writefile_cell_is_linted_and_bash_cell_skipped(tmp_path):
    nb = {"cells": [
        {"cell_type": "markdown", "source": ["# title\n"]},
        {"cell_type": "code", "source": ["%%bash\n", "pip install x\n", "ls -la | head\n"]},
        {"cell_type": "code", "source": ["%%writefile train.py\n", "import torch\n",
                                         "scaler = torch.amp.GradScaler('cuda')\n",
                                         "scaler.scale(loss).backward()\n", "optimizer.step()\n"]},
        {"cell_type": "code", "source": ["!python train.py \\\n", "    --epochs 3\n"]},
    ]}
    path = _write(tmp_path, "nb.ipynb", json.dumps(nb, indent=1))
    report = lint_paths([path])
    assert report.errors == []
    assert [(f.rule, f.location.cell, f.location.line) for f in report.findings] == [("AMP116", 2, 5)]
    raw = (tmp_path / "nb.ipynb").read_text().splitlines()
    raw_line = report.notebook_lines[(path, 2, 5)]
    assert "optimizer.step()" in raw[raw_line - 1]


def test_automagic_pip_line_in_a_cell_is_ipython(tmp_path):
    nb = {"cells": [{"cell_type": "code", "source": ["pip install langchain\n"]},
                    {"cell_type": "code", "source": ["pip = 3\n", "?torch.amp\n"]}]}
    report = lint_paths([_write(tmp_path, "nb.ipynb", json.dumps(nb))])
    assert report.errors == []


# --- hostile inputs: bounded reads, nesting, and parsing from several threads -----------------

def test_devices_pipes_and_endless_stdin_are_refused_not_read_forever(tmp_path, monkeypatch):
    import io
    import os
    import sys

    fifo = tmp_path / "train.py"
    os.mkfifo(fifo)  # no writer: opening it would block for ever
    report = lint_paths([str(fifo), "/dev/zero"])
    messages = [e.message for e in report.errors]
    assert "named pipe" in messages[0] and "device" in messages[1] and report.exit_code == 2

    class Endless(io.RawIOBase):  # `yes | lint -`
        def readable(self):
            return True

        def readinto(self, buffer):
            buffer[:] = b"y" * len(buffer)
            return len(buffer)

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(Endless())))
    assert "up to 2 MB" in lint_paths(["-"]).errors[0].message


def test_nesting_past_the_parsers_reach_is_a_reason_not_a_blank(tmp_path):
    deep_notebook = _write(tmp_path, "deep.ipynb", '{"cells": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert "nests more than 64 levels" in lint_paths([deep_notebook]).errors[0].message
    for source in ("x = " + "-" * 10_000 + "1\n", "x = a" + ".b" * 10_000 + "\n"):
        errors = lint_text(source).errors
        assert errors and "nests too deeply" in errors[0].message


def test_parsing_from_many_threads_never_fails_valid_code():
    """CPython 3.11 keeps the AST converter's recursion counter in interpreter-wide state: two
    threads parsing at different stack depths while garbage collection runs Python code used to
    fail with `SystemError: AST constructor recursion depth mismatch` (about one parse in six
    here). The linter parses through one lock."""
    import gc
    import sys
    import threading

    from troubleshooter.lint.source import parse

    source = "x = " + "+".join(["a"] * 300) + "\n" + "def f():\n    return [g(i) for i in range(3)]\n" * 100
    failures = []

    class Finalised:
        def __del__(self):
            sum(range(50))  # Python code run by the collector, in the middle of someone's parse

    def at_depth(n):
        if n:
            return at_depth(n - 1)
        for _ in range(25):
            junk = [Finalised() for _ in range(50)]
            for a, b in zip(junk, junk[1:]):
                a.other, b.other = b, a
            del junk
            try:
                parse(source)
            except SystemError as exc:
                failures.append(str(exc))

    threshold, interval = gc.get_threshold(), sys.getswitchinterval()
    gc.set_threshold(50, 5, 5)
    sys.setswitchinterval(1e-5)
    try:
        threads = [threading.Thread(target=at_depth, args=(d,)) for d in (5, 100, 200, 300)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        gc.set_threshold(*threshold)
        sys.setswitchinterval(interval)
    assert failures == []


@pytest.mark.parametrize("text", [
    '{"a": "[[[", "b": [1, [2]]}',
    '["\\"[", ["\\\\"], "\\\\\\"{"]',
    '{"s": "line\\\nbreak [", "t": [[[]]]}',
    '"unterminated [[[ \\" ]',
    '[["a\\\\", "]"], {"k": "\\u005b"}]',
    '{}' * 3 + '[' * 70 + ']' * 70,
])
def test_json_depth_counts_brackets_outside_strings_only(text):
    """The notebook guard strips string literals with an unrolled pattern (7x faster on a 270 KB
    notebook); it must strip exactly what the plain alternation does, escapes included."""
    import re

    from troubleshooter.bounded import _JSON_STRING, json_depth

    plain = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
    assert _JSON_STRING.sub('""', text) == plain.sub('""', text)
    brackets = plain.sub('""', text)
    depth = deepest = 0
    for ch in brackets:
        if ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    assert json_depth(text, stop_at=10_000) == deepest
