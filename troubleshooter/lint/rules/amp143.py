"""AMP143 conflicting-precision-settings."""
from ..analysis import kwarg
from ..frameworks import deepspeed, hf_trainer
from ..frameworks.values import LITERAL, resolve_kw
from .base import Hit, Rule


class ConflictingPrecisionSettings(Rule):
    id = "AMP143"
    name = "conflicting-precision-settings"
    severity = "error"
    summary = ("Two precision settings that contradict each other: `TrainingArguments(fp16=True, bf16=True)`, or "
               "TrainingArguments' fp16/bf16 against the `fp16`/`bf16` `enabled` of the DeepSpeed config it is given.")
    why = ("transformers refuses both at once: \"At most one of fp16 and bf16 can be True, but not both\" "
           "(training_args.py). With `deepspeed=...`, the Trainer fills \"auto\" values from TrainingArguments and "
           "raises on any other disagreement: \"Please correct the following DeepSpeed config values that mismatch "
           "TrainingArguments values: - ds fp16.enabled=True vs hf fp16|fp16_full_eval=False\" "
           "(integrations/deepspeed.py). The run stops before its first step.")
    example_bad = """
args = TrainingArguments(output_dir="out", bf16=True, deepspeed={"train_micro_batch_size_per_gpu": "auto",
                                                                  "fp16": {"enabled": True}})
"""
    example_good = """
args = TrainingArguments(output_dir="out", bf16=True, deepspeed={"train_micro_batch_size_per_gpu": "auto",
                                                                  "fp16": {"enabled": "auto"},
                                                                  "bf16": {"enabled": "auto"}})
"""
    fix = ("Choose the precision in one place: one of `fp16`/`bf16` in TrainingArguments, and `\"enabled\": \"auto\"` "
           "in the DeepSpeed config so the Trainer fills it.")
    known_problems = ("Both settings must be written in the file (or the JSON it names); values from the command line "
                      "are not compared. A config named only by an argument default gives a warning.")
    references = ("https://huggingface.co/docs/transformers/deepspeed#shared-configuration",)

    def check(self, m):
        for c in hf_trainer.args_calls(m):
            fp16, bf16 = resolve_kw(m, c, "fp16"), resolve_kw(m, c, "bf16")
            if fp16.certain and bf16.certain and fp16.options[0] is True and bf16.options[0] is True:
                yield Hit.at(c, "`fp16=True` and `bf16=True` together: TrainingArguments raises \"At most one of fp16 "
                                "and bf16 can be True, but not both\"", "keep one (bf16 where the GPU supports it)")
                continue
            kw = kwarg(c, "deepspeed")
            cfg = deepspeed.config_from(m, kw) if kw is not None else None
            if cfg is None:
                continue
            for name, hf in (("fp16", fp16), ("bf16", bf16)):
                ds = cfg.enabled(name)
                hf_value = hf.options[0] if hf.how == LITERAL and hf.options else (False if kwarg(c, name) is None else None)
                if isinstance(ds, bool) and isinstance(hf_value, bool) and ds != hf_value:
                    h = Hit.at(kw, f"the DeepSpeed config says {name}.enabled={ds} ({cfg.where(name, 'enabled')}) but "
                                   f"TrainingArguments {name}={hf_value}: the Trainer raises \"Please correct the following "
                                   f"DeepSpeed config values that mismatch TrainingArguments values: - ds {name}.enabled={ds} "
                                   f"vs hf {name}|{name}_full_eval={hf_value}\"",
                               f'set `"{name}": {{"enabled": "auto"}}` in the DeepSpeed config')
                    yield h.lowered("warning") if cfg.beside else h
                    break
