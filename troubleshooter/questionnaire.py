"""The questionnaire: answers about hardware, model and symptoms in, a precision decision out.

`questions()` comes from `data/questions.yaml`; `decide(answers)` is a pure function (no torch)
mapping validated answers to a precision (bf16 / fp16 with GradScaler / stay fp32), recipe
options for `recipes.render_recipe`, and the reasons, each tied to the answer it came from.
GPU facts come from `hardware.find_gpu`; only `gpu: detect` looks at this machine (lazily,
through the capability check).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from . import hardware
from .errors import UserError

SYMPTOMS = ("nan_loss", "no_convergence", "slow", "oom")
_NOT_A_GPU_NAME = ("detect", "cpu", "none", "no gpu")
# Weights + gradients + AdamW's two moments, all float32: mixed precision does not shrink these.
BYTES_PER_PARAM_ADAMW = 16


@lru_cache(maxsize=1)
def questions() -> list[dict]:
    """The questions, in the order `ask` asks them (see data/questions.yaml)."""
    text = resources.files("troubleshooter.data").joinpath("questions.yaml").read_text(encoding="utf-8")
    return yaml.safe_load(text)["questions"]


def _question_map() -> dict[str, dict]:
    return {q["key"]: q for q in questions()}


# --- validation ---------------------------------------------------------------------------------

def check_answer(question: dict, value: Any) -> tuple[Any, str | None]:
    """(normalised value, problem or None) for one answer; strings from a terminal are accepted."""
    key, kind = question["key"], question["type"]
    if value is None:
        return None, None
    if kind == "bool":
        if isinstance(value, str) and value.strip().lower() in ("y", "yes", "true", "1", "n", "no", "false", "0"):
            return value.strip().lower() in ("y", "yes", "true", "1"), None
        if isinstance(value, bool):
            return value, None
        return value, f"{key}: expected yes/no (true/false), got {value!r}"
    if kind in ("int", "number"):
        if isinstance(value, str):
            text = value.strip().lower()
            factor = {"b": 1000.0, "m": 1.0}.get(text[-1:], None) if kind == "number" else None
            try:
                value = float(text[:-1] if factor else text) * (factor or 1.0)  # "7B" -> 7000 (millions)
            except ValueError:
                return value, f"{key}: expected a number, got {value!r}"
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            return value, f"{key}: expected a number, got {value!r}"
        if kind == "int":
            if value != int(value):
                return value, f"{key}: expected a whole number, got {value!r}"
            value = int(value)
        if value < question.get("min", 0) or (kind == "number" and value <= 0):
            return value, f"{key}: must be {'>= ' + str(question.get('min', 0)) if kind == 'int' else '> 0'}, got {value}"
        return value, None
    if kind == "choice":
        text = str(value).strip().lower()
        if text not in question["choices"]:
            return value, f"{key}: {value!r} is not one of {', '.join(question['choices'])}"
        return text, None
    if kind == "list":
        items = [s.strip() for s in value.split(",")] if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)):
            return value, f"{key}: expected a list of {', '.join(question['choices'])}"
        items = [str(i).strip().lower() for i in items if str(i).strip()]
        bad = [i for i in items if i not in question["choices"]]
        if bad:
            return value, f"{key}: unknown {', '.join(map(repr, bad))}: choose from {', '.join(question['choices'])}"
        return list(dict.fromkeys(items)), None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)  # `gpu: 4090` in YAML is a number
    if not isinstance(value, str):
        return value, f"{key}: expected text, got {value!r}"
    return value.strip(), None


def validate_answers(answers: Any) -> dict:
    """Every answer checked; UserError lists every problem at once. Missing answers -> None."""
    if not isinstance(answers, dict):
        raise UserError("answers must be a mapping of question keys to answers (YAML or JSON object)")
    qmap = _question_map()
    problems = [f"unknown answer key {k!r}: known keys are {', '.join(qmap)}" for k in answers if k not in qmap]
    result = {}
    for key, q in qmap.items():
        value, problem = check_answer(q, answers.get(key))
        result[key] = value
        if problem:
            problems.append(problem)
    gpu = result.get("gpu")
    if not gpu and not any(p.startswith("gpu:") for p in problems):
        problems.append("gpu: required (a GPU model such as V100, T4, A100, RTX 4090, H100; 'cpu'; or 'detect')")
    elif isinstance(gpu, str) and gpu.lower() not in _NOT_A_GPU_NAME and find_gpu(gpu) is None \
            and _arch_device(gpu) is None:
        known = ", ".join(g.name for g in hardware.gpu_models())
        problems.append(f"gpu: unknown GPU {gpu!r}: name one of {known}, give its compute capability "
                        "(e.g. sm_86), or say 'cpu' or 'detect'")
    if problems:
        raise UserError("invalid answers:", problems)
    for key, q in qmap.items():
        if result[key] is None and q["type"] in ("bool", "list", "choice") and q.get("default") is not None:
            result[key] = q["default"]
    return result


def load_answers(path: str) -> dict:
    """Read an answers file (.yaml/.yml or .json) into a dict; clear errors for unreadable input."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read answers file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise UserError(f"{path} is not valid {'JSON' if path.endswith('.json') else 'YAML'}: "
                        f"{str(exc).splitlines()[0]}") from None
    if data is None:
        raise UserError(f"{path} is empty: it needs at least `gpu:`")
    return data


