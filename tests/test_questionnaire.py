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
    # One GPU: no advice to shard across GPUs; LoRA, 8-bit optimizers, activation checkpointing instead.
    assert any("32 GB" in w and "16 GB" in w and "LoRA" in w and "8-bit" in w for w in d.warnings)
    assert not any("FSDP" in text for text in d.warnings + list(d.reasons))
    assert any("out of memory" in w for w in d.warnings) and d.recipe_options["activation_checkpointing"]
    d = q.decide({"gpu": "T4", "params_millions": 2000, "multi_gpu": "ddp"})
    assert any("FSDP" in w and "DDP keeps a full copy" in w for w in d.warnings)
    d = q.decide({"gpu": "A100", "bitexact_fp16": True, "symptoms": ["nan_loss"]})
    assert d.precision == "fp16" and any("bf16" in w for w in d.warnings) and any("deterministic" in w for w in d.warnings)


def test_bad_answers_are_all_reported_at_once():
    with pytest.raises(UserError) as exc:
        q.decide(q.load_answers(str(FIXTURES / "bad.yaml")))
    text = str(exc.value)
    for part in ("colour", "model_family", "params_millions", "'sad'", "grad_clipping", "grad_accumulation",
                 "multi_gpu"):
        assert part in text, part
    assert "GTX 9999" not in text  # an unknown GPU is answered with a warning, not refused
    assert len(exc.value.problems) == 7


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
    assert set(data) >= {"precision", "recipe_options", "reasons", "warnings", "device_facts"}
    assert data["device_facts"]["architecture"] == "Volta" and data["device_facts"]["compute_capability"] == "7.0"
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
    replies = iter(["V100", "cnn", "25", "nan_loss, banana", "nan_loss", "fp16", "y", "2", "n", "yes", "none", "", "",
                    "", "", "", "", "", "loss: nan", ""])
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


# Real GPU names from every vendor -> architecture, capability, memory (given in the name or usual).
GPU_NAMES = [
    ("NVIDIA GeForce RTX 3080", "Ampere", (8, 6), 10, "bf16"),
    ("RTX 3060", "Ampere", (8, 6), 12, "bf16"),
    ("NVIDIA GeForce RTX 4080", "Ada", (8, 9), 16, "bf16"),
    ("RTX 5090", "Blackwell", (12, 0), 32, "bf16"),
    ("NVIDIA A40", "Ampere", (8, 6), 48, "bf16"),
    ("NVIDIA GeForce RTX 2080 SUPER", "Turing", (7, 5), 8, "fp16"),
    ("NVIDIA GeForce RTX 4070 SUPER", "Ada", (8, 9), 12, "bf16"),
    ("RTX 2080", "Turing", (7, 5), 8, "fp16"),
    ("A100 40GB", "Ampere", (8, 0), 40, "bf16"),
    ("NVIDIA A100-SXM4-40GB", "Ampere", (8, 0), 40, "bf16"),
    ("V100 16GB", "Volta", (7, 0), 16, "fp16"),
    ("Tesla V100-SXM2-16GB", "Volta", (7, 0), 16, "fp16"),
    ("NVIDIA L40", "Ada", (8, 9), 48, "bf16"),
    ("NVIDIA L4", "Ada", (8, 9), 24, "bf16"),
    ("NVIDIA GeForce GTX 1660 SUPER", "Turing", (7, 5), 6, "fp16"),
    ("Tesla K80", "Kepler", (3, 7), 12, "fp32"),
    ("NVIDIA RTX 6000 Ada Generation", "Ada", (8, 9), 48, "bf16"),
    ("Quadro RTX 8000", "Turing", (7, 5), 48, "fp16"),
    ("NVIDIA H100 80GB HBM3", "Hopper", (9, 0), 80, "bf16"),
    ("NVIDIA B200", "Blackwell", (10, 0), 180, "bf16"),
    ("sm_86", "Ampere", (8, 6), None, "bf16"),
    ("cc 7.5", "Turing", (7, 5), None, "fp16"),
    ("compute capability 9.0", "Hopper", (9, 0), None, "bf16"),
    ("AMD Instinct MI250X", "CDNA2", None, 64, "bf16"),  # each GCD: a 64 GB device (issue 26)
    ("AMD Instinct MI300X", "CDNA3", None, 192, "bf16"),
    ("MI100", "CDNA1", None, 32, "fp16"),
    ("AMD Radeon RX 7900 XTX", "RDNA3", None, 24, "bf16"),
    ("Radeon RX 6800 XT", "RDNA2", None, None, "fp16"),
    ("Apple M2 Max", "Apple silicon", None, None, "fp16"),
    ("Apple M1", "Apple silicon (M1)", None, None, "fp16"),
    ("Intel(R) Data Center GPU Max 1550", "Xe-HPC", None, 128, "bf16"),
    ("Intel Arc A770 16GB", "Xe-HPG", None, 16, "bf16"),
]


