"""The questionnaire's decision function against a table of answer sets, and the `ask` command."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from troubleshooter import questionnaire as q
from troubleshooter.cli import main
from troubleshooter.errors import UserError
from troubleshooter.recipes import render_recipe

FIXTURES = Path(__file__).parent / "fixtures" / "answers"

# answers -> expected precision, recipe options that must be set, (answer key, words) reasons
TABLE = [
    ({"gpu": "V100"}, "fp16", {}, [("gpu", "V100 (Volta) has no bf16 tensor cores, so fp16 with GradScaler")]),
    ({"gpu": "Tesla T4", "grad_clipping": True}, "fp16", {"clip": 1.0},
     [("gpu", "no bf16"), ("grad_clipping", "unscales first")]),
    ({"gpu": "A100", "symptoms": ["nan_loss"]}, "bf16", {"nan_guard": True},
     [("symptoms", "NaNs under fp16 and an Ampere GPU: bf16 removes the overflow")]),
    ({"gpu": "H100", "symptoms": ["nan_loss"]}, "bf16", {}, [("symptoms", "a Hopper GPU")]),
    ({"gpu": "RTX 4090"}, "bf16", {}, [("gpu", "bf16 tensor cores")]),
    ({"gpu": "A100", "bitexact_fp16": True}, "fp16", {}, [("bitexact_fp16", "bit for bit")]),
    ({"gpu": "V100", "symptoms": ["nan_loss"], "bf16_pretrained": True}, "fp32", {"nan_guard": True},
     [("bf16_pretrained", "stay fp32")]),
    ({"gpu": "T4", "bf16_pretrained": True}, "fp16", {"nan_guard": True}, [("gpu", "fp16 with GradScaler")]),
    ({"gpu": "GTX 1080 Ti"}, "fp32", {}, [("gpu", "stay fp32")]),
    ({"gpu": "P100"}, "fp16", {}, [("gpu", "twice its fp32 rate")]),
    ({"gpu": "A6000"}, "bf16", {}, [("gpu", "RTX A6000 (Ampere)")]),
    ({"gpu": "sm_75"}, "fp16", {}, [("gpu", "Turing")]),
    ({"gpu": "8.9"}, "bf16", {}, [("gpu", "Ada")]),
    ({"gpu": "cpu", "cpu_bf16": False}, "fp32", {}, [("gpu", "no AMX or AVX512-BF16")]),
    ({"gpu": "cpu", "cpu_bf16": True}, "bf16", {}, [("gpu", "has AMX/AVX512-BF16")]),
    ({"gpu": "A10G", "model_family": "cnn", "batchnorm": True}, "bf16", {"model": "cnn", "channels_last": True},
     [("model_family", "channels_last"), ("batchnorm", "float32 statistics")]),
    ({"gpu": "V100", "grad_accumulation": 8, "multi_gpu": "ddp"}, "fp16", {"accum": 8, "distributed": "ddp"},
     [("grad_accumulation", "divided by 8"), ("multi_gpu", "DDP")]),
    ({"gpu": "V100", "multi_gpu": "fsdp"}, "fp16", {"distributed": "fsdp"}, [("multi_gpu", "ShardedGradScaler")]),
    ({"gpu": "L4", "symptoms": ["slow"]}, "bf16", {"compile": True}, [("symptoms", "slower than expected")]),
    ({"gpu": "A100", "symptoms": ["slow"], "multi_gpu": "fsdp"}, "bf16", {"compile": False, "distributed": "fsdp"},
     [("symptoms", "slower")]),
    ({"gpu": "A100", "custom_exp_log_loss": True}, "bf16", {"nan_guard": True},
     [("custom_exp_log_loss", "float32 outside autocast")]),
    ({"gpu": "H100", "params_millions": 5000, "multi_gpu": "fsdp"}, "bf16", {}, [("params_millions", "FSDP shards")]),
]


@pytest.mark.parametrize("answers, precision, options, reasons", TABLE, ids=[str(t[0]) for t in TABLE])
def test_decision_table(answers, precision, options, reasons):
    d = q.decide(answers)
    assert d.precision == precision
    assert d.recipe_options["precision"] == precision
    for key, value in options.items():
        assert d.recipe_options[key] == value, key
    for answer, words in reasons:
        assert any(r.answer == answer and words in r.text for r in d.reasons), (answer, words, d.reasons)
    render_recipe(**d.recipe_options)  # every decision is a recipe that exists


def test_loose_answer_spellings():
    d = q.decide({"gpu": 4090, "params_millions": "7B", "symptoms": "slow", "grad_clipping": "yes"})
    assert d.precision == "bf16" and d.device == "RTX 4090" and d.recipe_options["clip"] == 1.0
    assert any("112 GB" in w for w in d.warnings)


def test_warnings_for_memory_oom_and_bitexact():
    d = q.decide({"gpu": "T4", "params_millions": 2000, "symptoms": ["oom"]})
    assert any("32 GB" in w and "16 GB" in w and "FSDP" in w for w in d.warnings)
    assert any("out of memory" in w for w in d.warnings)
    d = q.decide({"gpu": "A100", "bitexact_fp16": True, "symptoms": ["nan_loss"]})
    assert d.precision == "fp16" and any("bf16" in w for w in d.warnings) and any("deterministic" in w for w in d.warnings)


def test_bad_answers_are_all_reported_at_once():
    with pytest.raises(UserError) as exc:
        q.decide(q.load_answers(str(FIXTURES / "bad.yaml")))
    text = str(exc.value)
    for part in ("colour", "model_family", "params_millions", "'sad'", "grad_clipping", "grad_accumulation",
                 "multi_gpu", "GTX 9999"):
        assert part in text, part
    assert len(exc.value.problems) == 8


@pytest.mark.parametrize("answers, words", [
    ({}, "gpu: required"),
    ({"gpu": "V100", "symptoms": "nan_loss, oom, hungry"}, "'hungry'"),
    ({"gpu": "V100", "grad_accumulation": 2.5}, "whole number"),
    ([1, 2], "mapping"),
])
def test_bad_answer_shapes(answers, words):
    with pytest.raises(UserError, match=words):
        q.decide(answers)


def test_symptoms_from_a_pasted_log_feed_the_decision():
    log = "\n".join(f"step {i} | loss 2.3 | scale {2.0 ** (16 - 3 * i):g}" for i in range(7))
    d = q.decide({"gpu": "V100", "log": log})
    assert "no_convergence" in d.symptoms_from_log
    assert any(r.answer == "log" for r in d.reasons)
    d = q.decide({"gpu": "A100", "log": "RuntimeError: Function 'ExpBackward0' returned nan values in its 0th output."})
    assert d.precision == "bf16" and d.recipe_options["nan_guard"] and "nan_loss" in d.symptoms_from_log


def test_detect_uses_the_capability_check():
    d = q.decide({"gpu": "detect"})  # this host: a CPU
    assert d.precision in ("bf16", "fp32") and "detected" in d.device


def test_questions_file_covers_every_answer_key():
    keys = [x["key"] for x in q.questions()]
    for key in ("gpu", "model_family", "params_millions", "symptoms", "grad_clipping", "grad_accumulation",
                "custom_exp_log_loss", "batchnorm", "multi_gpu", "bitexact_fp16", "bf16_pretrained"):
        assert key in keys
    assert all(x["prompt"] for x in q.questions())


def test_decide_needs_no_torch():
    code = ("import sys; from troubleshooter.questionnaire import decide; "
            "d = decide({'gpu': 'V100', 'symptoms': ['nan_loss'], 'log': 'loss: nan'}); "
            "assert 'torch' not in sys.modules, 'torch imported'; print(d.precision)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parent.parent, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "fp16", out.stderr


def test_ask_json_and_recipe_output(tmp_path, capsys):
    out = tmp_path / "train_amp.py"
    assert main(["ask", "--answers", str(FIXTURES / "v100_nan_clip.yaml"), "--format", "json", "-o", str(out)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) >= {"precision", "recipe_options", "reasons", "warnings"}
    assert data["precision"] == "fp16" and data["recipe_options"]["clip"] == 1.0
    assert data["recipe_options"]["accum"] == 4 and data["recipe_options"]["nan_guard"] is True
    assert out.read_text() == render_recipe(**data["recipe_options"])
    assert main(["ask", "--answers", str(FIXTURES / "a100_nan.json")]) == 0
    assert "Precision: bf16" in capsys.readouterr().out


def test_ask_bad_file_is_a_clear_error(tmp_path, capsys):
    assert main(["ask", "--answers", str(FIXTURES / "bad.yaml")]) == 2
    assert main(["ask", "--answers", str(tmp_path / "missing.yaml")]) == 2
    broken = tmp_path / "broken.json"
    broken.write_text("{gpu: ")
    assert main(["ask", "--answers", str(broken)]) == 2
    err = capsys.readouterr().err
    assert "invalid answers" in err and "cannot read" in err and "not valid JSON" in err and "Traceback" not in err


def test_ask_interactive(monkeypatch, capsys):
    replies = iter(["V100", "cnn", "25", "nan_loss, banana", "nan_loss", "y", "2", "n", "yes", "none", "", "", "",
                    "loss: nan", ""])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(replies))
    assert main(["ask", "--format", "json"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert "'banana'" in captured.err  # re-asked after a bad answer
    assert data["precision"] == "fp16"
    assert data["recipe_options"]["model"] == "cnn" and data["recipe_options"]["clip"] == 1.0
    assert data["recipe_options"]["accum"] == 2


def test_ask_without_terminal_input_says_how(monkeypatch, capsys):
    def eof(prompt=""):
        raise EOFError
    monkeypatch.setattr("builtins.input", eof)
    assert main(["ask"]) == 2
    assert "--answers" in capsys.readouterr().err