# --- the decision -------------------------------------------------------------------------------

class Reason(str):
    """A reason (it is its text, so it prints and joins as one) tied to the answer key it comes from."""

    answer: str

    def __new__(cls, answer: str, text: str) -> "Reason":
        obj = super().__new__(cls, text)
        obj.answer = answer
        return obj

    @property
    def text(self) -> str:
        return str(self)

    def __repr__(self) -> str:
        return f"Reason({self.answer!r}, {str(self)!r})"


@dataclass
class Decision:
    precision: str  # bf16 | fp16 | fp32
    recipe_options: dict
    reasons: list[Reason] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    device: str = ""
    symptoms_from_log: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """The `ask --format json` object."""
        return {
            "precision": self.precision,
            "recipe_options": dict(self.recipe_options),
            "reasons": [r.text for r in self.reasons],
            "warnings": list(self.warnings),
            "device": self.device,
            "reasons_by_answer": [{"answer": r.answer, "reason": r.text} for r in self.reasons],
            "symptoms_from_log": list(self.symptoms_from_log),
        }

    def to_text(self) -> str:
        label = {"bf16": "bf16 (autocast, no loss scaling)", "fp16": "fp16 with GradScaler",
                 "fp32": "stay in fp32"}[self.precision]
        lines = [f"Precision: {label}" + (f"   [{self.device}]" if self.device else ""), "", "Why:"]
        lines += [f"  - {r.text}" for r in self.reasons]
        if self.warnings:
            lines += ["", "Watch out:"] + [f"  - {w}" for w in self.warnings]
        from .recipes import recipe_command

        lines += ["", "Recipe: " + recipe_command(self.recipe_options)]
        return "\n".join(lines)


@dataclass(frozen=True)
class _Device:
    """What the decision needs to know about the device."""
    name: str
    kind: str  # cuda | cpu
    bf16: bool
    fp16_fast: bool
    tensor_cores: bool = False
    memory_gb: float | None = None
    arch: str = ""
    note: str = ""


_CC = re.compile(r"^(?:sm_?|cc\s*|compute capability\s*)?(\d{1,2})\.?(\d)$", re.IGNORECASE)


def find_gpu(name: str) -> hardware.GpuModel | None:
    """hardware.find_gpu, plus a unique known GPU whose name contains the text ('A6000')."""
    found = hardware.find_gpu(name)
    if found is None and len(name.strip()) >= 3:
        text = name.strip().lower()
        hits = [g for g in hardware.gpu_models() if text in g.name.lower()]
        found = hits[0] if len(hits) == 1 else None
    return found


