"""Expert scenarios for `ask`: each precision was written down from first principles BEFORE the tool
was run (see docs/questionnaire.md), then every decision is checked for reasons that contradict the
evidence (the answers and the resolved device). Pure Python, no torch, a few milliseconds each."""
from __future__ import annotations

import io
import json
import sys

import pytest

from troubleshooter import questionnaire as q
from troubleshooter.cli import main

# (id, answers, precision(s) an expert accepts). Two precisions only where experts genuinely differ.
SCENARIOS = [
    ("v100-transformer", {"gpu": "Tesla V100-SXM2-16GB", "model_family": "transformer", "params_millions": 350}, {"fp16"}),
    ("a100-llm-fsdp", {"gpu": "NVIDIA A100-SXM4-80GB", "model_family": "transformer", "params_millions": 7000,
                       "multi_gpu": "fsdp"}, {"bf16"}),
    ("h100-transformer", {"gpu": "NVIDIA H100 80GB HBM3", "model_family": "transformer", "params_millions": 1300}, {"bf16"}),
    ("t4-cnn", {"gpu": "Tesla T4", "model_family": "cnn", "params_millions": 25}, {"fp16"}),
    ("cpu-without-amx", {"gpu": "cpu", "cpu_bf16": False, "model_family": "cnn", "params_millions": 25}, {"fp32"}),
    ("cpu-with-amx", {"gpu": "cpu", "cpu_bf16": True, "model_family": "transformer", "params_millions": 110}, {"bf16"}),
    # MPS: fp16 autocast + GradScaler('mps') is the supported path; bf16 needs macOS 14 and is not faster.
    ("apple-m2-max", {"gpu": "Apple M2 Max", "model_family": "cnn", "params_millions": 25}, {"fp16", "bf16"}),
    ("mi250x", {"gpu": "AMD Instinct MI250X", "model_family": "transformer", "params_millions": 1300}, {"bf16"}),
    ("mi300x-fsdp", {"gpu": "AMD Instinct MI300X", "model_family": "transformer", "params_millions": 13000,
                     "multi_gpu": "fsdp"}, {"bf16"}),
    # P100: fast fp16 (2x) but no tensor cores; either fp16 for memory/modest speed or fp32.
    ("p100", {"gpu": "Tesla P100-PCIE-16GB", "model_family": "cnn", "params_millions": 25}, {"fp16", "fp32"}),
    ("gtx-1080-ti", {"gpu": "GeForce GTX 1080 Ti", "model_family": "cnn", "params_millions": 25}, {"fp32"}),
    ("rtx-4090", {"gpu": "NVIDIA GeForce RTX 4090", "model_family": "transformer", "params_millions": 125}, {"bf16"}),
    ("rtx-2080-ti", {"gpu": "GeForce RTX 2080 Ti", "model_family": "transformer", "params_millions": 125}, {"fp16"}),
    # bf16-pretrained weights on a GPU without bf16: fp16 with a NaN watch, or fp32 to be safe.
    ("v100-bf16-pretrained", {"gpu": "V100", "model_family": "transformer", "params_millions": 770,
                              "bf16_pretrained": True}, {"fp16", "fp32"}),
    ("a100-nan-under-bf16", {"gpu": "A100", "model_family": "transformer", "params_millions": 350,
                             "symptoms": ["nan_loss"], "current_precision": "bf16"}, {"bf16"}),
    ("a100-nan-under-fp32", {"gpu": "A100", "model_family": "transformer", "params_millions": 350,
                             "symptoms": ["nan_loss"], "current_precision": "fp32"}, {"bf16"}),
    ("v100-nan-fp16-custom-loss", {"gpu": "V100", "model_family": "cnn", "params_millions": 60, "symptoms": ["nan_loss"],
                                   "current_precision": "fp16", "custom_exp_log_loss": True}, {"fp16"}),
    ("a100-nan-under-fp16", {"gpu": "A100", "model_family": "transformer", "params_millions": 350,
                             "symptoms": ["nan_loss"], "current_precision": "fp16"}, {"bf16"}),
    ("v100-lstm", {"gpu": "V100", "model_family": "rnn", "params_millions": 40}, {"fp16"}),
    ("a100-lstm", {"gpu": "A100", "model_family": "rnn", "params_millions": 40}, {"bf16"}),
    ("a100-tiny-rl-policy", {"gpu": "A100", "model_family": "rl", "params_millions": 0.1}, {"fp32"}),
    ("t4-tiny-mlp", {"gpu": "T4", "model_family": "mlp", "params_millions": 2}, {"fp32"}),
    ("a100-diffusion-unet", {"gpu": "A100", "model_family": "cnn", "params_millions": 860}, {"bf16"}),
    ("t4-diffusion-unet-oom", {"gpu": "T4", "model_family": "cnn", "params_millions": 860, "symptoms": ["oom"]}, {"fp16"}),
    ("a10g-llm-7b-finetune-oom", {"gpu": "NVIDIA A10G", "model_family": "transformer", "params_millions": 7000,
                                  "symptoms": ["oom"]}, {"bf16"}),
    ("t4-llm-7b-finetune-oom", {"gpu": "Tesla T4", "model_family": "transformer", "params_millions": 7000,
                                "symptoms": ["oom"]}, {"fp16"}),
    ("a100-bitexact-fp16", {"gpu": "A100", "model_family": "transformer", "params_millions": 350, "bitexact_fp16": True}, {"fp16"}),
    ("intel-max-1550", {"gpu": "Intel(R) Data Center GPU Max 1550", "model_family": "transformer", "params_millions": 350}, {"bf16"}),
    ("intel-arc-a770", {"gpu": "Intel Arc A770", "model_family": "cnn", "params_millions": 25}, {"bf16"}),
    ("radeon-7900-xtx", {"gpu": "Radeon RX 7900 XTX", "model_family": "transformer", "params_millions": 125}, {"bf16"}),
    ("radeon-6800-xt", {"gpu": "AMD Radeon RX 6800 XT", "model_family": "cnn", "params_millions": 25}, {"fp16"}),
    ("v100-batchnorm-accumulation", {"gpu": "V100", "model_family": "cnn", "params_millions": 25, "batchnorm": True,
                                     "grad_accumulation": 8}, {"fp16"}),
    ("v100-batchnorm-accumulation-oom", {"gpu": "V100", "model_family": "cnn", "params_millions": 25, "batchnorm": True,
                                         "grad_accumulation": 4, "symptoms": ["oom"]}, {"fp16"}),
    ("a100-ddp-batchnorm-cnn", {"gpu": "A100", "model_family": "cnn", "params_millions": 25, "batchnorm": True,
                                "multi_gpu": "ddp", "grad_accumulation": 2}, {"bf16"}),
    # BatchNorm in the user's model, but the recipe's model for transformers has none: no SyncBatchNorm option.
    ("a100-ddp-batchnorm-transformer", {"gpu": "A100", "model_family": "transformer", "params_millions": 350,
                                        "batchnorm": True, "multi_gpu": "ddp", "grad_accumulation": 4}, {"bf16"}),
    ("h100-ddp-oom", {"gpu": "H100", "model_family": "transformer", "params_millions": 3000, "multi_gpu": "ddp",
                      "symptoms": ["oom"]}, {"bf16"}),
    ("a100-single-gpu-13b-oom", {"gpu": "A100 80GB", "model_family": "transformer", "params_millions": 13000,
                                 "symptoms": ["oom"]}, {"bf16"}),
    ("l4", {"gpu": "NVIDIA L4", "model_family": "transformer", "params_millions": 350}, {"bf16"}),
    ("quadro-rtx-8000", {"gpu": "Quadro RTX 8000", "model_family": "cnn", "params_millions": 25}, {"fp16"}),
    ("a100-slow-cnn", {"gpu": "A100", "model_family": "cnn", "params_millions": 11, "symptoms": ["slow"]}, {"bf16"}),
    ("t1000-cnn", {"gpu": "NVIDIA T1000", "model_family": "cnn", "params_millions": 25}, {"fp16", "fp32"}),
    ("gh200-llm", {"gpu": "NVIDIA GH200 480GB", "model_family": "transformer", "params_millions": 7000,
                   "multi_gpu": "fsdp"}, {"bf16"}),
    ("b200-llm", {"gpu": "NVIDIA B200", "model_family": "transformer", "params_millions": 70000, "multi_gpu": "fsdp"}, {"bf16"}),
    # Inference, adapters, float16 checkpoints (the `training` and `fp16_weights` answers).
    ("v100-inference", {"gpu": "V100", "model_family": "transformer", "params_millions": 7000,
                        "training": "inference"}, {"fp16"}),
    ("a100-inference", {"gpu": "A100", "model_family": "transformer", "params_millions": 7000,
                        "training": "inference"}, {"bf16"}),
    ("cpu-inference", {"gpu": "cpu", "cpu_bf16": False, "model_family": "cnn", "params_millions": 25,
                       "training": "inference"}, {"fp32"}),
    ("t4-lora-7b", {"gpu": "T4", "model_family": "transformer", "params_millions": 7000, "training": "lora"}, {"fp16"}),
    ("a10g-lora-13b-oom", {"gpu": "A10G", "model_family": "transformer", "params_millions": 13000, "training": "lora",
                           "symptoms": ["oom"]}, {"bf16"}),
    ("v100-fp16-checkpoint-finetune", {"gpu": "V100", "model_family": "transformer", "params_millions": 350,
                                       "training": "finetune", "fp16_weights": True}, {"fp16"}),
    ("v100-nan-bf16-pretrained", {"gpu": "V100", "model_family": "transformer", "params_millions": 770,
                                  "bf16_pretrained": True, "symptoms": ["nan_loss"], "current_precision": "fp16"}, {"fp32"}),
]


