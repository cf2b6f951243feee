"""The questionnaire's answer in a framework's own settings, next to the raw training loop.

A user who trains with accelerate, Lightning, the HF Trainer or DeepSpeed does not write
`scaler.scale(loss)`: the same decision (precision, clipping, accumulation, sharding, compile, TF32,
LoRA, inference) becomes an accelerate config YAML, `Trainer(...)` arguments, `TrainingArguments`
fields or a DeepSpeed JSON block. Every key is one the installed framework reads (accelerate 1.15
ClusterConfig, lightning 2.6 Trainer, transformers 5.24 TrainingArguments; DeepSpeed's
runtime/constants.py); tests/test_framework_settings.py checks them against the installed code.
Pure Python: no torch, no framework import.
"""
from __future__ import annotations

import json

FRAMEWORKS = ("none", "accelerate", "lightning", "hf_trainer", "deepspeed")
_LIGHTNING_PRECISION = {"bf16": "bf16-mixed", "fp16": "16-mixed", "fp32": "32-true"}
_LIGHTNING_INFERENCE = {"bf16": "bf16-true", "fp16": "16-true", "fp32": "32-true"}


def settings(framework: str, opts: dict, *, task: str, num_gpus: int, tf32: bool, shard: bool) -> dict | None:
    """{"framework", "format" (yaml | python | json), "file", "text"} for `framework`, None for the raw loop.

    opts: the recipe options the decision chose (precision, clip, accum, distributed, compile,
    activation_checkpointing, lora); shard: the weights need sharding (FSDP / ZeRO-3)."""
    make = {"accelerate": _accelerate, "lightning": _lightning, "hf_trainer": _hf_trainer,
            "deepspeed": _deepspeed}.get(framework)
    if make is None:
        return None
    fmt, file, text = make(opts, task=task, num_gpus=max(1, num_gpus), tf32=tf32, shard=shard)
    return {"framework": framework, "format": fmt, "file": file, "text": text}


def _accelerate(opts: dict, *, task: str, num_gpus: int, tf32: bool, shard: bool):
    precision = opts["precision"]
    fsdp = opts.get("distributed") == "fsdp" or (shard and num_gpus > 1)
    distributed = "FSDP" if fsdp else "MULTI_GPU" if num_gpus > 1 else "NO"
    lines = [
        "# accelerate_config.yaml: accelerate launch --config_file accelerate_config.yaml train.py",
        "compute_environment: LOCAL_MACHINE",
        f"distributed_type: '{distributed}'",  # quoted: YAML reads a bare NO / no as false
        f"mixed_precision: '{'no' if precision == 'fp32' else precision}'",
        f"num_processes: {num_gpus}",
        "num_machines: 1",
        "machine_rank: 0",
        "main_training_function: main",
        "downcast_bf16: 'no'",
        "use_cpu: false",
    ]
    if fsdp:
        lines += ["fsdp_config:", "  fsdp_version: 2", "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP",
                  "  fsdp_reshard_after_forward: true", "  fsdp_state_dict_type: SHARDED_STATE_DICT",
                  f"  fsdp_activation_checkpointing: {str(bool(opts.get('activation_checkpointing'))).lower()}"]
    if opts.get("compile"):
        lines += ["dynamo_config:", "  dynamo_backend: INDUCTOR"]
    code = []
    if task != "inference":
        accum = opts.get("accum") or 1
        code.append(f"# in the script: accelerator = Accelerator(gradient_accumulation_steps={accum}); with "
                    "accelerator.accumulate(model): ... accelerator.backward(loss)")
        if opts.get("clip"):
            code.append(f"#   if accelerator.sync_gradients: accelerator.clip_grad_norm_(model.parameters(), "
                        f"{opts['clip']})  (it unscales first)")
        if precision == "fp16":
            code.append("#   step the LR scheduler only if not accelerator.optimizer_step_was_skipped; checkpoint "
                        "with accelerator.save_state() (it keeps the GradScaler state)")
            code.append("#   with a fused optimizer (AdamW(fused=True)) that flag stays False on skipped steps and "
                        "a prepared scheduler advances anyway (accelerate <= 1.15, huggingface/accelerate#4242): "
                        "use the optimizer unfused, or compare accelerator.scaler.get_scale() before and after")
    if tf32:
        code.append("# TF32 for the float32 parts: torch.backends.cuda.matmul.allow_tf32 = True")
    return "yaml", "accelerate_config.yaml", "\n".join(lines + code) + "\n"