def _arch_device(name: str) -> _Device | None:
    """A compute capability ('sm_86', '8.6', 'cc 7.5') for GPUs not in the list."""
    m = _CC.match(name.strip())
    if not m:
        return None
    arch = hardware.architecture_for((int(m.group(1)), int(m.group(2))))
    return _Device(f"sm_{m.group(1)}{m.group(2)} GPU", "cuda", arch.bf16, arch.fp16_tensor_cores,
                   arch.fp16_tensor_cores, None, arch.name)


def _gpu_device(gpu: hardware.GpuModel) -> _Device:
    arch = gpu.architecture
    peak = gpu.peak_tflops
    # Without tensor cores fp16 only pays where the chip runs it at twice the fp32 rate (P100).
    fp16_fast = arch.fp16_tensor_cores or (peak.get("fp16", 0) >= 2 * peak.get("fp32", float("inf")))
    return _Device(gpu.name, "cuda", arch.bf16, fp16_fast, arch.fp16_tensor_cores, gpu.memory_gb, arch.name)


def _cpu_device(cpu_bf16: bool | None) -> _Device:
    note = ""
    if cpu_bf16 is None:
        from .engine import cpu_features  # pure: reads /proc/cpuinfo, no torch

        flags = cpu_features.cpu_features().get("flags", {})
        cpu_bf16 = any(flags.get(f) for f in cpu_features.BF16_FLAGS)
        note = "read from this machine"
    return _Device("CPU", "cpu", bool(cpu_bf16), False, note=note)


def _detected_device() -> _Device:
    from .engine.capability import detect  # lazy: needs torch

    report = detect()
    if report.kind == "cuda":
        gpu = hardware.find_gpu(report.name)
        if gpu is not None:
            dev = _gpu_device(gpu)
            return _Device(report.name, "cuda", report.bf16_native, report.fp16_fast, dev.tensor_cores,
                           dev.memory_gb, dev.arch, note="detected")
        return _Device(report.name, "cuda", report.bf16_native, report.fp16_fast,
                       report.fp16_fast, None, report.facts.get("architecture", ""), note="detected")
    return _Device(report.name or "CPU", "cpu", report.bf16_native, False, note="detected")


def resolve_device(gpu: str, cpu_bf16: bool | None = None) -> _Device:
    name = gpu.strip()
    if name.lower() == "detect":
        return _detected_device()
    if name.lower() in _NOT_A_GPU_NAME:
        return _cpu_device(cpu_bf16)
    found = find_gpu(name)
    if found is not None:
        return _gpu_device(found)
    by_arch = _arch_device(name)
    if by_arch is None:
        known = ", ".join(g.name for g in hardware.gpu_models())
        raise UserError(f"gpu: unknown GPU {name!r}: name one of {known}, or 'cpu', or 'detect'")
    return by_arch


