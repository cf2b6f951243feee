"""The questionnaire's answer in each framework's own settings (issue 23 item 3): the keys are the
ones the installed frameworks read, and the values follow the decision."""
from __future__ import annotations

import ast
import importlib.util
import json
import re
from functools import lru_cache
from pathlib import Path

import pytest
import yaml

from troubleshooter import questionnaire as q

BASE = {"gpu": "A100", "params_millions": 300, "grad_clipping": True, "grad_accumulation": 4}


@lru_cache(maxsize=None)
def _names_in_source(module: str, cls: str, method: str | None = None) -> frozenset:
    """Field names of a dataclass (and its bases in the same file), or a method's parameters, read from the
    installed package's source: importing lightning or accelerate costs seconds, parsing them does not."""
    top, *rest = module.split(".")
    spec = importlib.util.find_spec(top)  # a top-level lookup imports nothing
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{top} is not installed")
    path = Path(list(spec.submodule_search_locations)[0], *rest[:-1], rest[-1] + ".py")
    tree = ast.parse(path.read_text(encoding="utf-8"))
    classes = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    names, todo = set(), [cls]
    while todo:
        node = classes[todo.pop()]
        todo += [b.id for b in node.bases if isinstance(b, ast.Name) and b.id in classes]
        for item in node.body:
            if method is None and isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                names.add(item.target.id)
            elif method and isinstance(item, ast.FunctionDef) and item.name == method:
                names |= {a.arg for a in item.args.args + item.args.kwonlyargs}
    return frozenset(names)


def _settings(framework: str, **answers) -> dict:
    d = q.decide({**BASE, **answers, "framework": framework})
    assert d.to_dict()["framework_settings"]["framework"] == framework
    return d.framework_settings


def test_accelerate_yaml_is_a_config_accelerate_reads():
    fields = _names_in_source("accelerate.commands.config.config_args", "ClusterConfig")
    assert {"mixed_precision", "distributed_type", "fsdp_config"} <= fields
    for answers, precision, kind in (({}, "bf16", "NO"), ({"gpu": "V100"}, "fp16", "NO"),
                                     ({"gpu": "4x A100", "multi_gpu": "fsdp"}, "bf16", "FSDP")):
        text = _settings("accelerate", **answers)["text"]
        config = yaml.safe_load(text)
        assert set(config) <= fields, set(config) - fields
        assert config["mixed_precision"] == precision and config["distributed_type"] == kind
        assert "clip_grad_norm_" in text and "gradient_accumulation_steps=4" in text


def test_lightning_arguments_are_trainer_parameters():
    params = _names_in_source("lightning.pytorch.trainer.trainer", "Trainer", "__init__")
    assert {"precision", "gradient_clip_val", "accumulate_grad_batches"} <= params
    for answers, precision in (({}, "bf16-mixed"), ({"gpu": "T4"}, "16-mixed"), ({"gpu": "cpu", "cpu_bf16": False}, "32-true")):
        text = _settings("lightning", **answers)["text"]
        call = re.search(r"L\.Trainer\((.*?)\)\n", text, re.S).group(1)
        names = set(re.findall(r"^\s*(\w+)=", call, re.M))
        assert names <= params, names - params
        assert f'precision="{precision}"' in call and "gradient_clip_val=1.0" in call
        assert "accumulate_grad_batches=4" in call


def test_training_arguments_fields_exist():
    fields = _names_in_source("transformers.training_args", "TrainingArguments")
    assert {"bf16", "fp16", "max_grad_norm"} <= fields
    for answers, flag in (({}, "bf16=True"), ({"gpu": "V100"}, "fp16=True")):
        text = _settings("hf_trainer", **answers)["text"]
        call = re.search(r"TrainingArguments\((.*?)\)\n", text, re.S).group(1)
        names = set(re.findall(r"^\s*(\w+)=", call, re.M))
        assert names <= fields, names - fields
        assert flag in call and "max_grad_norm=1.0" in call and "gradient_accumulation_steps=4" in call
    lora = _settings("hf_trainer", gpu="T4", training="lora")["text"]
    assert "dtype=torch.float16" in lora and "get_peft_model" in lora and "fp16=True" in lora


