"""What the traced steps really computed in (`report["precision"]`, AMP292): from recorded raw
data, and on nanoGPT's unmodified train.py, which turns its own AMP off on a CPU."""
from pathlib import Path

import pytest

from tests.fixtures.trace.nanogpt_data import nanogpt_copy
from troubleshooter.trace import trace_script
from troubleshooter.trace.precision import in_effect, not_in_effect_findings
from troubleshooter.trace.report import render_text

NANOGPT = Path(__file__).parent / "fixtures" / "trace" / "real" / "nanogpt"
SMALL = ["config/train_shakespeare_char.py", "--device=cpu", "--compile=False", "--n_layer=1", "--n_head=2",
         "--n_embd=32", "--block_size=32", "--batch_size=4", "--max_iters=8", "--eval_iters=1", "--log_interval=1"]


def _raw(autocast=(), scalers=(), device="cpu", param_dtype="float32", steps=5):
    return {"steps_observed": steps, "device": {"type": device, "index": None, "name": device},
            "precision": {"autocast": [dict(a) for a in autocast], "scalers": [dict(s) for s in scalers],
                          "param_dtype": param_dtype}}


def _region(dtype="float16", device="cpu", enabled=True, count=5, line=20):
    return {"device": device, "dtype": dtype, "enabled": enabled, "path": "train.py", "line": line, "count": count,
            "steps": count}


def _scaler(enabled, asked=True, device="cuda", line=12):
    return {"path": "train.py", "line": line, "device": device, "enabled_asked": asked, "enabled": enabled}


def test_autocast_on_the_training_device_is_mixed_precision_and_needs_no_note():
    section = in_effect(_raw([_region("bfloat16")]))
    assert section["mixed"] and section["compute"] == "bfloat16 autocast"
    assert "5 bfloat16 autocast regions entered, the first at train.py:20" in section["summary"]
    assert not_in_effect_findings(section) == []


def test_a_scaler_torch_turned_off_is_reported_with_where_it_was_made():
    (f,) = not_in_effect_findings(in_effect(_raw(scalers=[_scaler(False)])))
    assert (f.rule, f.severity.value, f.location.line) == ("AMP292", "info", 12)
    assert "computed in float32 on cpu" in f.message and "torch turned it off" in f.message


def test_autocast_entered_disabled_or_for_another_device_is_reported():
    disabled = not_in_effect_findings(in_effect(_raw([_region(enabled=False)])))
    other = not_in_effect_findings(in_effect(_raw([_region(device="cuda")])))
    assert "entered disabled" in disabled[0].message
    assert "is for 'cuda', but the parameters are on cpu" in other[0].message


def test_an_enabled_scaler_without_autocast_is_reported():
    (f,) = not_in_effect_findings(in_effect(_raw(scalers=[_scaler(True, device="cpu")])))
    assert "scales float32 gradients" in f.message


def test_no_amp_code_no_steps_or_half_weights_give_no_note():
    assert not_in_effect_findings(in_effect(_raw())) == []  # a float32 script: the summary says so
    assert in_effect(_raw())["compute"] == "float32"
    assert not_in_effect_findings(in_effect(_raw(scalers=[_scaler(False)], steps=0))) == []
    half = in_effect(_raw(scalers=[_scaler(False)], param_dtype="float16"))
    assert half["mixed"] and half["compute"] == "float16 weights, no autocast"
    assert not_in_effect_findings(half) == []
    assert not_in_effect_findings(in_effect(_raw([_region("float32", enabled=False)], [_scaler(False, asked=False)]))) == []


@pytest.fixture
def nanogpt(tmp_path):
    return nanogpt_copy(tmp_path)