def contradictions(answers: dict, d: q.Decision) -> list[str]:
    """Statements in the reasons/warnings that the answers or the resolved device contradict."""
    facts, opts = d.device_facts, d.recipe_options
    texts = [str(r) for r in d.reasons] + list(d.warnings)
    said = "\n".join(texts).lower()
    out = []
    if d.precision == "bf16" and not facts["bf16"]:
        out.append("bf16 chosen on a device without bf16")
    if d.precision == "bf16" and "fp16 with gradscaler" in said:
        out.append("bf16 chosen but a reason prescribes fp16 with GradScaler")
    if not facts["tensor_cores"] and any(p in said for p in ("on tensor cores", "tensor-core conv")):
        out.append("a reason relies on tensor cores the device does not have")
    if opts.get("channels_last") and not facts["tensor_cores"]:
        out.append("channels_last for tensor cores on a device without them")
    if not facts["tf32"] and "tf32 on" in said:
        out.append("TF32 recommended on a device without TF32")
    if d.precision == "fp32" and facts["tf32"] and "tf32" not in said:
        out.append("fp32 kept on an Ampere-or-newer GPU without mentioning TF32")
    multi = answers.get("multi_gpu", "none")
    if multi == "none" and any(p in said for p in ("fsdp shards", "shard them with fsdp", "multi_gpu: fsdp")):
        out.append("a single GPU is told to shard with FSDP")
    if answers.get("batchnorm") and any(p in said for p in ("lower --batch-size", "smaller batch")):
        out.append("a BatchNorm model is told to shrink its batch")
    if answers.get("current_precision") in ("bf16", "fp32") and "nan_loss" in answers.get("symptoms", []):
        if "not an fp16 overflow" not in said:
            out.append("NaNs under bf16/fp32 not said to be a model/data/LR problem")
        if "removes the overflow" in said:
            out.append("NaNs under bf16/fp32 blamed on an fp16 overflow")
    if "compile" in said and "torch.compile" in said and "slow" in answers.get("symptoms", []) \
            and not opts.get("compile") and "reduce-overhead" not in said:
        out.append("a reason says the recipe uses torch.compile but the options do not")
    task = answers.get("training", "train")
    reasons_said = "\n".join(str(r) for r in d.reasons).lower()  # warnings may quote the device's backend note
    if task == "inference" and any(p in reasons_said for p in ("with gradscaler", "scales the loss", "optimizer state (16")):
        out.append("inference told to scale the loss or to budget optimizer state")
    if task == "lora" and any(p in said for p in ("fine-tune with lora", "16 bytes per parameter")):
        out.append("an adapter fine-tune told to use LoRA or budgeted for full AdamW state")
    if answers.get("fp16_weights") and task in ("train", "finetune") and "model.float()" not in said:
        out.append("float16 weights for training without the float32 master-weights step")
    if facts.get("memory_gb"):
        for text in texts:
            if " gb" in text.lower() and "has " in text and f"has {facts['memory_gb']:g} gb" not in text.lower() \
                    and "parameters need" in text:
                out.append(f"memory in a reason differs from the device's {facts['memory_gb']} GB: {text}")
    return out


