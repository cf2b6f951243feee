"""The trace's parent process never imports torch (issue 28). The parent is the CLI's (or the app
worker's) process: it starts the child, waits, and turns the child's JSON into findings and a
report. The child imports torch as it must; the parent importing it as well cost every CLI trace
~1 s here and 7 s on a fresh GPU host (BENCHMARKS.md).

One subprocess: the CLI traces a script that does not import torch, then children's results
(tests/fixtures/trace/parent/raw_results.json, one per kind of finding) are replayed through
`trace_script(raw=...)` and rendered in every format; `torch` must not be in its sys.modules.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).parent / "fixtures" / "trace" / "parent" / "raw_results.json"

PARENT = textwrap.dedent("""
    import contextlib, io, json, sys
    from troubleshooter import cli
    from troubleshooter.trace import exit_code, render_markdown, render_text, trace_script
    from troubleshooter.trace.report import render_github

    script, fixture = sys.argv[1], sys.argv[2]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        status = cli.main(["trace", script, "--steps", "1", "--format", "json"])
    rules = {}
    for name, case in json.loads(open(fixture).read())["cases"].items():
        report = trace_script(script, raw=case["raw"], **case["kw"])
        text = render_text(report) + render_markdown(report) + render_github(report) + json.dumps(report)
        assert text and exit_code(report) in (0, 1)
        rules[name] = sorted({f["rule"] for f in report["findings"]})
    print(json.dumps({"status": status, "exit": json.loads(printed.getvalue())["exit"]["status"],
                      "rules": rules, "torch imported": "torch" in sys.modules}))
""")


def test_the_trace_parent_builds_and_renders_every_finding_without_importing_torch(tmp_path):
    script = tmp_path / "hello.py"
    script.write_text("print('a script that does not import torch')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", PARENT, str(script), str(FIXTURE)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    assert (result["status"], result["exit"]) == (0, "finished")  # the CLI ran a real child
    cases = json.loads(FIXTURE.read_text())["cases"]
    assert result["rules"] == {name: case["rules"] for name, case in cases.items()}  # every builder ran
    assert result["torch imported"] is False


def test_torchs_folder_is_found_without_importing_torch(monkeypatch):
    import torch

    from troubleshooter.trace import locate

    assert locate._torch_folder() == os.path.dirname(os.path.realpath(torch.__file__))
    assert os.path.dirname(os.path.realpath(torch.__file__)) + os.sep in locate._SKIP
    monkeypatch.setitem(sys.modules, "torch", None)  # what an uninstalled torch looks like to find_spec
    assert locate._torch_folder() is None
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))  # no spec: find_spec raises
    assert locate._torch_folder() is None