def test_unmodified_nanogpt_on_a_cpu_says_no_mixed_precision_ran(nanogpt):
    report = trace_script(nanogpt / "train.py", SMALL, steps=3, cwd=nanogpt, timeout_s=300)
    assert report["exit"]["status"] == "stopped" and report["steps_observed"] == 3
    assert report["device"]["type"] == "cpu"
    section = report["precision"]
    assert section["mixed"] is False and section["compute"] == "float32"
    (f,) = [f for f in report["findings"] if f["rule"] == "AMP292"]
    assert f["severity"] == "info" and f["path"].endswith("train.py") and f["line"] == 196  # the GradScaler line
    assert not [x for x in report["findings"] if x["severity"] in ("error", "warning")]
    text = render_text(report)
    assert "Precision in effect: float32 on cpu" in text and "AMP protocol looked right" not in text


def test_nanogpt_with_bf16_autocast_on_the_cpu_reports_it_and_no_note(nanogpt):
    script = nanogpt / "train.py"
    source = script.read_text()
    published = ("ctx = nullcontext() if device_type == 'cpu' else "
                 "torch.amp.autocast(device_type=device_type, dtype=ptdtype)")
    assert published in source
    script.write_text(source.replace(published, "ctx = torch.amp.autocast(device_type=device_type, dtype=torch.bfloat16)"))
    report = trace_script(script, SMALL, steps=3, cwd=nanogpt, timeout_s=300)
    assert report["precision"]["mixed"] and report["precision"]["compute"] == "bfloat16 autocast"
    assert not [f for f in report["findings"] if f["rule"] == "AMP292"]


def test_the_device_is_read_while_the_optimizer_lives(tmp_path):
    """A script whose optimizer is local to main() frees it when the trace stops the script;
    the device and dtype must have been read at the first step (they were None before)."""
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        "def main():\n"
        "    model = torch.nn.Linear(4, 2)\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    scaler = torch.amp.GradScaler('cpu')\n"
        "    for _ in range(10):\n"
        "        with torch.autocast('cpu', dtype=torch.bfloat16):\n"
        "            loss = model(torch.randn(8, 4)).float().pow(2).mean()\n"
        "        scaler.scale(loss).backward()\n"
        "        scaler.step(opt)\n"
        "        scaler.update()\n"
        "        opt.zero_grad()\n"
        "main()\n")
    report = trace_script(script, [], steps=2, cwd=tmp_path, timeout_s=120)
    assert report["device"]["type"] == "cpu" and "param_dtype" not in report["device"]
    assert report["precision"]["param_dtype"] == "float32"
    assert report["precision"]["compute"] == "bfloat16 autocast"
    assert report["precision"]["scalers"][0]["enabled"] is True


def test_the_app_summary_says_when_no_mixed_precision_ran():
    from troubleshooter.ui.trace import summary_markdown

    section = in_effect(_raw(scalers=[_scaler(False)]))
    text = summary_markdown({"script": "train.py", "device": {"type": "cpu"}, "steps_observed": 5,
                             "exit": {"status": "stopped"}, "findings": [], "precision": section})
    assert "Precision in effect (no mixed precision ran): float32 on cpu" in text
    mixed = summary_markdown({"script": "train.py", "steps_observed": 5, "exit": {"status": "stopped"},
                              "precision": in_effect(_raw([_region()]))})
    assert "Precision in effect: float16 autocast on cpu" in mixed
    assert "Tracing added" not in mixed  # no overhead measured: no line
    timed = summary_markdown({"script": "train.py", "steps_observed": 5, "exit": {"status": "stopped"},
                              "overhead": {"per_step_ms": 0.25, "step_ms": 5.0, "share": 0.05, "steps_timed": 4}})
    assert "Tracing added about 0.25 ms per step (5.0% of the step without it)" in timed


def test_installed_packages_are_not_the_users_files(tmp_path):
    """In a virtualenv site-packages is not below the stdlib path: typing_extensions' @deprecated
    wrapper around torch.cuda.amp.GradScaler was taken for the line that made the scaler."""
    from troubleshooter.trace.locate import is_user_file

    assert not is_user_file(str(tmp_path / "venv" / "lib" / "python3.11" / "site-packages" / "typing_extensions.py"))
    assert not is_user_file("/usr/lib/python3/dist-packages/transformers/trainer.py")
    assert is_user_file(str(tmp_path / "project" / "train.py"))
