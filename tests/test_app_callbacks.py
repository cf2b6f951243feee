"""The app's callbacks called directly: uploads, errors, jobs, and each tab's functions."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from troubleshooter.errors import UserError
from troubleshooter.ui import common, jobs
from troubleshooter.ui.server import SETTINGS

MB = 1024 * 1024


@pytest.fixture(autouse=True)
def _uploads_live_under_pytest_tmp(tmp_path_factory, monkeypatch):
    """Callbacks read only files in Gradio's upload folder; here that is pytest's temporary root,
    so the files the tests write under tmp_path stand for uploads."""
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path_factory.getbasetemp()))


# --- uploads ---------------------------------------------------------------------------

def test_text_upload_roundtrip(tmp_path):
    p = tmp_path / "train.py"
    p.write_text("import torch\nprint('é')\n", encoding="utf-8")
    assert common.read_text_upload(str(p), MB, (".py",)) == "import torch\nprint('é')\n"


@pytest.mark.parametrize("content, match", [
    (b"PK\x03\x04\x00\x00binary zip", "binary file"),
    (b"print('caf\xe9')\n", "not UTF-8"),
])
def test_bad_text_uploads_are_explained(tmp_path, content, match):
    p = tmp_path / "model.py"
    p.write_bytes(content)
    with pytest.raises(UserError, match=match):
        common.read_text_upload(str(p), MB, (".py",))


def test_oversize_and_wrong_kind_refused(tmp_path):
    big = tmp_path / "big.py"
    big.write_bytes(b"x = 1\n" * 300_000)
    with pytest.raises(UserError, match="larger than this server's limit"):
        common.read_text_upload(str(big), MB, (".py",))
    pt = tmp_path / "weights.pt"
    pt.write_bytes(b"\x80\x02}q\x00.")
    with pytest.raises(UserError, match="expected a Python script"):
        common.read_text_upload(str(pt), MB, (".py", ".ipynb"), "a Python script")
    with pytest.raises(UserError, match="pasted"):
        common.check_text_size("x" * (MB + 1), MB, "the pasted code")


def test_error_message_never_a_traceback():
    assert common.error_message(UserError("bad spec", ["a: x", "b: y"])) == "bad spec\n  - a: x\n  - b: y"
    msg = common.error_message(ZeroDivisionError("division by zero"))
    assert msg.startswith("internal error (ZeroDivisionError: division by zero)")
    assert "Traceback" not in msg
    assert common.error_markdown("two\nlines").startswith("> **Error**\n> two\n> lines")


def test_downloads_keep_their_name_and_do_not_collide():
    a = common.write_download("train_amp.py", "print(1)\n")
    b = common.write_download("train_amp.py", "print(2)\n")
    assert Path(a).name == Path(b).name == "train_amp.py" and a != b
    assert Path(b).read_text() == "print(2)\n"
    assert Path(common.write_download("../../etc/x y.md", "z")).name == ".._.._etc_x_y.md"


# --- jobs in a worker process ----------------------------------------------------------

def _job_with_progress(n, progress=None):
    for i in range(n):
        progress((i + 1) / n, f"step {i + 1}/{n}")
        time.sleep(0.3)
    return {"done": n, "pid": os.getpid()}


def _job_that_dies(progress=None):
    os._exit(3)


def _job_that_hangs(progress=None):
    time.sleep(60)


def test_job_runs_in_a_child_and_relays_progress():
    seen = []
    out = jobs.run_job(_job_with_progress, 3, timeout_s=60, progress=lambda f, m: seen.append((f, m)),
                       poll_s=0.05)
    assert out["done"] == 3 and out["pid"] != os.getpid()
    assert seen and seen[-1] == (1.0, "step 3/3")
    assert [f for f, _ in seen] == sorted(f for f, _ in seen)


def test_job_crash_and_hang_are_readable_errors():
    from troubleshooter.worker import WorkerError

    with pytest.raises(WorkerError, match="exited with status 3"):
        jobs.run_job(_job_that_dies, timeout_s=60)
    t = time.monotonic()
    with pytest.raises(WorkerError, match="time limit"):
        jobs.run_job(_job_that_hangs, timeout_s=1.5)
    assert time.monotonic() - t < 20


# --- gradio glue: page events never raise, API events raise gr.Error -------------------

def test_page_event_turns_errors_into_a_status_message():
    import gradio as gr

    from troubleshooter.ui.api import endpoint
    from troubleshooter.ui.glue import page_event

    def cb(x):
        raise UserError(f"{x} is not a script")

    out = page_event(cb, 3, status_index=0)("photo.png")
    assert out[0].startswith("> **Error**") and "photo.png is not a script" in out[0]
    assert out[1:] == (None, None)
    hidden = object()  # a layout, which None cannot clear
    assert page_event(cb, 3, blank={2: lambda: hidden})("photo.png")[1:] == (None, hidden)
    with pytest.raises(gr.Error, match="photo.png is not a script"):
        endpoint(cb)("photo.png")

    def short(x):  # each surface words the engine's advice for its own controls
        raise UserError("not run: the time budget was spent (raise --budget); not selected (--only)")

    page_text = page_event(short, 1)("x")
    with pytest.raises(gr.Error) as api_error:
        endpoint(short)("x")
    assert "--" not in page_text and "raise the time budget" in page_text
    assert "--" not in str(api_error.value) and "raise budget_s" in str(api_error.value)


def test_progress_reaches_the_callback_as_a_plain_callable():
    import inspect

    import gradio as gr

    from troubleshooter.ui.glue import page_event

    calls = []

    def cb(a, progress=None):
        progress(0.5, "half")
        return a

    wrapped = page_event(cb, 1, progress=True)
    assert isinstance(inspect.signature(wrapped).parameters["progress"].default, gr.Progress)

    class Tracker(gr.Progress):
        def __call__(self, fraction, desc=None, **kw):
            calls.append((fraction, desc))

    assert wrapped("x", progress=Tracker()) == "x"
    assert calls == [(0.5, "half")]


# --- diagnose tab ----------------------------------------------------------------------

FIXTURES = Path(__file__).parent / "fixtures"


def test_lint_upload_rows_show_the_offending_line(tmp_path):
    from troubleshooter.ui import diagnose

    p = tmp_path / "train.py"
    p.write_text((FIXTURES / "lint" / "bad_AMP101.py").read_text())
    r = diagnose.lint_script("ignored when a file is uploaded", str(p))
    assert r["name"] == "train.py" and "AMP101" in r["rules_found"]
    row = next(row for row in r["rows"] if row[1].startswith("AMP101"))
    assert row[0] == "ERROR" and "clip_grad_norm_" in row[3]
    assert json.loads(Path(r["json_path"]).read_text()) == r["report"]
    assert Path(r["md_path"]).name == "train_amp_report.md"


def test_lint_notebook_cells(tmp_path):
    from troubleshooter.ui import diagnose

    cells = [{"cell_type": "markdown", "source": ["# notes"]},
             {"cell_type": "code", "source": ["import torch\n"]},
             {"cell_type": "code", "source": ["scaler = torch.cuda.amp.GradScaler()\n"]}]
    nb = tmp_path / "exp.ipynb"
    nb.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    r = diagnose.lint_script(None, str(nb))
    row = next(row for row in r["rows"] if row[1].startswith("AMP106"))
    assert row[2].startswith("cell 2") and "GradScaler" in row[3]


def test_lint_syntax_error_and_unknown_rule_are_readable():
    from troubleshooter.ui import diagnose

    r = diagnose.lint_script("def f(:\n    pass\n", None)
    assert r["errors"] and "line 1" in r["errors"][0] and "Could not analyse" in r["summary"]
    with pytest.raises(UserError, match="unknown rule.*'AMP999'"):
        diagnose.explain("amp999")
    assert "Why it matters" in diagnose.explain("amp101")


# --- model picker ----------------------------------------------------------------------

def test_model_picker_sources_and_refusals(tmp_path):
    from troubleshooter.errors import SpecError
    from troubleshooter.ui import specinput

    assert specinput.params_text("mlp").startswith("in_features=")
    src = specinput.source_from_inputs("Preset", "mlp", "hidden=32, depth=2", "", None)
    assert src.kind == "preset" and src.value == "mlp:hidden=32,depth=2"
    with pytest.raises(UserError, match="empty"):
        specinput.source_from_inputs("YAML", "", "", "  ", None)
    with pytest.raises(UserError, match="uploaded beside the spec"):
        specinput.source_from_inputs("YAML", "", "", "weights: /etc/passwd\n", None)
    with pytest.raises(UserError, match="upload that file"):
        specinput.source_from_inputs("YAML", "", "", "weights: trained.pt\n", None)
    py = tmp_path / "model.py"
    py.write_text("def build_model():\n    raise SystemExit\n")
    SETTINGS.allow_exec = False
    with pytest.raises(UserError, match="--allow-exec"):
        specinput.source_from_inputs("Upload", "", "", "", str(py))
    with pytest.raises(SpecError, match="line"):  # read once, by the bounded loader, when the source is made
        specinput.validate(specinput.source_from_inputs("YAML", "", "", "model:\n  layers: [\n", None))


def test_job_options_are_validated_before_any_work():
    from troubleshooter.ui import check, speedup

    with pytest.raises(UserError, match="between 1 and 600"):
        speedup._budget(0)
    with pytest.raises(UserError, match="unknown precision"):
        speedup._parse_precisions("fp8")
    with pytest.raises(UserError, match="at least one"):
        speedup._parse_precisions([])
    assert speedup._parse_precisions("bf16, fp32") == ["fp32", "bf16"]
    # check options: parsed here, judged by the engine's rules (the CLI's), before any worker starts
    for bad, match in [(dict(steps=2.5), "whole number"), (dict(steps="x"), "steps must be a number"),
                       (dict(checks="alignment,magic"), "unknown check"), (dict(checks=[]), "no check"),
                       (dict(budget_s=float("nan")), "seconds above 0"), (dict(device="cuda:7"), "cuda:7")]:
        with pytest.raises(UserError, match=match):
            check.options(**{"device": "cpu", "checks": "alignment", "steps": 2, "budget_s": 10, **bad})
    assert check.options("cpu", ["nan", "alignment"], 3.0, 10) == \
        {"device": "cpu", "only": ["alignment", "nan"], "steps": 3, "budget_s": 10.0, "autocast_policy": "cuda"}
    message = common.error_message(UserError("--steps must be a whole number from 1 to 10000, got 0"))
    assert "--" not in message and "steps must be" in message  # the page's wording of the engine's reason


def test_capability_section_from_the_real_report():
    from troubleshooter.engine import check_render as render
    from troubleshooter.engine.capability import detect
    from troubleshooter.engine.check_report import CheckReport

    report = CheckReport(device={"type": "cpu", "name": "CPU"}, spec={"name": "m"}, capability=detect("cpu"))
    card = render.section_markdown(report, "capability")
    assert "Recommended precision" in card and "CPU" in card and "All capability facts" in card


# --- recipe builder --------------------------------------------------------------------

def test_recipe_from_controls_and_api():
    from troubleshooter.ui import recipe

    values = recipe.controls_from_options({"precision": "fp16", "clip": 1.0})
    status, code, path = recipe.ui_render(*values)
    assert "--precision fp16 --clip 1.0" in status
    assert "GradScaler" in code and Path(path).name == "train_amp.py"
    assert Path(path).read_text() == code
    with pytest.raises(UserError, match="JSON object"):
        recipe.parse_options("precision=bf16")
    with pytest.raises(UserError, match="channels"):
        recipe.render({"channels_last": True, "model": "transformer"})


def test_mechanical_fixes_come_as_corrected_script_and_diff(tmp_path):
    from troubleshooter.ui import diagnose

    p = tmp_path / "old_api.py"
    p.write_text("import torch\nscaler = torch.cuda.amp.GradScaler()\n")
    status, rows, md, js, rule, note, fixed, diff, fixed_path, diff_path, _ = diagnose.ui_lint(None, str(p))
    assert rule == "AMP106" and "AMP106 line 2" in note
    assert "torch.amp.GradScaler" in fixed and "torch.cuda.amp" not in fixed
    assert Path(fixed_path).read_text() == fixed and Path(fixed_path).name == "old_api_amp_fixed.py"
    assert "-scaler = torch.cuda.amp.GradScaler()" in Path(diff_path).read_text()
    assert diagnose.lint_script(fixed, None)["rules_found"] == []  # the fix removes the finding


def test_python_model_file_runs_only_with_allow_exec_and_in_a_child(tmp_path, monkeypatch):
    from troubleshooter.ui import check, specinput

    model = tmp_path / "my_model.py"
    model.write_text(
        "import os, torch\nfrom torch import nn\n"
        "def build_model():\n    return nn.Sequential(nn.Linear(16, 12), nn.ReLU(), nn.Linear(12, 4))\n"
        "def make_batch(batch_size):\n"
        "    return (torch.randn(batch_size, 16),), torch.randint(0, 4, (batch_size,))\n"
    )
    monkeypatch.setattr(SETTINGS, "allow_exec", True)
    source = specinput.source_from_inputs("Upload", "", "", "", str(model))
    result = check.run(source, "cpu", ["alignment"], 1).to_dict()
    dims = {(r["module"], r["dimension"]): r for r in result["alignment"]}
    assert dims[("0", "out_features")]["padded"] == 16  # 12 -> 16: measured on the user's model


def test_job_timeout_holds_for_an_uploaded_python_model_file(tmp_path, monkeypatch):
    """A `build_model()` that never returns is stopped at the operator's --job-timeout, in check
    and in speedup (the file isolates itself in its own child, which must get the limit)."""
    from troubleshooter.ui import check, specinput, speedup
    from troubleshooter.worker import WorkerError

    model = tmp_path / "hangs.py"
    model.write_text("import time\ndef build_model():\n    time.sleep(600)\n"
                     "def make_batch(batch_size):\n    return None\n")
    monkeypatch.setattr(SETTINGS, "allow_exec", True)
    monkeypatch.setattr(SETTINGS, "job_timeout_s", 3.0)
    source = specinput.source_from_inputs("Upload", "", "", "", str(model))
    for run in (lambda: check.run(source, "cpu", ["alignment"], 1),
                lambda: speedup.measure(source, "cpu", ["fp32"], 2)):
        t = time.monotonic()
        with pytest.raises(WorkerError, match="time limit of 3 s") as info:
            run()
        assert time.monotonic() - t < 60
        assert "_python_job" not in str(info.value) and "/tmp" not in str(info.value)


def test_api_json_speaks_the_apis_words_and_leaves_code_and_data_alone():
    from troubleshooter.ui import api

    check_json = {"skipped": {"nan": "not selected (--only)"}, "fix": {"content": "x --budget y"},
                  "verdict": {"reasons": ["rerun with a larger --budget"]}, "argv": ["--steps", "3"],
                  "recommendation": {"reason": "(the nan check names the module: python -m troubleshooter "
                                               "check --only nan)"}}
    out = json.loads(api.worded(lambda: (api.as_json_text(check_json), None), api.RETURNS["check"])()[0])
    assert out["skipped"]["nan"] == "not selected (checks)" and out["verdict"]["reasons"] == ["rerun with a larger budget_s"]
    assert out["recommendation"]["reason"] == '(the nan check names the module: the /check endpoint with checks="nan")'
    assert out["fix"] == {"content": "x --budget y"} and out["argv"] == ["--steps", "3"]
    # a trace's messages quote what the script printed; only its own advice is reworded
    trace_json = {"findings": [{"message": "error: unrecognized arguments: --steps 5",
                                "suggestion": "Raise --timeout, lower --steps, or pass arguments"}]}
    out = json.loads(api.worded(lambda: (api.as_json_text(trace_json), None), api.RETURNS["trace"])()[0])
    assert out["findings"][0]["message"] == "error: unrecognized arguments: --steps 5"
    assert "--" not in out["findings"][0]["suggestion"] and "lower steps" in out["findings"][0]["suggestion"]


def test_the_one_error_comes_first_and_the_infos_fold_away():
    """Issue 27: sorted by line, five padding hints filled the table above the only error."""
    from troubleshooter.ui import diagnose, findings_table

    r = diagnose.lint_script((FIXTURES / "app" / "one_error.py").read_text(), None)
    assert [row[0] for row in r["rows"]] == ["ERROR"] + ["info"] * 5
    assert r["rows"][0][1].startswith("AMP101") and [f.rule for f in r["findings"]][0] == "AMP101"
    assert "**1 error**, 0 warnings, 5 infos" in r["summary"] and "Results for **pasted.py**" in r["summary"]
    assert r["markdown"].index("AMP101") < r["markdown"].index("AMP121")  # the report reads the same way
    rules = [f.rule for f in r["findings"]]
    main, main_rules, infos, info_rules = findings_table.split(r["rows"], rules)
    assert main_rules == ["AMP101"] and info_rules == ["AMP121"] * 5 and len(infos) == 5
    # run-time rows join by severity: a run-time error goes above the static infos, not below them
    run_row = ["ERROR", "AMP301 (seen at run time)", "3", "", "m", "f"]
    main, main_rules, infos, _ = findings_table.split(infos + [run_row], info_rules + ["AMP301"])
    assert main_rules == ["AMP301"] and len(infos) == 5
    assert findings_table.infos_label(1).startswith("1 info:")


def test_check_findings_are_listed_worst_first():
    from troubleshooter.engine import check_render as render
    from troubleshooter.engine.check_report import CheckReport
    from troubleshooter.findings import Finding

    hint, error = Finding("AMP201", "dimension-not-aligned", "info", "pad", "p"), \
        Finding("AMP205", "fp16-overflow", "error", "overflows", "o")
    text = render.findings_markdown(CheckReport(device={"type": "cpu"}, spec={"name": "m"}, findings=[hint, error]))
    assert text.index("AMP205") < text.index("AMP201")


def test_a_clicked_row_maps_to_its_finding_by_index(tmp_path):
    from troubleshooter.ui import diagnose

    p = tmp_path / "train.py"
    p.write_text((FIXTURES / "lint" / "bad_AMP101.py").read_text())
    out = diagnose.ui_lint(None, str(p))
    rows, row_rules = out[1], out[-1]
    assert len(rows) == len(row_rules) and row_rules
    for i, row in enumerate(rows):
        assert diagnose.rule_at(row_rules, [i, 3]) == row_rules[i] and row[1].startswith(row_rules[i])
    assert diagnose.rule_at(row_rules, [len(rows), 0]) is None and diagnose.rule_at(None, [0, 0]) is None


def test_uploads_are_read_like_the_cli_reads_files(tmp_path):
    """PEP 263 coding lines and the linter's 2 MB limit, through lint.source, as `lint FILE` does."""
    from troubleshooter.lint import lint_paths
    from troubleshooter.ui import diagnose

    body = (FIXTURES / "lint" / "bad_AMP106.py").read_text()
    latin = tmp_path / "entrainement.py"
    latin.write_bytes(("# -*- coding: latin-1 -*-\n# réglage du modèle\n" + body).encode("latin-1"))
    r = diagnose.lint_script("", str(latin))
    cli = lint_paths([str(latin)])
    assert not r["errors"] and r["rules_found"] == sorted({f.rule for f in cli.findings})
    assert [f["line"] for f in r["report"]["findings"]] == [f.location.line for f in cli.findings]
    fixed = Path(diagnose.ui_lint("", str(latin))[8])
    assert "torch.amp.GradScaler" in fixed.read_bytes().decode("latin-1")  # kept in its declared encoding

    big = tmp_path / "huge.py"
    big.write_bytes(b"x = 1\n" * 600_000)  # 3.6 MB: under the server's upload limit, over the linter's
    with pytest.raises(UserError, match="up to 2 MB"):
        diagnose.lint_script("", str(big))
    assert "up to 2 MB" in lint_paths([str(big)]).errors[0].message
    with pytest.raises(UserError, match="pasted code.*up to 2 MB"):
        diagnose.lint_script("x = 1\n" * 600_000, None)


