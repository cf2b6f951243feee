"""Hugging Face Trainer: `TrainingArguments(fp16=True)` / `bf16=True` and `Trainer` subclasses.

Checked in transformers 5.24.0 (transformers/training_args.py, trainer.py):

- `TrainingArguments`: `fp16`/`bf16` set `mixed_precision` for the Trainer's `Accelerator`
  (accelerate then makes the GradScaler, see accelerate.py); both True raises "At most one of fp16
  and bf16 can be True, but not both". `fp16_backend`, `half_precision_backend` and
  `fp16_opt_level` (the apex options) are not fields of 5.24's TrainingArguments: passing them is a
  TypeError.
- `Trainer.training_step` runs the loss through `self.accelerator.backward(loss)`; the Trainer clips
  (`max_grad_norm`) with the accelerator after gradients are synced, and steps the LR scheduler only
  when `not self.accelerator.optimizer_step_was_skipped` (always False with a fused optimizer, the
  default `optim` on torch >= 2.8: see accelerate.py, AMP145). Its checkpoints include the GradScaler
  (`_save_scaler`, scaler.pt).
- `Trainer` in 5.24 has none of the AMP attributes older subclasses read: `self.scaler`,
  `self.use_apex`, `self.do_grad_scaling`, `self.use_cuda_amp`, `self.use_cpu_amp`,
  `self.amp_dtype` (AttributeError); the loss scaling lives in `self.accelerator`.
- With `HfArgumentParser` the precision comes from the command line or the JSON/YAML arguments file
  (read here when it sits beside the script).
"""
from __future__ import annotations

import ast

from ..analysis import func_tail, kwarg
from . import BF16, FP16, FP32, Setup, of, derives
from .configs import configs_of
from .values import CONFIG, LITERAL, NOTHING, Value, resolve_kw

NAME = "hf_trainer"
PACKAGES = ("transformers", "trl")
ARGS_CLASSES = {"TrainingArguments", "Seq2SeqTrainingArguments", "SFTConfig", "DPOConfig", "ORPOConfig", "KTOConfig",
                "RewardConfig", "GRPOConfig", "CPOConfig"}
TRAINER_CLASSES = {"Trainer", "Seq2SeqTrainer", "SFTTrainer", "DPOTrainer", "ORPOTrainer", "KTOTrainer",
                   "RewardTrainer", "GRPOTrainer", "CPOTrainer"}
REMOVED_ARGS = {"fp16_backend", "half_precision_backend", "fp16_opt_level"}
REMOVED_ATTRS = {"scaler", "use_apex", "do_grad_scaling", "use_cuda_amp", "use_cpu_amp", "amp_dtype"}


def _from_hf(m, call_or_base: ast.AST) -> bool:
    q = m.names.qual(call_or_base.func if isinstance(call_or_base, ast.Call) else call_or_base) or ""
    return q.startswith(PACKAGES) or (q.split(".")[0] in {"transformers", "trl"})


def args_calls(m) -> list[ast.Call]:
    return [c for c in m.calls_named(*ARGS_CLASSES) if _from_hf(m, c)]


def _flag(m, call: ast.Call, name: str) -> Value:
    kw = kwarg(call, name)
    if kw is None:
        return Value((False,), LITERAL, f"no {name}= (line {call.lineno})", call.lineno)
    return resolve_kw(m, call, name)


def precision_of(m, call: ast.Call | None) -> Value:
    if call is not None and not any(k.arg is None for k in call.keywords):
        fp16, bf16 = _flag(m, call, "fp16"), _flag(m, call, "bf16")
        if fp16.known and bf16.known:
            opts = []
            if any(fp16.options):
                opts.append(FP16)
            if any(bf16.options):
                opts.append(BF16)
            if not all(fp16.options) and not all(bf16.options) or not opts:
                opts.append(FP32)
            how = "literal" if fp16.how == bf16.how == "literal" else (fp16.how if fp16.how != "literal" else bf16.how)
            shown = fp16 if any(fp16.options) else bf16
            return Value(tuple(dict.fromkeys(opts)), how, shown.evidence, shown.line)
    for cfg in configs_of(m).of_kind("hf_args"):
        for key, p in (("fp16", FP16), ("bf16", BF16)):
            if cfg.get(key) is True:
                return Value((p,), CONFIG, f"{cfg.where(key)}: {key}: true")
    if call is None and configs_of(m).of_kind("hf_args"):
        cfg = configs_of(m).of_kind("hf_args")[0]
        return Value((FP32,), CONFIG, f"{cfg.name} sets neither fp16 nor bf16")
    return NOTHING


def trainer_subclasses(m) -> set[str]:
    """Classes deriving from transformers' / trl's Trainer classes, or (their base imported from
    another file of the project) overriding `training_step(self, model, inputs, ...)` /
    `compute_loss(self, model, inputs, ...)`: the Trainer's own signatures."""
    def compute():
        found = derives(m, TRAINER_CLASSES, PACKAGES)
        for name, cls in m.classes.items():
            if name in found or not cls.bases:
                continue
            for item in cls.body:
                if isinstance(item, ast.FunctionDef) and item.name in {"training_step", "compute_loss"}:
                    params = [a.arg for a in item.args.args[1:3]]
                    if params == ["model", "inputs"]:
                        found.add(name)
        return found
    return m.memo.get(("hf_trainer_subclasses",), compute)


def setups(m) -> list[Setup]:
    """This framework's setups in the file (computed once, by `find`)."""
    return of(m, NAME)


def find(m) -> list[Setup]:
    calls = args_calls(m)
    subs = trainer_subclasses(m)
    if not calls and not subs:
        return []
    return [Setup(NAME, c, precision_of(m, c), frozenset({"accelerator"}),
                  f"{func_tail(c)}(...) (line {c.lineno})" if c is not None else "the TrainingArguments",
                  {"unknown_because": "TrainingArguments come from the command line"}) for c in calls or [None]]


def owner(m, recv: str | None, scope) -> Setup | None:
    if recv != "accelerator" or scope is None or scope.cls not in trainer_subclasses(m):
        return None
    return setups(m)[0]
