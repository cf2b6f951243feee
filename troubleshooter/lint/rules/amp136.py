"""AMP136 deepspeed-precision-config."""
from ..frameworks import deepspeed
from .base import Hit, Rule


class DeepSpeedPrecisionConfig(Rule):
    id = "AMP136"
    name = "deepspeed-precision-config"
    severity = "error"
    summary = ("A DeepSpeed config (a dict in the script, or the JSON it names or that sits beside it) with fp16 and "
               "bf16 both enabled, or fp16 with a static `loss_scale` instead of dynamic loss scaling.")
    why = ("DeepSpeed refuses the first at `deepspeed.initialize`: \"bfloat16 and fp16 modes cannot be simultaneously "
           "enabled\" (deepspeed/runtime/config.py). `\"loss_scale\": 0` (the default) is dynamic scaling: skip a step "
           "and halve on overflow, grow after `loss_scale_window` good steps. Any other number is a fixed scale that "
           "never adapts: too high and every step overflows, too low and small gradients flush to zero.")
    example_bad = """
ds_config = {
    "train_micro_batch_size_per_gpu": 8,
    "fp16": {"enabled": True, "loss_scale": 128},
    "bf16": {"enabled": True},
}
"""
    example_good = """
ds_config = {
    "train_micro_batch_size_per_gpu": 8,
    "fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16},
}
"""
    fix = ("Enable one of `fp16` / `bf16` (bf16 where the GPU has it: no loss scaling needed); keep fp16's "
           "`\"loss_scale\": 0` for dynamic scaling.")
    known_problems = ("Configs built at run time (merged from several files, edited by code) are not seen. `\"auto\"` "
                      "values (filled by the Hugging Face integration from TrainingArguments) are not judged. The "
                      "finding is placed on the script line that names the config, with the config's own line in "
                      "the message.")
    references = ("https://www.deepspeed.ai/docs/config-json/#fp16-training-options",
                  "https://github.com/microsoft/DeepSpeed/blob/master/deepspeed/runtime/config.py")

    def check(self, m):
        for cfg in deepspeed.configs(m):
            fp16, bf16 = cfg.enabled("fp16"), cfg.enabled("bf16")
            node = cfg.node
            if fp16 is True and bf16 is True:
                h = Hit.at(node, f"the DeepSpeed config enables fp16 ({cfg.where('fp16', 'enabled')}) and bf16 "
                                   f"({cfg.where('bf16', 'enabled')}): deepspeed.initialize fails with \"bfloat16 and "
                                   "fp16 modes cannot be simultaneously enabled\""
                           + (f" (if {cfg.file.name} is the config this script runs with)" if cfg.beside else ""),
                           "keep one: bf16 where the GPU supports it, else fp16 with dynamic loss scaling",
                           framework="deepspeed")
                yield h.lowered("warning") if cfg.beside else h  # a JSON beside it may not be the one used
            if fp16 is True:
                scale = cfg.block("fp16").get("loss_scale", 0)
                if isinstance(scale, (int, float)) and not isinstance(scale, bool) and scale > 0:
                    h = Hit.at(node, f"the DeepSpeed config's fp16 uses a static loss scale ({cfg.where('fp16', 'loss_scale')}: "
                                     f"\"loss_scale\": {scale:g}): it never adapts, so overflowing steps repeat and small "
                                     "gradients flush to zero", "set `\"loss_scale\": 0` (dynamic loss scaling)",
                               framework="deepspeed")
                    yield h.lowered("warning")