def _lightning(opts: dict, *, task: str, num_gpus: int, tf32: bool, shard: bool):
    precision = opts["precision"]
    if task == "inference":
        args = [f'precision="{_LIGHTNING_INFERENCE[precision]}"', 'accelerator="gpu"', f"devices={num_gpus}"]
        text = ("# inference: trainer.predict(model, dataloaders=...) runs eval + inference_mode; the weights are "
                "cast to the half dtype\ntrainer = L.Trainer(" + ", ".join(args) + ")\n")
        return "python", "trainer.py", text
    strategy = "fsdp" if opts.get("distributed") == "fsdp" or (shard and num_gpus > 1) else \
        "ddp" if num_gpus > 1 or opts.get("distributed") == "ddp" else "auto"
    args = ['accelerator="gpu"', f"devices={num_gpus}", f'precision="{_LIGHTNING_PRECISION[precision]}"',
            f'strategy="{strategy}"']
    if opts.get("clip"):
        args += [f"gradient_clip_val={opts['clip']}", 'gradient_clip_algorithm="norm"']
    if (opts.get("accum") or 1) > 1:
        args.append(f"accumulate_grad_batches={opts['accum']}")
    lines = ["import lightning as L", "import torch", ""]
    if tf32:
        lines.append('torch.set_float32_matmul_precision("high")  # TF32 for the float32 parts')
    lines.append("trainer = L.Trainer(\n    " + ",\n    ".join(args) + ",\n)")
    notes = ["# Lightning unscales before clipping (gradient_clip_val) and saves the GradScaler in its checkpoints;",
             "# in manual optimization use self.manual_backward(loss) and self.clip_gradients(...)."]
    if opts.get("lora"):
        notes.append("# adapters: freeze the base (requires_grad_(False)) in the half dtype, keep the adapters "
                     "float32 (PEFT: get_peft_model keeps them float32 by default, autocast_adapter_dtype=True)")
    return "python", "trainer.py", "\n".join(lines + notes) + "\n"


def _hf_trainer(opts: dict, *, task: str, num_gpus: int, tf32: bool, shard: bool):
    precision = opts["precision"]
    dtype = {"bf16": "torch.bfloat16", "fp16": "torch.float16", "fp32": "torch.float32"}[precision]
    if task == "inference":
        text = (f"# inference: load the weights in the half dtype, no Trainer, no GradScaler\n"
                f"model = AutoModelForCausalLM.from_pretrained(name, dtype={dtype}).eval()\n"
                "with torch.inference_mode():\n    outputs = model.generate(**inputs)\n")
        return "python", "infer.py", text
    fields = ['output_dir="out"']
    if precision == "bf16":
        fields.append("bf16=True")
    elif precision == "fp16":
        fields.append("fp16=True")
    if tf32:
        fields.append("tf32=True")
    fields.append(f"max_grad_norm={opts.get('clip') or 0.0}")
    fields.append(f"gradient_accumulation_steps={opts.get('accum') or 1}")
    if opts.get("activation_checkpointing"):
        fields.append("gradient_checkpointing=True")
    if opts.get("distributed") == "fsdp" or (shard and num_gpus > 1):
        fields.append('fsdp="full_shard auto_wrap"')
    if opts.get("compile"):
        fields.append("torch_compile=True")
    lines = ["args = TrainingArguments(\n    " + ",\n    ".join(fields) + ",\n)"]
    if opts.get("lora"):
        base = "torch.bfloat16" if precision == "bf16" else "torch.float16" if precision == "fp16" else "torch.float32"
        lines.insert(0, f"model = AutoModelForCausalLM.from_pretrained(name, dtype={base})  # the frozen base\n"
                        "model = get_peft_model(model, LoraConfig(r=8, target_modules=\"all-linear\"))  "
                        "# adapters stay float32")
    else:
        lines.insert(0, "model = AutoModelForCausalLM.from_pretrained(name)  # float32 master weights: no "
                        "dtype=torch.float16 for full training")
    if precision == "fp16":
        lines += ["# fp16: the default optimizer is the fused AdamW (torch >= 2.8), whose skipped steps Accelerate does "
                  "not see (huggingface/accelerate#4242):",
                  "# the LR schedule advances on them (a few while the scale calibrates); optim=\"adamw_torch\" keeps "
                  "it exact, at some speed"]
    lines.append(f"# launch with torchrun --nproc_per_node {num_gpus} train.py" if num_gpus > 1 else
                 "# the Trainer unscales before clipping and saves the scaler in its checkpoints")
    return "python", "train.py", "\n".join(lines) + "\n"


def _deepspeed(opts: dict, *, task: str, num_gpus: int, tf32: bool, shard: bool):
    precision = opts["precision"]
    if task == "inference":
        text = json.dumps({"dtype": {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}[precision],
                           "tensor_parallel": {"tp_size": num_gpus}}, indent=2)
        return "json", "ds_inference_config.json", text + "\n"
    accum = opts.get("accum") or 1
    config: dict = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": accum}
    if opts.get("clip"):
        config["gradient_clipping"] = opts["clip"]
    config["bf16"] = {"enabled": precision == "bf16"}
    if precision == "fp16":
        # Dynamic loss scaling (loss_scale 0) starting at 2^16, as torch's GradScaler.
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                          "hysteresis": 2, "min_loss_scale": 1}
    else:
        config["fp16"] = {"enabled": False}
    if precision == "bf16" and accum > 1:
        config["data_types"] = {"grad_accum_dtype": "fp32"}  # bf16 sums lose small micro-batch gradients
    stage = 3 if shard or opts.get("distributed") == "fsdp" else 2 if num_gpus > 1 else 1
    config["zero_optimization"] = {"stage": stage}
    return "json", "ds_config.json", json.dumps(config, indent=2) + "\n"