def test_status_says_what_was_read_and_what_could_not_be(tmp_path):
    from troubleshooter.ui import diagnose

    up = tmp_path / "train.py"
    up.write_text("import torch\nscaler = torch.cuda.amp.GradScaler()\n")
    both = diagnose.lint_script("x = 1\n", str(up))
    assert "pasted code was not read" in both["summary"] and "train.py" in both["summary"]
    broken = diagnose.lint_script("def f(:\n    pass\n", None)
    assert "no findings" not in broken["summary"] and "could not analyse it" in broken["summary"]
    assert "no mixed-precision problems" not in broken["summary"]
    assert "could not be analysed" in diagnose.fix_note(broken)

    cells = [{"cell_type": "code", "source": ["import torch\n", "scaler = torch.cuda.amp.GradScaler()\n"]}]
    nb = tmp_path / "exp.ipynb"
    nb.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    note = diagnose.fix_note(diagnose.lint_script(None, str(nb)))
    assert "AMP106" in note and "notebooks are not rewritten" in note and "No mechanical fix" not in note


def test_spec_weights_come_from_the_upload_beside_it(tmp_path):
    import torch
    from torch import nn

    from troubleshooter.errors import SpecError
    from troubleshooter.ui import specinput

    text = ("name: with-weights\nmodel:\n  layers:\n    - Linear: [8, 16]\n    - ReLU\n    - Linear: [16, 4]\n"
            "weights: trained.pt\ninput: {shape: [4, 8]}\ntarget: {kind: classes, num_classes: 4}\n")
    good = tmp_path / "trained.pt"
    torch.save(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).state_dict(), good)
    from troubleshooter.spec import load_workload

    source = specinput.source_from_inputs("YAML", "", "", text, None, str(good))
    specinput.validate(source)  # the server's cheap check: nothing built
    load_workload(source)  # what the job does: builds the model and loads the uploaded weights
    bad_dir = tmp_path / "bad"
    bad_dir.mkdir()
    torch.save(nn.Sequential(nn.Linear(8, 15)).state_dict(), bad_dir / "trained.pt")
    with pytest.raises(SpecError, match="trained.pt"):
        load_workload(specinput.source_from_inputs("YAML", "", "", text, None, str(bad_dir / "trained.pt")))