def _choose_precision(dev: _Device, a: dict, why, warn) -> str:
    nan = "nan_loss" in a["symptoms"]
    if dev.kind == "cpu":
        if dev.bf16:
            why("gpu", "the CPU has AMX/AVX512-BF16: bf16 autocast runs natively and needs no loss scaling")
            return "bf16"
        why("gpu", "the CPU has no AMX or AVX512-BF16: bf16/fp16 would be emulated, slower than fp32, so stay fp32")
        return "fp32"
    if dev.bf16:
        if a["bitexact_fp16"]:
            why("bitexact_fp16", "you must reproduce an fp16 result bit for bit: stay in fp16 with GradScaler "
                                 "(bf16 rounds differently, so its results cannot match)")
            if nan:
                warn(f"the NaNs you see are what bf16 would remove on the {dev.name}; once bit-exactness is no "
                     "longer needed, switch to bf16")
            return "fp16"
        if nan:
            arch = dev.arch or "Ampere-or-newer"
            why("symptoms", f"NaNs under fp16 and {'an' if arch[0] in 'AEIOU' else 'a'} {arch} GPU: bf16 removes "
                            "the overflow (float32's exponent range, max ~3e38 instead of 65504)")
        else:
            why("gpu", f"the {dev.name} ({dev.arch}) has bf16 tensor cores: bf16 is as fast as fp16 and has "
                       "float32's range, so no GradScaler and no overflow")
        if a["bf16_pretrained"]:
            why("bf16_pretrained", "the model was pretrained in bf16: fine-tuning in bf16 keeps its value ranges")
        return "bf16"
    if not dev.fp16_fast:
        why("gpu", f"the {dev.name} has neither tensor cores nor fast fp16 (nor bf16): mixed precision would "
                   "not be faster, so stay fp32")
        return "fp32"
    if nan and a["bf16_pretrained"]:
        why("bf16_pretrained", f"weights pretrained in bf16 overflow fp16 (values beyond 65504) and you already "
                               f"see NaNs; the {dev.name} has no bf16, so stay fp32 (or train on an Ampere+ GPU in bf16)")
        return "fp32"
    why("gpu", f"the {dev.name} ({dev.arch or 'no bf16'}) has no bf16 tensor cores, so fp16 with GradScaler"
        if dev.tensor_cores else
        f"the {dev.name} runs fp16 at twice its fp32 rate but has no bf16, so fp16 with GradScaler")
    if a["bf16_pretrained"]:
        warn("weights pretrained in bf16 often overflow fp16 (activations beyond 65504): watch for NaNs "
             "(the recipe's NaN guard counts them); `python -m troubleshooter check` finds the layer")
    if nan:
        why("symptoms", "NaNs under fp16 on a GPU without bf16: keep GradScaler and add the NaN guard; run "
                        "`python -m troubleshooter check` to find the first layer that overflows")
    return "fp16"