@pytest.mark.parametrize("name, arch, cc, memory, precision", GPU_NAMES, ids=[g[0] for g in GPU_NAMES])
def test_every_vendor_resolves(name, arch, cc, memory, precision):
    d = q.decide({"gpu": name, "params_millions": 100})
    dev = q.resolve_device(name)
    assert (dev.arch, dev.cc, dev.memory_gb) == (arch, cc, memory)
    assert d.precision == precision and not any("unknown GPU" in w for w in d.warnings)


def test_unknown_gpu_is_answered_with_a_warning():
    d = q.decide({"gpu": "Zephyr Accelerator 9"})
    assert d.precision == "fp16" and any("unknown GPU" in w and "sm_86" in w for w in d.warnings)
    assert q.decide({"gpu": "AMD Radeon Future 9999"}).warnings  # AMD, not in the table: a warning


@pytest.mark.parametrize("name, capability, memory, vendor, arch", [
    ("NVIDIA GeForce RTX 3080", (8, 6), 10.0, "nvidia", "Ampere"),
    ("NVIDIA Some New Card", (12, 0), 24.0, "nvidia", "Blackwell"),  # a name no table knows
    ("Tesla P100-PCIE-16GB", (6, 0), 16.0, "nvidia", "Pascal"),
    ("AMD Instinct MI300X", (9, 4), 192.0, "amd", "CDNA3"),
])
def test_gpu_answer_from_device_round_trips(name, capability, memory, vendor, arch):
    text = q.gpu_answer_from_device(name, capability, memory, vendor)
    dev = q.resolve_device(text)
    assert dev.arch == arch and dev.memory_gb == memory
    if vendor == "nvidia":
        assert f"sm_{capability[0]}{capability[1]}" in text and dev.cc == capability
    assert q.decide({"gpu": text}).device  # the questionnaire accepts it as the GPU answer


@pytest.mark.parametrize("answers, precision, must, must_not", [
    # NaNs under bf16 or fp32 are not an fp16 overflow: same precision, model/data/LR advice.
    ({"gpu": "A100", "symptoms": ["nan_loss"], "current_precision": "bf16"}, "bf16",
     ["not an fp16 overflow", "learning-rate", "check"], ["bf16 removes the overflow"]),
    ({"gpu": "H100", "symptoms": ["nan_loss"], "current_precision": "fp32"}, "bf16",
     ["not an fp16 overflow"], ["removes the overflow"]),
    ({"gpu": "V100", "symptoms": ["nan_loss"], "current_precision": "fp32", "bf16_pretrained": True}, "fp16",
     ["not an fp16 overflow"], ["stay fp32"]),
    ({"gpu": "A100", "symptoms": ["nan_loss"], "log": "bf16-mixed precision\nEpoch 2: loss=nan"}, "bf16",
     ["not an fp16 overflow", "ran in bf16"], ["removes the overflow"]),
    # Tiny models: AMP does not help; fp32 with TF32 on Ampere+.
    ({"gpu": "RTX 3090", "params_millions": 0.2, "model_family": "rl"}, "fp32", ["too small", "TF32", "CUDA graphs"], []),
    ({"gpu": "A100", "model_family": "rl"}, "fp32", ["reinforcement-learning", "TF32"], []),
    ({"gpu": "T4", "params_millions": 3}, "fp32", ["too small"], ["TF32"]),
    ({"gpu": "GTX 1080 Ti"}, "fp32", ["stay fp32"], ["TF32"]),
    # BatchNorm with accumulation: SyncBatchNorm or a larger micro-batch, never a smaller batch.
    ({"gpu": "A100", "model_family": "cnn", "batchnorm": True, "grad_accumulation": 4, "multi_gpu": "ddp",
      "symptoms": ["oom"]}, "bf16", ["SyncBatchNorm", "activation checkpointing"], ["lower --batch-size"]),
    ({"gpu": "P100"}, "fp16", ["twice its fp32 rate"], []),
])
def test_decisions_follow_the_evidence(answers, precision, must, must_not):
    d = q.decide(answers)
    text = " ".join(list(d.reasons) + d.warnings)
    assert d.precision == precision
    for words in must:
        assert words in text, words
    for words in must_not:
        assert words not in text, words
    render_recipe(**d.recipe_options)