def test_one_job_per_device(monkeypatch):
    """Jobs on the same device wait for each other; `auto` is the first GPU, else the CPU."""
    import threading

    from troubleshooter.ui import host

    monkeypatch.setattr(host, "host_info", lambda: {"devices": ["auto", "cpu", "cuda:0", "cuda:1"]})
    assert host.gpu_slots() == 2
    assert host.device_key("auto") == "cuda:0" and host.device_key("cuda") == "cuda:0"
    assert host.device_key("cuda:1") == "cuda:1"
    order = []

    def job(name, progress=None, timeout_s=None):
        order.append(f"{name} start")
        time.sleep(0.2)
        order.append(f"{name} end")

    threads = [threading.Thread(target=jobs.run_job, args=(job, n), kwargs=dict(
        timeout_s=5, in_worker=False, device_key="cuda:0")) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert order in (["a start", "a end", "b start", "b end"], ["b start", "b end", "a start", "a end"])


def test_a_budgeted_job_is_clocked_from_when_it_gets_its_device():
    """A speedup's budget covers the hand-off to its worker (`started_at` is stamped by the job
    runner), but not the wait for another user's job on the same device."""
    import threading

    ends = {}

    def job(name, progress=None, timeout_s=None, started_at=None):
        time.sleep(0.2)
        ends[name] = time.time()
        return {"started_at": started_at}

    results = {}

    def submit(name):
        results[name] = jobs.run_job(job, name, timeout_s=5, in_worker=False, device_key="cpu",
                                     clock_kwarg="started_at")

    threads = [threading.Thread(target=submit, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first, second = sorted(results, key=lambda n: results[n]["started_at"])
    assert results[second]["started_at"] >= ends[first]  # not clocked while it waited
    for r in results.values():
        assert r["started_at"] == pytest.approx(r["job"]["started"], abs=1e-3)


# --- questionnaire: the detected device, not a bare name --------------------------------

def test_detect_passes_the_device_capability_not_just_its_name(monkeypatch):
    from troubleshooter import questionnaire as q
    from troubleshooter.ui import check, questionnaire

    cap = {"kind": "cuda", "device": "cuda:0", "name": "NVIDIA GeForce RTX 3080", "compute_capability": "8.6",
           "memory_gb": 10.0, "summary": "NVIDIA GeForce RTX 3080 (sm_86)", "recommended_precision": "bf16"}
    monkeypatch.setattr(check, "capability", lambda device="auto": dict(cap))
    calls = []

    def from_device(name, capability, memory_gb, vendor="nvidia"):
        calls.append((name, capability, memory_gb, vendor))
        return f"{name} (sm_{capability[0]}{capability[1]}, {memory_gb:g} GB)"

    monkeypatch.setattr(q, "gpu_answer_from_device", from_device, raising=False)
    answer, line = questionnaire.ui_detect()
    assert calls == [("NVIDIA GeForce RTX 3080", (8, 6), 10.0, "nvidia")]
    assert answer == "NVIDIA GeForce RTX 3080 (sm_86, 10 GB)" and "RTX 3080" in line
    monkeypatch.delattr(q, "gpu_answer_from_device")
    assert questionnaire.ui_detect()[0] == "NVIDIA GeForce RTX 3080"  # older library: the name, as before


def test_an_empty_gpu_answer_says_it_means_the_server(monkeypatch):
    from troubleshooter.ui import check, questionnaire

    monkeypatch.setattr(check, "capability", lambda device="auto": {"kind": "cpu", "device": "cpu", "name": "CPU",
                                                                    "bf16": {"native": True}})
    d = questionnaire.recommend({"symptoms": []})
    assert d["gpu_detected"] == "cpu"
    assert "left empty" in questionnaire.decision_markdown(d)
    assert "gpu_detected" not in questionnaire.recommend({"gpu": "A100", "symptoms": []})


# --- messages: no server paths, no C++ assertion text, markdown shown literally -----------

def test_inspect_messages_and_report_name_the_users_file_only(tmp_path):
    import zipfile

    import torch

    from troubleshooter.ui import check, common

    upload = tmp_path / "gradio" / "0f3a9c" / "notes.pt"
    upload.parent.mkdir(parents=True)
    with zipfile.ZipFile(upload, "w") as z:
        z.writestr("hello.txt", "hi")  # a zip, not a torch.save archive: torch raises its C++ assertion
    with pytest.raises(UserError) as info:
        check.inspect_upload(str(upload))
    shown = common.error_message(info.value)
    assert "notes.pt" in shown and str(tmp_path) not in shown and "enforce fail" not in shown

    good = tmp_path / "gradio" / "77aa" / "run.pt"
    good.parent.mkdir(parents=True)
    torch.save({"model": torch.nn.Linear(4, 4).state_dict(), "scaler": {"scale": 1024.0, "_growth_tracker": 3}}, good)
    md, report = check.ui_inspect(str(good))
    assert report["path"] == "run.pt" and str(tmp_path) not in md
    assert "GradScaler state: yes" in md and "float32" in md  # the CLI's summary, in the page


def test_error_markdown_shows_names_literally():
    from troubleshooter.ui import common

    md = common.error_markdown("module __init__ at <top level>; use `torch.amp`")
    assert r"\_\_init\_\_" in md and r"\<top level\>" in md and "`torch.amp`" in md
    said = common.public_text("needs code to be unpickled (it references __main__.Custom)")
    assert said == "needs code to be unpickled (it references class `Custom` from the script that saved it)"
    assert common.public_text("bad /tmp/gradio/abc/x.pt and https://pytorch.org/a/b") == \
        "bad x.pt and https://pytorch.org/a/b"


# --- trace: wiring against the trace module's contract, with a fake tracer ------------------

def test_run_it_on_this_host_merges_run_time_findings(tmp_path, monkeypatch):
    from troubleshooter.ui import trace

    script = tmp_path / "train.py"
    script.write_text("print('training')\n")
    calls = {}

    def fake_trace_script(path, args=(), steps=20, device="auto", timeout_s=120, nan=False, headroom=False,
                          cwd=None, progress=None, autocast_policy="cuda"):
        calls.update(path=path, args=args, steps=steps, timeout_s=timeout_s, cwd=cwd, autocast_policy=autocast_policy)
        return {"script": path, "argv": list(args), "device": "cpu", "steps_observed": steps,
                "exit": {"status": "ok", "exception": None}, "timeline": [],
                "findings": [{"rule": "AMP301", "severity": "warning", "path": path, "line": 1, "module": "fc",
                              "precision": "fp16", "step": 2, "message": "step skipped", "suggestion": "check",
                              "data": {}}],
                "scale": [65536.0, 32768.0, 32768.0], "skipped_steps": [1], "nan": None, "headroom": None}

    monkeypatch.setattr(trace, "_trace_fn", lambda: fake_trace_script)
    monkeypatch.setattr(trace.jobs, "run_job", lambda func, *a, timeout_s, progress=None, device_key=None, **kw:
                        func(*a, progress=progress, **kw))
    monkeypatch.setattr(SETTINGS, "allow_exec", False)
    with pytest.raises(UserError, match="--allow-exec"):
        trace.ui_trace(None, str(script), "", 3, [], [])
    monkeypatch.setattr(SETTINGS, "allow_exec", True)
    monkeypatch.setattr(SETTINGS, "job_timeout_s", 40.0)
    static = [["warning", "AMP106 deprecated-amp-api", "2", "x", "m", "f"]]
    status, rows, rules, fig = trace.ui_trace(None, str(script), "--epochs 1 --name 'a b'", 3, static, ["AMP106"])
    assert calls["args"] == ("--epochs", "1", "--name", "a b") and calls["steps"] == 3
    assert calls["timeout_s"] == 40.0 and Path(calls["cwd"]) == Path(calls["path"]).parent != script.parent
    assert rows[0] == static[0] and "seen at run time" in rows[1][1] and rules == ["AMP106", "AMP301"]
    assert "train.py" in status and str(tmp_path) not in status and fig is not None
    with pytest.raises(UserError, match="quotes"):
        trace.ui_trace(None, str(script), "--name 'unclosed", 3, [], [])


def test_trace_without_the_trace_module_is_a_sentence(tmp_path, monkeypatch):
    import sys

    from troubleshooter.ui import trace

    monkeypatch.setattr(SETTINGS, "allow_exec", True)
    monkeypatch.setitem(sys.modules, "troubleshooter.trace", None)  # as if it were not installed
    with pytest.raises(UserError, match="not available"):
        trace.run("print(1)\n", None)


@pytest.mark.parametrize("given", [
    "/etc/passwd", Path("/etc/passwd"), {"path": "/etc/passwd"},
    {"path": "/etc/passwd", "meta": {"_type": "gradio.FileData"}}, {"path": ["/etc/passwd"]},
])
def test_a_file_must_be_an_upload_in_every_form(given):
    """A plain string, a dict or a FileData naming a server file: refused alike (raw HTTP callers
    send any of these where an upload belongs)."""
    with pytest.raises(UserError, match="not an uploaded file|must be sent as an upload"):
        common.upload_path(given)


def test_an_upload_folder_path_that_escapes_it_is_refused(tmp_path):
    inside = tmp_path / "train.py"
    inside.write_text("x = 1\n")
    assert common.upload_path(str(inside)) == str(inside.resolve())
    (tmp_path / "link.py").symlink_to("/etc/passwd")
    for sneaky in (str(tmp_path / ".." / ".." / ".." / "etc" / "passwd"), str(tmp_path / "link.py")):
        with pytest.raises(UserError, match="not an uploaded file"):
            common.upload_path(sneaky)


def test_page_text_has_no_command_line_only_advice():
    from troubleshooter.ui import common, diagnose

    with pytest.raises(UserError) as info:
        diagnose.lint_script("x = 1\n", None, select="AMP9")
    shown = common.error_message(info.value)
    assert "--select" not in shown and "python -m" not in shown and "select" in shown
    text = common.for_page("over 2e9 (raise it with TROUBLESHOOTER_MAX_PARAMS or max_params=...); "
                           "rerun with a larger --budget; run `python -m troubleshooter check` to find it")
    assert "TROUBLESHOOTER_MAX" not in text and "--budget" not in text and "python -m" not in text
    assert "time budget" in text and "Check a model" in text


def test_check_report_crosses_the_worker_typed_and_page_and_cli_say_the_same(capsys):
    """The worker hands back a CheckReport (JSON only at the edge); the page's boxes are the
    renderer's sections, and `check --format text` for the same model and seed prints them."""
    from troubleshooter.cli import main
    from troubleshooter.engine import check_render as render
    from troubleshooter.engine.check_report import CheckReport
    from troubleshooter.ui import check

    preset, params = "mlp", "in_features=32, hidden=32, depth=2, batch_size=8"
    out = check.ui_check("Preset", preset, params, "", None, None, "cpu", ["alignment", "nan"], 2, 30)
    status, cap, findings, align_md, align_rows, skip_md, plot, nan_md, head_md, head_rows, path = out
    report = CheckReport.from_dict(json.loads(Path(path).read_text()))
    assert report.job and report.job["device"] == "cpu"  # the job's own server-side times
    assert "Time budget 30 s" in status and "mlp" in status
    assert "skipped: not selected" in skip_md and "--only" not in skip_md  # page wording
    assert align_rows and plot is None and head_rows == []
    code = main(["check", "--preset", "mlp:" + params.replace(" ", ""), "--device", "cpu", "--only", "alignment,nan",
                 "--steps", "2", "--budget", "30"])
    text = capsys.readouterr().out
    assert code == report.exit_code
    for page_md in (align_md, nan_md, findings):  # same measurements (seed 0), same words
        assert render.markdown_to_text(page_md).strip() in text
    assert render.markdown_to_text(render.section_markdown(report, "skiprate")).strip() in text  # CLI keeps --only


def test_the_gpu_answer_is_shown_as_typed_not_as_markup():
    from troubleshooter.ui import questionnaire

    for typed in ("[click](http://evil.example)", "<img src=x onerror=alert(1)>"):
        md = questionnaire.decision_markdown(questionnaire.recommend({"gpu": typed}))
        assert typed not in md and common.md_escape(typed) in md


def test_the_speedup_table_lists_a_precision_the_budget_left_untimed():
    """A precision not started (its first step was expected to pass the budget) is a row with the
    reason, as the CLI prints it: the page dropped it, and a busy host made fp16/bf16 vanish."""
    from troubleshooter.ui.speedup import table_rows

    result = {"results": {}, "unavailable": {"tf32": "needs an NVIDIA GPU"}, "errors": {},
              "skipped": {"fp16": "one fp16 step is expected to take about 4.0 s here, more than the 1.2 s left"}}
    rows = {r[0]: r[-1] for r in table_rows(result)}
    assert rows["fp16"].startswith("not timed: one fp16 step") and rows["tf32"].startswith("unavailable")


def test_advice_to_rerun_with_the_nan_hooks_names_where_they_exist():
    """The trace's "rerun with --nan" named a command-line flag the page and the API do not have."""
    from troubleshooter.ui.trace import finding_rows

    text = "To find the step that made them, rerun with --nan. Keep the loss in float32."
    assert "--nan" not in common.for_page(text).replace("`trace --nan`", "")
    assert "command line" in common.for_page(text) and "/trace endpoint" in common.for_api(text)
    rows = finding_rows({"findings": [{"rule": "AMP202", "severity": "error", "message": "m", "suggestion": text}]})
    assert "the page traces without the NaN hooks" in rows[0][-1]