@pytest.mark.parametrize("sid, answers, expected", SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_expert_scenario(sid, answers, expected):
    d = q.decide(dict(answers))
    assert d.precision in expected, (sid, d.precision, [str(r) for r in d.reasons])
    assert contradictions(answers, d) == [], sid
    assert d.reasons, "every decision gives its reasons"
    assert all(r.answer in set(answers) | {"gpu", "log", "symptoms", "params_millions"} for r in d.reasons)
    assert d.to_dict()["training"] == answers.get("training", "train")


def test_scenarios_through_the_cli(capsys, monkeypatch):
    """The same answers through `ask --answers - --format json` give the same precision."""
    for sid, answers, expected in SCENARIOS[:8]:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(json.dumps(answers).encode())))
        assert main(["ask", "--answers", "-", "--format", "json"]) == 0, sid
        out = json.loads(capsys.readouterr().out)
        assert out["precision"] in expected and out["device_facts"]["name"], sid


# Names as torch.cuda.get_device_name / rocm-smi / the vendor print them, with the memory in the name.
VENDOR_GPUS = [
    ("NVIDIA GeForce RTX 4090", "Ada", 24), ("Tesla V100-SXM2-16GB", "Volta", 16),
    ("NVIDIA A100-SXM4-80GB", "Ampere", 80), ("NVIDIA H100 80GB HBM3", "Hopper", 80),
    ("AMD Instinct MI300X", "CDNA3", 192), ("Radeon RX 7900 XTX", "RDNA3", 24), ("Apple M2 Max", "Apple silicon", None),
    ("Intel(R) Data Center GPU Max 1550", "Xe-HPC", 128), ("Intel Arc A770", "Xe-HPG", None),
    ("Quadro RTX 8000", "Turing", 48), ("NVIDIA L4", "Ada", 24), ("NVIDIA RTX A6000", "Ampere", 48),
    ("GeForce GTX 1080 Ti", "Pascal", 11), ("Tesla T4", "Turing", 16), ("Tesla P100-PCIE-16GB", "Pascal", 16),
    # "GH200 480GB" names the Grace CPU's LPDDR5X; the GPU itself has 96 GB HBM3.
    ("NVIDIA GH200 480GB", "Hopper", 96), ("NVIDIA B200", "Blackwell", 180),
    ("NVIDIA A100-PCIE-40GB", "Ampere", 40), ("Tesla V100-PCIE-32GB", "Volta", 32), ("NVIDIA H100 NVL", "Hopper", 94),
    ("NVIDIA GH200 144G HBM3e", "Hopper", 144), ("AMD Radeon RX 6800 XT", "RDNA2", None),
    ("NVIDIA T1000", "Turing", None), ("NVIDIA RTX 6000 Ada Generation", "Ada", 48),
]