def test_tf32_is_on_wherever_fp32_is_kept_on_ampere():
    d = q.decide({"gpu": "RTX 4090", "params_millions": 1})
    assert d.precision == "fp32" and d.recipe_options["tf32"] is True
    d = q.decide({"gpu": "A100", "model_family": "cnn", "batchnorm": True, "grad_accumulation": 2, "multi_gpu": "ddp"})
    assert d.recipe_options["sync_batchnorm"] is True


def test_p100_gets_the_same_answer_from_ask_and_recipe_auto():
    text = render_recipe(precision="auto")
    assert "(6, 0)" in text and q.decide({"gpu": "Tesla P100-PCIE-16GB"}).precision == "fp16"


def test_answer_aliases():
    d = q.decide({"gpu": "A100", "symptoms": ["nan_loss"], "nan_precision": "bf16"})
    assert any(r.answer == "current_precision" for r in d.reasons)


# --- issue 26: answers that fit the GPU, the size and the task ------------------------------------

@pytest.mark.parametrize("gpu", ["H100", "H200", "B200"])
def test_fp8_is_offered_with_what_it_needs_on_fp8_gpus(gpu):
    d = q.decide({"gpu": gpu, "model_family": "transformer", "params_millions": 7000})
    assert d.precision == "bf16" and d.fp8 and d.fp8["big_enough"]
    text = " ".join(d.fp8["advice"])
    assert "torchao" in text and "Transformer Engine" in text and "divisible by 16" in text and "recipe" in text
    assert "FP8 (optional" in d.to_text() and d.to_dict()["fp8"]["applies"] is True
    for no_fp8 in ({"gpu": "A100"}, {"gpu": "H100", "training": "inference"}, {"gpu": "H100", "model_family": "cnn"}):
        assert q.decide({"params_millions": 7000, **no_fp8}).fp8 is None, no_fp8


def test_blackwell_needs_a_torch_build_with_its_kernels():
    warned = [w for w in q.decide({"gpu": "RTX 5090"}).warnings if "sm_120" in w]
    assert warned and "cu128" in warned[0] and "2.7" in warned[0]
    assert not any("PyTorch build" in w for w in q.decide({"gpu": "RTX 4090"}).warnings)


@pytest.mark.parametrize("answers", [{"gpu": "8x V100"}, {"gpu": "8x V100", "multi_gpu": "fsdp"},
                                     {"gpu": "V100", "num_gpus": 8, "multi_gpu": "ddp"}])
def test_13b_on_eight_v100s_is_warned_about_memory(answers):
    d = q.decide({**answers, "params_millions": 13000})
    memory = [w for w in d.warnings if "208 GB" in w]
    assert memory and "26 GB per V100" in memory[0] and d.num_gpus == 8


def test_the_recipe_does_what_the_task_reasons_say():
    lora = q.decide({"gpu": "T4", "training": "lora", "params_millions": 7000})
    assert lora.recipe_options["lora"] is True and "--lora" in lora.to_text()
    weights = q.decide({"gpu": "V100", "fp16_weights": True})
    assert weights.recipe_options["load_weights"] is True
    inference = q.decide({"gpu": "A100", "training": "inference", "grad_clipping": True, "grad_accumulation": 4})
    opts = inference.recipe_options
    assert opts["task"] == "inference" and opts["clip"] is None and opts["accum"] == 1
    assert "GradScaler(" not in render_recipe(**opts) and not any("training loop" in w for w in inference.warnings)


def test_gpu_count_in_the_answer():
    assert q.gpu_count("8x V100") == (8, "V100") and q.gpu_count("4 H100s") == (4, "H100")
    assert q.gpu_count("A100 40GB") == (None, "A100 40GB") and q.gpu_count("16 GB T4") == (None, "16 GB T4")