# DeepSpeed is not installed here: its config keys, from deepspeed/runtime/constants.py
# (microsoft/DeepSpeed 38327e07): TRAIN_MICRO_BATCH_SIZE_PER_GPU, GRADIENT_ACCUMULATION_STEPS,
# GRADIENT_CLIPPING, BFLOAT16 ("bf16"), FP16 and its loss-scaling keys, DATA_TYPES/GRAD_ACCUM_DTYPE,
# ZERO_OPTIMIZATION.
DEEPSPEED_KEYS = {"train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping", "bf16",
                  "fp16", "data_types", "zero_optimization"}
DEEPSPEED_FP16_KEYS = {"enabled", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
                       "min_loss_scale"}


def test_deepspeed_json_follows_the_decision():
    bf16 = json.loads(_settings("deepspeed")["text"])
    assert set(bf16) <= DEEPSPEED_KEYS
    assert bf16["bf16"] == {"enabled": True} and bf16["fp16"] == {"enabled": False}
    assert bf16["data_types"] == {"grad_accum_dtype": "fp32"} and bf16["gradient_clipping"] == 1.0
    fp16 = json.loads(_settings("deepspeed", gpu="V100")["text"])
    assert fp16["fp16"]["enabled"] is True and fp16["fp16"]["loss_scale"] == 0 and set(fp16["fp16"]) <= DEEPSPEED_FP16_KEYS
    big = json.loads(_settings("deepspeed", gpu="8x V100", params_millions=7000)["text"])
    assert big["zero_optimization"]["stage"] == 3  # the states must be sharded


def test_inference_settings_have_no_scaler_and_the_raw_loop_has_none():
    text = _settings("hf_trainer", training="inference")["text"]
    assert "dtype=torch.bfloat16" in text and "inference_mode" in text and "TrainingArguments" not in text
    assert q.decide({**BASE}).framework_settings is None  # framework: none -> the raw loop only


def test_accelerate_does_not_see_a_fused_optimizers_skipped_step():
    """The framework fact behind the fp16 settings' caveat (huggingface/accelerate#4242, open on
    2026-11-28; accelerate 1.15.0, torch 2.13): GradScaler calls a fused optimizer's step() even
    on overflow (the kernel skips the update), so Accelerate's call marker reports the step as
    taken and its prepared scheduler advances. When this test fails, accelerate fixed it: update
    the caveat (framework_settings.py), AMP145 and this test."""
    import torch
    from accelerate import Accelerator
    from accelerate.optimizer import AcceleratedOptimizer

    Accelerator(cpu=True)
    seen = {}
    for fused in (False, True):
        model = torch.nn.Linear(4, 4)
        scaler = torch.amp.GradScaler("cpu")
        opt = AcceleratedOptimizer(torch.optim.AdamW(model.parameters(), fused=fused), device_placement=False,
                                   scaler=scaler)
        before = model.weight.detach().clone()
        scaler.scale(model(torch.ones(2, 4)).sum()).backward()
        model.weight.grad[0, 0] = float("inf")
        opt.step()
        assert torch.equal(before, model.weight) and scaler.get_scale() < 65536.0  # skipped either way
        seen[fused] = opt.step_was_skipped
    assert seen == {False: True, True: False}


def test_fp16_settings_say_a_fused_optimizers_skips_go_unseen():
    for framework in ("accelerate", "hf_trainer"):
        text = _settings(framework, gpu="T4")["text"]
        assert "huggingface/accelerate#4242" in text, framework
    assert "skips the scheduler on skipped fp16 steps" not in _settings("hf_trainer", gpu="T4")["text"]
    assert "accelerate#4242" not in _settings("hf_trainer")["text"]  # bf16: no scaler, nothing skipped