def decide(answers: dict, *, device: _Device | None = None) -> Decision:
    """Map answers to precision, recipe options, reasons and warnings. `device` injects the device."""
    a = validate_answers(answers)
    symptoms_from_log: list[str] = []
    if a.get("log"):
        from .explain import explain_log

        symptoms_from_log = [s for s in explain_log(a["log"]).symptoms if s not in a["symptoms"]]
        a["symptoms"] = a["symptoms"] + symptoms_from_log
    dev = device or resolve_device(a["gpu"], a.get("cpu_bf16"))
    reasons: list[Reason] = []
    warnings: list[str] = []

    def why(answer: str, text: str) -> None:
        reasons.append(Reason(answer, text))

    precision = _choose_precision(dev, a, why, warnings.append)
    half = precision in ("fp16", "bf16")
    opts: dict[str, Any] = {"precision": precision, "checkpoint": True, "scheduler": "cosine", "eval": True}
    if precision == "fp16":
        why("gpu", "fp16: the recipe scales the loss, skips steps whose gradients overflow, steps the LR scheduler "
            "only when the optimizer really stepped, and saves the scaler state in checkpoints")

    symptoms = a["symptoms"]
    if symptoms_from_log:
        why("log", f"your log shows {', '.join(symptoms_from_log)}: taken as symptoms")
    if "nan_loss" in symptoms or (half and (a["custom_exp_log_loss"] or a["bf16_pretrained"])):
        opts["nan_guard"] = True
    if "nan_loss" in symptoms and precision == "fp32":
        why("symptoms", "NaNs that also appear in fp32 are not a mixed-precision problem: the NaN guard skips "
                        "and counts them; `python -m troubleshooter check` localises the first non-finite module")
    if a["grad_clipping"]:
        opts["clip"] = 1.0
        why("grad_clipping", "you clip gradients: the recipe unscales first (scaler.unscale_) so the threshold "
                             "applies to the true gradients" if precision == "fp16" else
                             "you clip gradients: the recipe clips the global norm right before the optimizer step")
    if a["grad_accumulation"] and a["grad_accumulation"] > 1:
        opts["accum"] = a["grad_accumulation"]
        why("grad_accumulation", f"you accumulate {a['grad_accumulation']} micro-batches: the loss is divided by "
            f"{a['grad_accumulation']}" + (", and the scaler steps and updates once per optimizer step, "
                                         "not per micro-batch" if precision == "fp16" else ""))
    if a["custom_exp_log_loss"]:
        if half:
            why("custom_exp_log_loss", "exp/log by hand overflow or lose precision in half precision (exp(x) "
                f"> 65504 for x > 11 in fp16): compute that part in float32 outside autocast "
                "(`with torch.autocast(device, enabled=False):` on `.float()` inputs) or use log_softmax/logsumexp")
            warnings.append("AMP117 (lint) flags exp/log/pow under autocast: run `python -m troubleshooter lint train.py`")
    family = a["model_family"]
    if family == "cnn":
        opts["model"] = "cnn"
        if half and dev.kind == "cuda":
            opts["channels_last"] = True
            why("model_family", "a CNN on tensor cores: channels_last lets cuDNN pick tensor-core convolutions "
                                "without layout transposes")
    elif family == "rnn" and precision == "fp16":
        warnings.append("RNNs run their cuDNN kernels in fp16 under autocast and hidden states can grow across "
                        "time steps: clip gradients and watch for skipped steps")
    if a["batchnorm"] and half:
        why("batchnorm", "BatchNorm is fine under autocast: it keeps float32 statistics; keep batches large "
                         "enough for stable statistics")
    if a["multi_gpu"] != "none":
        opts["distributed"] = a["multi_gpu"]
        why("multi_gpu", "DDP: gradients are all-reduced once per optimizer step (not per micro-batch)"
            if a["multi_gpu"] == "ddp" else
            "FSDP2: fully_shard with a MixedPrecisionPolicy (compute in the half dtype, reduce gradients in "
            "float32)" + (" and a ShardedGradScaler so every rank skips the same steps" if precision == "fp16" else ""))
    if "slow" in symptoms:
        if opts.get("distributed") != "fsdp" and dev.kind == "cuda":
            opts["compile"] = True
        why("symptoms", "it is slower than expected: the recipe has no per-step host syncs beyond logging, uses "
                        "fused AdamW" + (" and torch.compile" if opts.get("compile") else "") + "; measure with "
                        "`python -m troubleshooter speedup`")
        warnings.append("tensor cores need matmul/conv sizes in multiples of 8 (vocabularies of 64): "
                        "`python -m troubleshooter check` lists the misaligned layers")
        if not half:
            warnings.append("in fp32 there is no mixed-precision speed-up to find on this device")
    if "no_convergence" in symptoms:
        why("symptoms", "the loss does not go down: the recipe steps the LR schedule only on real optimizer "
                        "steps and logs the loss scale and skipped steps, so a scale that keeps halving shows")
        if precision == "fp16":
            warnings.append("under fp16, a loss scale that keeps falling means most steps are skipped: run "
                            "`python -m troubleshooter check` for the skip rate")
    if "oom" in symptoms:
        warnings.append("out of memory: autocast halves activation memory but not weights, gradients or AdamW "
                        "state (16 bytes per parameter); lower --batch-size and raise gradient accumulation")
    if a["params_millions"] and dev.memory_gb:
        need_gb = a["params_millions"] * 1e6 * BYTES_PER_PARAM_ADAMW / 1e9
        if need_gb > 0.8 * dev.memory_gb:
            text = (f"{a['params_millions']:g}M parameters need ~{need_gb:.0f} GB for float32 weights, gradients "
                    f"and AdamW state alone; the {dev.name} has {dev.memory_gb:g} GB")
            if a["multi_gpu"] != "fsdp":
                warnings.append(text + ": shard them across GPUs with FSDP (multi_gpu: fsdp)")
            else:
                why("params_millions", text + ": FSDP shards them across the GPUs")
    if a["bitexact_fp16"] and precision == "fp16":
        warnings.append("bit-exact reproduction also needs the same GPU model, PyTorch/cuDNN versions, seed, data "
                        "order and torch.use_deterministic_algorithms(True)")
    if precision == "fp32" and a["bitexact_fp16"]:
        warnings.append("an fp16 result cannot be reproduced bit for bit in fp32")

    from .recipes import normalize_options  # validates the combination (e.g. compile + fsdp)

    opts = normalize_options(**opts)
    device_label = dev.name + (f" ({dev.note})" if dev.note else "")
    return Decision(precision, opts, reasons, warnings, device_label, symptoms_from_log)
