"""The questionnaire: answers about hardware, model and symptoms in, a precision decision out.

`questions()` comes from `data/questions.yaml`; `decide(answers)` is a pure function (no torch)
mapping validated answers to a precision (bf16 / fp16 with GradScaler / stay fp32), recipe
options for `recipes.render_recipe`, and the reasons, each tied to the answer it came from.
GPU facts come from `hardware.find_gpu`; only `gpu: detect` looks at this machine (lazily,
through the capability check).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
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
    aliases = {alias: q["key"] for q in questions() for alias in q.get("aliases", [])}
    answers = {aliases.get(k, k): v for k, v in answers.items() if not (k in aliases and aliases[k] in answers)}
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
    if problems:
        raise UserError("invalid answers:", problems)
    for key, q in qmap.items():
        if result[key] is None and q["type"] in ("bool", "list", "choice") and q.get("default") is not None:
            result[key] = q["default"]
    return result


def load_answers(path: str) -> dict:
    """Read an answers file (.yaml/.yml or .json) into a dict; clear errors for unreadable input."""
    from .bounded import read_bytes
    from .safeyaml import MAX_BYTES, load as load_yaml  # bounded: size, depth and alias expansion

    try:
        data = read_bytes(path, MAX_BYTES, f"answers file {path}")  # no /dev/zero, no FIFO
    except OSError as exc:
        raise UserError(f"cannot read answers file {path}: {exc.strerror or exc}") from None
    if str(path).endswith(".json"):
        from .bounded import load_json

        try:
            data = load_json(data.decode("utf-8-sig"), str(path))
        except (ValueError, UnicodeDecodeError) as exc:
            raise UserError(f"{path} is not valid JSON: {str(exc).splitlines()[0]}") from None
    else:
        data = load_yaml(data, str(path))
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
    device_facts: dict = field(default_factory=dict)  # what the GPU answer resolved to
    training: str = "train"  # train | finetune | lora | inference (the `training` answer)
    num_gpus: int = 1
    fp8: dict | None = None  # how FP8 applies on this GPU (torchao float8 / Transformer Engine), None where it does not
    framework: str = "none"  # what the user trains with (the `framework` answer)
    framework_settings: dict | None = None  # that framework's settings: {framework, format, file, text}

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
            "device_facts": dict(self.device_facts),
            "training": self.training,
            "num_gpus": self.num_gpus,
            "fp8": dict(self.fp8) if self.fp8 else None,
            "framework": self.framework,
            "framework_settings": dict(self.framework_settings) if self.framework_settings else None,
        }

    def to_text(self) -> str:
        label = {"bf16": "bf16 (autocast, no loss scaling)", "fp16": "fp16 with GradScaler",
                 "fp32": "stay in fp32"}[self.precision]
        if self.training == "inference" and self.precision == "fp16":
            label = "fp16 (inference: no GradScaler)"
        lines = [f"Precision: {label}" + (f"   [{self.device}]" if self.device else ""), "", "Why:"]
        lines += [f"  - {r.text}" for r in self.reasons]
        if self.warnings:
            lines += ["", "Watch out:"] + [f"  - {w}" for w in self.warnings]
        if self.fp8:
            lines += ["", "FP8 (optional, on top of bf16):"] + [f"  - {t}" for t in self.fp8["advice"]]
        from .recipes import recipe_command

        lines += ["", "Recipe: " + recipe_command(self.recipe_options)]
        if self.framework_settings:
            fs = self.framework_settings
            lines += ["", f"{fs['framework']} settings ({fs['file']}):", ""]
            lines += ["    " + ln if ln else "" for ln in fs["text"].rstrip("\n").splitlines()]
        return "\n".join(lines)


@dataclass(frozen=True)
class _Device:
    """What the decision needs to know about the device."""
    name: str
    kind: str  # cuda (NVIDIA, and AMD under ROCm) | mps | xpu | cpu
    bf16: bool
    fp16_fast: bool
    tensor_cores: bool = False
    memory_gb: float | None = None
    arch: str = ""
    note: str = ""
    vendor: str = ""
    tf32: bool = False
    cc: tuple[int, int] | None = None
    backend_note: str = ""  # what autocast does on a non-NVIDIA backend
    warnings: tuple[str, ...] = ()
    memory_sizes_gb: tuple[float, ...] = ()  # a bare 'A100': the sizes it was sold with
    fp8: bool = False  # FP8 tensor cores (Ada, Hopper, Blackwell; MI300)


def find_gpu(name: str) -> hardware.GpuModel | None:
    """hardware.find_gpu, plus a unique known GPU whose name contains the text ('A6000')."""
    found = hardware.find_gpu(name)
    if found is None and len(name.strip()) >= 3:
        text = hardware.normalise_name(name)
        hits = [g for g in hardware.gpu_models() if re.search(r"(?<![a-z0-9])" + re.escape(text) + r"(?![a-z0-9])",
                                                             g.name.lower())]
        found = hits[0] if len(hits) == 1 else None
    return found


def _resolved_device(gpu: hardware.ResolvedGpu, note: str = "") -> _Device:
    return _Device(gpu.name, gpu.backend if gpu.backend in ("mps", "xpu") else "cuda", gpu.bf16, gpu.fp16_fast,
                   gpu.tensor_cores, gpu.memory_gb, gpu.arch, note, gpu.vendor, gpu.tf32, gpu.cc, gpu.note,
                   gpu.warnings, gpu.memory_sizes_gb, gpu.fp8)


def gpu_answer_from_device(name: str, capability: tuple[int, int] | None, memory_gb: float | None,
                           vendor: str = "nvidia") -> str:
    """The GPU answer for a detected device ("NVIDIA GeForce RTX 3080 (sm_86, 10 GB)").

    The app's "Detect my GPU" puts this string in the GPU field: it carries the capability and
    memory, so the resolver uses the device's own facts whether or not our tables know its name.
    """
    return hardware.gpu_answer_text(name, capability, memory_gb, vendor)


def _cpu_device(cpu_bf16: bool | None) -> _Device:
    note = ""
    if cpu_bf16 is None:
        from .engine import cpu_features  # pure: reads /proc/cpuinfo, no torch

        flags = cpu_features.cpu_features().get("flags", {})
        cpu_bf16 = any(flags.get(f) for f in cpu_features.BF16_FLAGS)
        note = "read from this machine"
    return _Device("CPU", "cpu", bool(cpu_bf16), False, note=note, vendor="cpu")


def _detected_device() -> _Device:
    from .engine.capability import detect  # lazy: needs torch

    report = detect()
    if report.kind == "cuda":
        cc = report.facts.get("compute_capability")
        memory = report.facts.get("memory_gb")
        text = gpu_answer_from_device(report.name, hardware.parse_cc(cc) if cc else None, memory)
        dev = _resolved_device(hardware.resolve_gpu(text), note="detected")
        return _Device(report.name, "cuda", report.bf16_native, report.fp16_fast or dev.fp16_fast, dev.tensor_cores,
                       dev.memory_gb, dev.arch, "detected", dev.vendor, dev.tf32, dev.cc, fp8=dev.fp8)
    if report.kind == "mps":
        return _resolved_device(hardware.resolve_gpu("Apple MPS"), note="detected")
    return _Device(report.name or "CPU", "cpu", report.bf16_native, False, note="detected", vendor="cpu")


def resolve_device(gpu: str, cpu_bf16: bool | None = None) -> _Device:
    """The device an answer names: 'detect', 'cpu', any GPU name or compute capability (never refused)."""
    name = str(gpu).strip()
    if name.lower() == "detect":
        return _detected_device()
    if name.lower() in _NOT_A_GPU_NAME:
        return _cpu_device(cpu_bf16)
    if not name:
        raise UserError("gpu: required (a GPU model such as V100, T4, A100, RTX 4090, H100; 'cpu'; or 'detect')")
    gpu = hardware.resolve_gpu(name)
    if not gpu.supported:  # Gaudi, TPU, an NPU: say so rather than answer for a guessed GPU
        raise UserError(f"gpu: {gpu.warnings[0]}")
    return _resolved_device(gpu)


_GPU_COUNT = re.compile(r"^\s*(\d{1,3})\s*(?:x|×|\*)\s*(.+)$|^\s*(\d{1,3})\s+(.+?)s?\s*$", re.IGNORECASE)


def gpu_count(answer: str) -> tuple[int | None, str]:
    """'8x V100' / '8 x A100 80GB' / '4 H100s' -> (8, 'V100'); a plain name -> (None, name)."""
    m = _GPU_COUNT.match(str(answer))
    if not m:
        return None, str(answer)
    count, name = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
    if not re.search(r"[a-z]", name, re.IGNORECASE) or re.match(r"\s*(?:gb|gib|g)\b", name, re.IGNORECASE):
        return None, str(answer)  # '8.6', '16 GB': not a count
    return int(count), name.strip()


TINY_MODEL_MILLIONS = 10  # below this a step is launch- and optimizer-bound: half precision buys nothing


def _an(word: str) -> str:
    return f"{'an' if word[:1] in 'AEIOU' else 'a'} {word}"


def _tiny_model(a: dict) -> str | None:
    """Why the model is too small for AMP to pay, or None."""
    params = a["params_millions"]
    if params is not None and params < TINY_MODEL_MILLIONS:
        return f"a {params:g}M-parameter model"
    if params is None and a["model_family"] == "rl":
        return "a reinforcement-learning MLP"
    return None


def _nan_precision(a: dict) -> str | None:
    """The precision the NaNs appeared in (fp16 | bf16 | fp32 | unknown), None without NaNs."""
    if "nan_loss" not in a["symptoms"]:
        return None
    return a["current_precision"] or "unknown"


def _precision_in_log(log: str) -> str | None:
    """fp16 / bf16 when a pasted log says which half type it ran in (and only one), else None."""
    text = log.lower()
    fp16 = re.search(r"float16|\bfp16\b|\bhalf\b|gradscaler|loss[ _]?scale|(?<![a-z])16-mixed", text) is not None
    bf16 = re.search(r"bfloat16|\bbf16\b|bf16-mixed", text) is not None
    if fp16 != bf16:
        return "fp16" if fp16 else "bf16"
    return None


def _tf32_clause(dev: _Device) -> str:
    return (" with TF32 on (torch.backends.cuda.matmul.allow_tf32 / cudnn.allow_tf32, or "
            "torch.set_float32_matmul_precision('high')): float32 matmuls and convolutions run on the tensor "
            "cores at no accuracy cost for training") if dev.tf32 else ""


def _choose_precision(dev: _Device, a: dict, why, warn) -> str:
    nan_in = _nan_precision(a)
    overflow_possible = nan_in in ("fp16", "unknown")
    if dev.kind == "cpu":
        if dev.bf16:
            why("gpu", "the CPU has AMX/AVX512-BF16: bf16 autocast runs natively and needs no loss scaling")
            return "bf16"
        why("gpu", "the CPU has no AMX or AVX512-BF16: bf16/fp16 would be emulated, slower than fp32, so stay fp32")
        return "fp32"
    tiny = _tiny_model(a)
    if tiny and not a["bitexact_fp16"]:
        why("params_millions" if a["params_millions"] is not None else "model_family",
            f"{tiny} is too small for mixed precision to help on any GPU: each step is bound by kernel launches "
            f"and the optimizer, not by matmul throughput, and autocast adds casts. Stay in fp32"
            + _tf32_clause(dev) + "; to go faster, use larger batches (or many environments/samples per step), "
            "CUDA graphs or torch.compile(mode='reduce-overhead'), and keep data on the GPU")
        return "fp32"
    if dev.bf16:
        if a["bitexact_fp16"]:
            why("bitexact_fp16", "you must reproduce an fp16 result bit for bit: stay in fp16"
                + (" with GradScaler" if a.get("training") != "inference" else "")
                + " (bf16 rounds differently, so its results cannot match)")
            if overflow_possible:
                warn(f"if the NaNs come from fp16 overflow, bf16 would remove them on the {dev.name}; once "
                     "bit-exactness is no longer needed, switch to bf16")
            return "fp16"
        arch = dev.arch or "Ampere-or-newer"
        if overflow_possible:
            why("symptoms", f"NaNs under fp16 and {_an(arch)} GPU: bf16 removes the overflow (float32's exponent "
                            "range, max ~3e38 instead of 65504)")
            if nan_in == "unknown":
                warn("if the NaNs also appear in bf16 or fp32, they are not an overflow but a model, data or "
                     "learning-rate problem: localise them with `python -m troubleshooter check` (NaN hunt)")
        else:
            units = "bf16 tensor cores" if dev.vendor in ("nvidia", "") else "native bf16 (matrix cores)"
            why("gpu", f"the {dev.name} ({dev.arch}) has {units}: bf16 is as fast as fp16 and has "
                       "float32's range, so no GradScaler and no overflow")
        if a["bf16_pretrained"]:
            why("bf16_pretrained", "the model was pretrained in bf16: fine-tuning in bf16 keeps its value ranges")
        return "bf16"
    if not dev.fp16_fast:
        why("gpu", f"the {dev.name} has neither tensor cores nor fast fp16 (nor bf16): mixed precision would "
                   "not be faster, so stay fp32")
        return "fp32"
    if overflow_possible and a["bf16_pretrained"]:
        why("bf16_pretrained", f"weights pretrained in bf16 overflow fp16 (values beyond 65504) and you already "
                               f"see NaNs; the {dev.name} has no bf16, so stay fp32 (or train on an Ampere+ GPU in bf16)")
        return "fp32"
    scaler = (f"with GradScaler{'(' + repr(dev.kind) + ')' if dev.kind not in ('cuda', '') else ''}"
              if a.get("training") != "inference" else "(no GradScaler: inference has no gradients)")
    if dev.vendor not in ("nvidia", ""):
        why("gpu", f"the {dev.name} ({dev.arch}) runs fp16 natively but not bf16 at full speed, so fp16 {scaler}")
    else:
        why("gpu", f"the {dev.name} ({dev.arch or 'no bf16'}) has no bf16 tensor cores, so fp16 {scaler}"
            if dev.tensor_cores else
            f"the {dev.name} runs fp16 at twice its fp32 rate but has no bf16, so fp16 {scaler}")
    if a["bf16_pretrained"]:
        warn("weights pretrained in bf16 often overflow fp16 (activations beyond 65504): watch for NaNs "
             "(the recipe's NaN guard counts them); `python -m troubleshooter check` finds the layer")
    if overflow_possible:
        why("symptoms", "NaNs under fp16 on a GPU without bf16: keep GradScaler and add the NaN guard; run "
                        "`python -m troubleshooter check` to find the first layer that overflows")
    return "fp16"


def _task_reasons(task: str, precision: str, a: dict, dev: _Device, why, warn) -> None:
    """What fine-tuning adapters, inference, or float16 weights on disk change about the advice."""
    dtype = {"fp16": "torch.float16", "bf16": "torch.bfloat16", "fp32": "torch.float32"}[precision]
    if task == "inference":
        why("training", "inference: no gradients, so no loss scaling and no float32 master weights are needed; the "
            f"generated inference loop casts the model once (model.to({dtype})), runs it in eval mode under "
            "torch.inference_mode(), and first compares a few batches with the float32 model (a model that "
            "overflows float16 stops there)" if precision != "fp32" else
            "inference in fp32: the generated loop runs model.eval() under torch.inference_mode(), the speed-ups "
            "that remain")
    elif task == "lora":
        why("training", "adapters (LoRA): keep the frozen base weights in "
            + (f"{dtype} (or 8-bit/4-bit)" if precision != "fp32" else "float32 (or 8-bit/4-bit)")
            + " and the trainable adapter weights in float32"
            + (": GradScaler unscales only float32 gradients ('Attempting to unscale FP16 gradients.' otherwise)"
               if precision == "fp16" else ": the optimizer updates them precisely")
            + (". The recipe (--lora) does exactly this on its demo transformer" if a["model_family"] != "cnn" else
               ". (The recipe's LoRA demo is a transformer: for a CNN, freeze the base and cast it yourself)"))
    if a.get("fp16_weights"):
        if task == "inference":
            why("fp16_weights", "weights stored in float16 can run as they are in fp16"
                + ("; converting them to bf16 drops 3 mantissa bits, harmless for most models" if precision == "bf16"
                   else ""))
        elif task == "lora":
            why("fp16_weights", "weights stored in float16: the frozen base may stay float16; only the adapters must "
                                "be float32")
        else:
            why("fp16_weights", "weights stored in float16: the recipe (--load-weights, --init-from PATH) loads them "
                                "as float32 and calls model.float() before building the optimizer: autocast computes "
                                "in half precision, the optimizer must update float32 master weights (GradScaler "
                                "refuses float16 gradients: AMP111)")


def decide(answers: dict, *, device: _Device | None = None) -> Decision:
    """Map answers to precision, recipe options, reasons and warnings. `device` injects the device."""
    a = validate_answers(answers)
    symptoms_from_log: list[str] = []
    precision_from_log = None
    if a.get("log"):
        from .explain import explain_log

        symptoms_from_log = [s for s in explain_log(a["log"]).symptoms if s not in a["symptoms"]]
        a["symptoms"] = a["symptoms"] + symptoms_from_log
        if a["current_precision"] in (None, "unknown"):
            precision_from_log = _precision_in_log(a["log"])
            a["current_precision"] = precision_from_log or a["current_precision"]
    counted, gpu_name = gpu_count(a["gpu"])
    num_gpus = a.get("num_gpus") or counted or 1
    dev = device or resolve_device(gpu_name, a.get("cpu_bf16"))
    reasons: list[Reason] = []
    warnings: list[str] = list(dev.warnings)

    def why(answer: str, text: str) -> None:
        reasons.append(Reason(answer, text))

    precision = _choose_precision(dev, a, why, warnings.append)
    half = precision in ("fp16", "bf16")
    opts: dict[str, Any] = {"precision": precision, "checkpoint": True, "scheduler": "cosine", "eval": True}
    task = a.get("training") or "train"
    if precision == "fp16" and task != "inference":
        why("gpu", "fp16: the recipe scales the loss, skips steps whose gradients overflow, steps the LR scheduler "
            "only when the optimizer really stepped, and saves the scaler state in checkpoints")
    _task_reasons(task, precision, a, dev, why, warnings.append)
    if dev.backend_note and dev.kind != "cpu":
        warnings.append(f"{dev.name} ({dev.arch}): {dev.backend_note}")
    if precision == "fp32" and dev.tf32 and not _tiny_model(a):
        why("gpu", "fp32 on an Ampere-or-newer GPU: turn TF32 on (torch.backends.cuda.matmul.allow_tf32 = True, "
                   "torch.backends.cudnn.allow_tf32 = True): float32 matmuls run on the tensor cores")
    if precision == "fp32" and dev.tf32:
        opts["tf32"] = True

    if task == "lora" and a["model_family"] != "cnn" and a["multi_gpu"] != "fsdp":
        opts["lora"] = True
    if a.get("fp16_weights") and task in ("train", "finetune", "inference"):
        opts["load_weights"] = True
    _build_warning(dev, warnings.append)

    symptoms = a["symptoms"]
    if symptoms_from_log:
        why("log", f"your log shows {', '.join(symptoms_from_log)}: taken as symptoms")
    if "nan_loss" in symptoms or (half and (a["custom_exp_log_loss"] or a["bf16_pretrained"])):
        opts["nan_guard"] = True
    nan_in = _nan_precision(a)
    if nan_in in ("bf16", "fp32"):
        source = " (your log shows it ran in bf16)" if precision_from_log == "bf16" else ""
        why("current_precision" if not precision_from_log else "log",
            f"NaNs under {nan_in}{source} are not an fp16 overflow ("
            + ("bf16 has float32's exponent range" if nan_in == "bf16" else "the run was float32 throughout")
            + "): it is a "
            "model, data or learning-rate problem. Localise it: `python -m troubleshooter check` (the NaN hunt "
            "names the first module whose output turns non-finite) or trace your script over a few steps; look for "
            "bad samples (inf/NaN in inputs or labels), a learning rate too high (lower it or lengthen warm-up), "
            "log/sqrt/division of values near zero, and exploding gradients (clip them). The NaN guard keeps "
            "them out of the weights meanwhile")
    training = task != "inference"  # clipping, accumulation and loss scaling need a backward pass
    if a["grad_clipping"] and training:
        opts["clip"] = 1.0
        why("grad_clipping", "you clip gradients: the recipe unscales first (scaler.unscale_) so the threshold "
                             "applies to the true gradients" if precision == "fp16" else
                             "you clip gradients: the recipe clips the global norm right before the optimizer step")
    if a["grad_accumulation"] and a["grad_accumulation"] > 1 and training:
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
        if half and dev.kind == "cuda" and dev.tensor_cores and dev.vendor == "nvidia":
            opts["channels_last"] = True
            why("model_family", "a CNN on tensor cores: channels_last lets cuDNN pick tensor-core convolutions "
                                "without layout transposes")
    elif family == "rnn" and precision == "fp16":
        warnings.append("RNNs run their cuDNN kernels in fp16 under autocast and hidden states can grow across "
                        "time steps: clip gradients and watch for skipped steps")
    if a["batchnorm"] and half:
        why("batchnorm", "BatchNorm is fine under autocast: it keeps float32 statistics")
    accumulating = bool(a["grad_accumulation"] and a["grad_accumulation"] > 1)
    if a["batchnorm"] and (accumulating or "oom" in a["symptoms"]):
        why("batchnorm", "BatchNorm normalises over each micro-batch, not over the accumulated batch: keep the "
                         "micro-batch large enough for stable statistics (do not shrink it to save memory; use "
                         "activation checkpointing instead)" + (", and SyncBatchNorm so the statistics pool every "
                         "GPU's micro-batch" if a["multi_gpu"] != "none" else ", or GroupNorm/LayerNorm, which do "
                         "not depend on the batch"))
        if a["multi_gpu"] == "ddp" and opts.get("model") == "cnn":  # the recipe's model with BatchNorm
            opts["sync_batchnorm"] = True
    if a["multi_gpu"] != "none":
        opts["distributed"] = a["multi_gpu"]
        why("multi_gpu", "DDP: gradients are all-reduced once per optimizer step (not per micro-batch)"
            if a["multi_gpu"] == "ddp" else
            "FSDP2: fully_shard with a MixedPrecisionPolicy (compute in the half dtype, reduce gradients in "
            "float32)" + (" and a ShardedGradScaler so every rank skips the same steps" if precision == "fp16" else ""))
    if (("slow" in symptoms) or _tiny_model(a)) and opts.get("distributed") != "fsdp" and dev.kind == "cuda":
        opts["compile"] = True
    if "slow" in symptoms:
        why("symptoms", "it is slower than expected: the recipe has no per-step host syncs beyond logging, uses "
                        "fused AdamW" + (" and torch.compile" if opts.get("compile") else "") + "; measure with "
                        "`python -m troubleshooter speedup`")
        if not _tiny_model(a):
            warnings.append("tensor cores need matmul/conv sizes in multiples of 8 (vocabularies of 64): "
                            "`python -m troubleshooter check` lists the misaligned layers")
        if not half and not _tiny_model(a):
            warnings.append("in fp32 there is no mixed-precision speed-up to find on this device")
    if "no_convergence" in symptoms:
        why("symptoms", "the loss does not go down: the recipe steps the LR schedule only on real optimizer "
                        "steps and logs the loss scale and skipped steps, so a scale that keeps halving shows")
        if precision == "fp16":
            warnings.append("under fp16, a loss scale that keeps falling means most steps are skipped: run "
                            "`python -m troubleshooter check` for the skip rate")
    if "oom" in symptoms and task == "inference":
        warnings.append("out of memory in inference: half-precision weights take 2 bytes per parameter; run under "
                        "torch.inference_mode(), lower the batch size, or quantize the weights (8-bit/4-bit)")
    elif "oom" in symptoms:
        opts["activation_checkpointing"] = True
        text = ("out of memory: with adapters the frozen base weights and the activations dominate; activation "
                "checkpointing (in the recipe) trades recomputation for activation memory" if task == "lora" else
                "out of memory: autocast halves activation memory but not weights, gradients or AdamW state "
                "(16 bytes per parameter); activation checkpointing (in the recipe) trades recomputation for "
                "activation memory")
        if not a["batchnorm"]:
            text += "; or lower --batch-size and raise gradient accumulation (same effective batch)"
        if a["multi_gpu"] == "ddp":
            text += ("; with several GPUs, FSDP (multi_gpu: fsdp) also shards weights, gradients and optimizer "
                     "state, which DDP copies to every GPU")
        warnings.append(text)
    need_gb, shard = None, False
    if a["params_millions"] and dev.memory_gb and task in ("inference", "lora"):
        per_param = 4 if precision == "fp32" else 2
        need_gb = a["params_millions"] * 1e6 * per_param / 1e9
        if need_gb > 0.8 * dev.memory_gb:
            warnings.append(f"{a['params_millions']:g}M parameters take ~{need_gb:.0f} GB as {precision} weights"
                            f"{' (the frozen base)' if task == 'lora' else ''}; the {dev.name} has "
                            f"{dev.memory_gb:g} GB: load the base weights in 8-bit or 4-bit (bitsandbytes"
                            f"{', QLoRA' if task == 'lora' else ''}) or split the model across GPUs")
    elif a["params_millions"] and dev.memory_gb:
        need_gb = a["params_millions"] * 1e6 * BYTES_PER_PARAM_ADAMW / 1e9
        if need_gb > 0.8 * dev.memory_gb:
            text = (f"{a['params_millions']:g}M parameters need ~{need_gb:.0f} GB for float32 weights, gradients "
                    f"and AdamW state alone; the {dev.name} has {dev.memory_gb:g} GB")
            single = ("fine-tune with LoRA/adapters (only they get gradients and optimizer state), use an 8-bit "
                      "optimizer (bitsandbytes AdamW8bit: 2 bytes of state per parameter instead of 8), and "
                      "activation checkpointing for the activations")
            shard = True
            per_gpu = need_gb / num_gpus
            if a["multi_gpu"] == "fsdp" and num_gpus > 1 and per_gpu > 0.8 * dev.memory_gb:
                warnings.append(text + f": FSDP over {num_gpus} GPUs still leaves ~{per_gpu:.0f} GB per {dev.name} "
                                f"before any activation, more than fits: {_memory_way_out(a, num_gpus)}")
            elif a["multi_gpu"] == "fsdp":
                why("params_millions", text + (f": FSDP shards them, ~{per_gpu:.0f} GB per GPU over {num_gpus}"
                                                if num_gpus > 1 else ": FSDP shards them across the GPUs"))
            elif num_gpus > 1 and per_gpu > 0.8 * dev.memory_gb:
                warnings.append(text + f"; even sharded over your {num_gpus} GPUs that is ~{per_gpu:.0f} GB per "
                                f"{dev.name} before any activation: {_memory_way_out(a, num_gpus)}")
            elif num_gpus > 1 and a["multi_gpu"] != "fsdp":
                warnings.append(text + f": {'DDP keeps a full copy on every GPU; ' if a['multi_gpu'] == 'ddp' else ''}"
                                f"shard them over your {num_gpus} GPUs with FSDP (multi_gpu: fsdp; ~{per_gpu:.0f} GB "
                                "per GPU)")
            elif a["multi_gpu"] == "ddp":
                warnings.append(text + ": DDP keeps a full copy on every GPU; shard them with FSDP (multi_gpu: fsdp), "
                                       "or " + single)
            else:
                warnings.append(text + ": on one GPU, " + single)
    smallest = min(dev.memory_sizes_gb, default=None)
    if need_gb is not None and smallest is not None and 0.8 * smallest < need_gb <= 0.8 * dev.memory_gb:
        warnings.append(f"the memory advice assumed the {dev.memory_gb:g} GB {dev.name}; it was also sold with "
                        f"{smallest:g} GB, where ~{need_gb:.0f} GB would not fit: give the size in the GPU answer "
                        f"(e.g. '{dev.name} {smallest:g}GB') if yours is the smaller one")
    if a["bitexact_fp16"] and precision == "fp16":
        warnings.append("bit-exact reproduction also needs the same GPU model, PyTorch/cuDNN versions, seed, data "
                        "order and torch.use_deterministic_algorithms(True)")
    if precision == "fp32" and a["bitexact_fp16"]:
        warnings.append("an fp16 result cannot be reproduced bit for bit in fp32")

    fp8 = _fp8_advice(dev, a, precision, task)
    if task == "inference":  # its own template: only what inference takes
        opts = {k: v for k, v in opts.items() if k in ("precision", "compile", "load_weights", "log_every")}
        opts.update(task="inference", load_weights=True)
    from . import framework_settings
    from .recipes import normalize_options  # validates the combination (e.g. compile + fsdp)

    opts = normalize_options(**opts)
    settings = framework_settings.settings(a.get("framework") or "none", opts, task=task, num_gpus=num_gpus,
                                           tf32=dev.tf32 and precision == "fp32" or dev.tf32, shard=shard)
    device_label = dev.name + (f" ({dev.note})" if dev.note else "")
    facts = {"name": dev.name, "kind": dev.kind, "vendor": dev.vendor, "architecture": dev.arch,
             "compute_capability": f"{dev.cc[0]}.{dev.cc[1]}" if dev.cc else None, "memory_gb": dev.memory_gb,
             "bf16": dev.bf16, "fp16_fast": dev.fp16_fast, "tensor_cores": dev.tensor_cores, "tf32": dev.tf32}
    return Decision(precision, opts, reasons, warnings, device_label, symptoms_from_log, facts, task, num_gpus, fp8,
                    a.get("framework") or "none", settings)


def _memory_way_out(a: dict, num_gpus: int) -> str:
    return ("train adapters (LoRA: only they get gradients and optimizer state), an 8-bit optimizer (bitsandbytes "
            "AdamW8bit), CPU offload of the optimizer state (FSDP CPUOffload / DeepSpeed ZeRO-3 offload_optimizer), "
            "activation checkpointing, or more GPUs")


def _build_warning(dev: _Device, warn) -> None:
    """Blackwell GPUs need a PyTorch built for them: older wheels have no kernels for sm_100/sm_120."""
    if dev.kind != "cuda" or dev.vendor != "nvidia" or not dev.cc or dev.cc < (10, 0):
        return
    arch = f"sm_{dev.cc[0]}{dev.cc[1]}"
    if dev.cc[0] == 11:
        warn(f"the {dev.name} ({arch}) needs a PyTorch built with CUDA 13 (where Thor is sm_110; CUDA 12.8/12.9 "
             "call it sm_101): check `torch.cuda.get_arch_list()`")
        return
    warn(f"the {dev.name} ({arch}) needs a PyTorch build with {arch} kernels: PyTorch 2.7 or newer built with CUDA "
         "12.8 or newer (pip install torch --index-url https://download.pytorch.org/whl/cu128). Older wheels stop with "
         f"'... with CUDA capability {arch} is not compatible with the current PyTorch installation' / 'no kernel "
         "image is available'; `torch.cuda.get_arch_list()` must list it")


def _fp8_advice(dev: _Device, a: dict, precision: str, task: str) -> dict | None:
    """FP8 on GPUs with FP8 tensor cores (Ada, Hopper, Blackwell): what applies and what it needs."""
    if not dev.fp8 or dev.vendor != "nvidia" or precision != "bf16" or task not in ("train", "finetune"):
        return None
    if a["model_family"] not in ("transformer", "mlp", "other") or _tiny_model(a):
        return None
    big = a["params_millions"] is None or a["params_millions"] >= 1000
    advice = [
        f"the {dev.name} has FP8 tensor cores (twice its bf16 matmul rate): for a large transformer the Linear "
        "layers can run in FP8 while everything else stays bf16"
        + ("" if big else "; at your size the matmuls are small, so expect little or no gain: measure first"),
        "torchao float8 training: `from torchao.float8 import convert_to_float8_training, Float8LinearConfig`; "
        "`convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name('rowwise'))` "
        "('tensorwise' is the faster, coarser recipe), then torch.compile(model); with accelerate: "
        "Accelerator(mixed_precision='fp8', kwargs_handlers=[AORecipeKwargs()])",
        "or NVIDIA Transformer Engine: te.Linear layers under `te.fp8_autocast(enabled=True, "
        "fp8_recipe=DelayedScaling(fp8_format=Format.HYBRID))` (E4M3 forward, E5M2 gradients)",
        "needs: Linear in_features and out_features divisible by 16 (others stay bf16; accelerate's filter skips "
        "them), the token count a multiple of 16 (or pad_inner_dim), and the first and last Linear kept in bf16 "
        "(accelerate's default, for stable convergence); compare the loss curve with the bf16 run",
    ]
    return {"applies": True, "big_enough": big, "libraries": ["torchao.float8", "transformer_engine"],
            "requires": ["compute capability >= 8.9", "Linear dims divisible by 16", "torch.compile (torchao)"],
            "advice": advice}