@pytest.mark.parametrize("name, arch, memory", VENDOR_GPUS, ids=[g[0] for g in VENDOR_GPUS])
def test_vendor_gpu_names_resolve(name, arch, memory):
    dev = q.resolve_device(name)
    assert dev.arch == arch and dev.memory_gb == memory
    assert not any("unknown GPU" in w or "not in our" in w for w in dev.warnings)


def test_chips_without_matrix_units_are_not_said_to_have_them():
    for name in ("NVIDIA T1000", "AMD Radeon RX 6800 XT", "Apple M1", "Tesla P100-PCIE-16GB", "GeForce GTX 1080 Ti"):
        assert q.resolve_device(name).tensor_cores is False, name
    for name in ("AMD Instinct MI100", "Radeon RX 7900 XTX", "Intel Arc A770", "Tesla T4"):
        assert q.resolve_device(name).tensor_cores is True, name


def test_random_answer_combinations_never_contradict_or_fail():
    """A seeded sweep over the answer space (800 combinations, ~1 s): every answer set that passes
    validation gets a decision whose recipe options build, and none of the contradiction checks fire."""
    import random

    rng = random.Random(13)
    gpus = ["V100", "T4", "A100", "H100", "P100", "GTX 1080 Ti", "cpu", "AMD Instinct MI300X", "Radeon RX 6800 XT",
            "Apple M1", "Intel Arc A770", "NVIDIA T1000", "RTX 4090", "K80", "NVIDIA GH200 480GB"]
    for _ in range(800):
        a = {"gpu": rng.choice(gpus), "model_family": rng.choice(["transformer", "cnn", "rnn", "mlp", "rl", "other"]),
             "params_millions": rng.choice([None, 0.5, 5, 25, 350, 7000, 70000]),
             "symptoms": rng.sample(["nan_loss", "no_convergence", "slow", "oom"], rng.randint(0, 2)),
             "current_precision": rng.choice(["fp32", "fp16", "bf16", "unknown"]),
             "grad_clipping": rng.random() < .3, "grad_accumulation": rng.choice([1, 1, 4]),
             "custom_exp_log_loss": rng.random() < .2, "batchnorm": rng.random() < .3,
             "multi_gpu": rng.choice(["none", "ddp", "fsdp"]), "bitexact_fp16": rng.random() < .1,
             "bf16_pretrained": rng.random() < .2, "training": rng.choice(["train", "finetune", "lora", "inference"]),
             "fp16_weights": rng.random() < .2}
        if a["gpu"] == "cpu":
            a["cpu_bf16"] = rng.random() < .5
        d = q.decide(dict(a))
        assert contradictions(a, d) == [], a
