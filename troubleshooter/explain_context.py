"""What a pasted error says about the situation around it, so `explain` gives the fix for that situation.

The same message needs different fixes: "Attempting to unscale FP16 gradients" means "drop
model.half()" in a plain loop, "cast only the adapters to float32" under LoRA/PEFT (the frozen base
stays float16), and "no GradScaler at all" for inference. `read_context(text)` reads what the text
shows: traceback frames inside installed libraries, LoRA/PEFT, inference servers, a resumed run, the
training framework, and a GPU named anywhere in it (facts from `hardware`). Patterns in
`data/log_patterns.yaml` pick their fix by these keys (`contexts:`); known library bugs, with the
release that fixed them where known, live in `data/library_bugs.yaml`. Pure Python: no torch.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

import yaml

from . import hardware

# `File ".../site-packages/transformers/trainer.py", line 1972` (also dist-packages, a source checkout
# `.../accelerate/src/accelerate/...`, and rich tracebacks `/.../accelerate/accelerator.py:2040 in ...`).
_FRAME = re.compile(r"(?:site|dist)-packages[/\\]+(\w+)[/\\]+([\w/\\.]+?\.py)|[/\\]src[/\\]+(\w+)[/\\]+([\w/\\.]+?\.py)",
                    re.IGNORECASE)
_LIBRARIES = {"transformers", "accelerate", "lightning", "pytorch_lightning", "deepspeed", "peft", "diffusers", "trl",
              "torch", "vllm", "apex", "fairseq", "fairseq2", "ultralytics", "bitsandbytes", "torchao",
              "transformer_engine", "timm", "mmengine", "mmcv"}

_CLUES = {
    "lora": r"\bpeft\b|\blora\b|lora_|loraconfig|get_peft_model|\bqlora\b|\badapters?\b|prepare_model_for_kbit|"
            r"load_in_[48]bit|bnb_4bit|--use_lora|finetuning_type lora",
    "inference": r"\bvllm\b|llm_engine|inference_mode|\.generate\(|text-generation-inference|\bsglang\b|"
                 r"\binference (?:only|server|time)|\bserving\b|--dtype[= ](?:half|float16|bfloat16)|\bLLM\(model=|"
                 # vLLM's own dtype check (vllm/worker: _check_if_gpu_supports_dtype) names no library
                 r"Bfloat16 is only supported on GPUs with compute capability of at least",
    "training": r"\.backward\(|optimizer|gradscaler|scaler\.|trainer\.train|\.fit\(|train_step|training_step|"
                r"_inner_training_loop|accelerator\.backward|grad_norm|\bepoch\b",
    "resume": r"\bresum\w*|load_state(?:_dict)?\b|restor\w+ (?:the )?(?:trainer|optimizer|scaler|checkpoint|training)|"
              r"resume_from_checkpoint|--resume|ckpt_path=",
    "accelerate": r"\baccelerate\b|accelerator\.|Accelerator\(|mixed_precision",
    "lightning": r"\blightning\b|pytorch_lightning|pl\.Trainer|\bfabric\b|precision=['\"]?(?:16|bf16)|16-mixed|bf16-mixed",
    "deepspeed": r"\bdeepspeed\b|deepscale|zero_optimization|ds_config|\bZeRO\b",
    "hf_trainer": r"transformers[/\\]trainer\.py|TrainingArguments|Seq2SeqTrainer|\bSFTTrainer\b|--fp16\b|--bf16\b|"
                  r"trainer\.train\(|training_args\.py",
    "fsdp": r"\bFSDP\d?\b|FullyShardedDataParallel|fully_shard|flat_param|_fsdp_",
    "compile": r"torch\.compile|torch\._dynamo|inductor|aot_autograd",
}
_CLUE_RE = {k: re.compile(v, re.IGNORECASE) for k, v in _CLUES.items()}


@dataclass
class Context:
    """The situation a pasted text shows. `keys` are what patterns' `contexts:` entries ask for."""

    keys: set[str] = field(default_factory=set)
    libraries: list[str] = field(default_factory=list)  # installed packages seen in traceback frames
    user_frames: bool = False  # a frame in the user's own file (not site-packages)
    gpu: hardware.ResolvedGpu | None = None

    @property
    def gpu_label(self) -> str:
        if self.gpu is None:
            return ""
        cc = f"sm_{self.gpu.cc[0]}{self.gpu.cc[1]}, " if self.gpu.cc else ""
        return f"{self.gpu.name} ({cc}{self.gpu.arch or self.gpu.vendor})"

    def to_list(self) -> list[str]:
        return sorted(self.keys | {f"library:{lib}" for lib in self.libraries}
                      | ({f"gpu:{self.gpu.name}"} if self.gpu else set()))


def _frames(text: str) -> tuple[list[str], bool]:
    libs: list[str] = []
    for m in _FRAME.finditer(text):
        lib = (m.group(1) or m.group(3) or "").lower()
        if lib in _LIBRARIES and lib not in libs:
            libs.append(lib)
    user = bool(re.search(r'File "(?![^"]*(?:site|dist)-packages)(?![^"]*[/\\]lib[/\\]python3)[^"<]+\.py"', text))
    return libs, user


def read_context(text: str) -> Context:
    """Every clue in `text`: libraries in frames, LoRA, inference, resume, framework, the GPU named."""
    sample = text[-200_000:]  # the end of a long log is where the error and its traceback are (explain.TAIL_CHARS)
    libs, user = _frames(sample)
    keys = {k for k, rx in _CLUE_RE.items() if rx.search(sample)}
    keys |= {lib for lib in libs if lib in ("accelerate", "deepspeed", "peft")}
    if "lightning" in libs or "pytorch_lightning" in libs:
        keys.add("lightning")
    if "transformers" in libs and any(f.endswith("trainer.py") for f in _frame_files(sample, "transformers")):
        keys.add("hf_trainer")
    if "vllm" in libs:
        keys.add("inference")
    if "peft" in libs:
        keys.add("lora")
    # Inference only when nothing in the text trains (a vLLM error inside a training job is still training).
    if "inference" in keys and "training" in keys and "vllm" not in libs:
        keys.discard("inference")
    if any(lib in libs for lib in ("transformers", "accelerate", "lightning", "pytorch_lightning", "deepspeed",
                                   "diffusers", "peft", "trl")):
        keys.add("library_frames")
    gpu = find_gpu_in_text(sample)
    if gpu is not None:
        keys.add("gpu")
        if not gpu.bf16:
            keys.add("gpu_no_bf16")
        if not gpu.fp16_fast:
            keys.add("gpu_fp16_slow")
        if not gpu.tensor_cores:
            keys.add("gpu_no_tensor_cores")
        keys.add("gpu_tf32" if gpu.tf32 else "gpu_no_tf32")
        if gpu.fp8:
            keys.add("gpu_fp8")
    return Context(keys, libs, user, gpu)


def _frame_files(text: str, lib: str) -> list[str]:
    return [(m.group(2) or m.group(4) or "") for m in _FRAME.finditer(text) if (m.group(1) or m.group(3) or "").lower() == lib]


# A GPU named in a message: vendor words or a product code ("Tesla V100-SXM2-32GB", "GeForce RTX 3090",
# "P40", "NVIDIA A100"). Only NVIDIA and AMD product codes with a family letter: a bare number is not a GPU.
_GPU_WORD = re.compile(
    r"(?:(?:NVIDIA|Tesla|GeForce|Quadro|TITAN|Radeon|Instinct|AMD)\s+)*"
    r"(?:(?:RTX|GTX)\s*(?:PRO\s*)?\d{3,4}(?:\s*(?:Ti|SUPER|Laptop))*|\b[1-5]0[5-9]0\s?(?:Ti|SUPER)\b|"
    r"\b(?:[PVTAHLBKM]\d{1,3}[A-Z]?|A\d{4}|H\d{3}|B\d{3}|GH\d{3}|GB\d{3}|MI\d{3}[AX]?)\b)(?:-[\w-]+)?",
    re.IGNORECASE)
# A name given as a requirement or an example ("(e.g., RTX 4090)", "ROCm MI300+", "Ada or newer") is not
# the user's GPU.
_NOT_THEIRS_BEFORE = re.compile(r"(?:e\.g\.,?|such as|like|requires?|required|at least|than an?|vs\.?|versus)\W*$",
                                re.IGNORECASE)
_NOT_THEIRS_AFTER = re.compile(r"^\s*(?:\+|or (?:higher|newer|later|above)|and (?:newer|later|above))", re.IGNORECASE)
# The user's own device described by its capability: "Your GPU's capability is 8.6", "has compute
# capability 7.0", "compute capability of (8, 6) which is insufficient".
_THEIR_CC = re.compile(r"(?:your|my|this|current)\b[^\n.]{0,60}?capability(?: of)?(?: is)?\s*\(?(\d{1,2})\s*[.,]\s*(\d)\)?",
                       re.IGNORECASE)


def _named_gpus(text: str):
    for m in _GPU_WORD.finditer(text):
        word = m.group(0).strip()
        if _NOT_THEIRS_BEFORE.search(text[max(0, m.start() - 25):m.start()]) or _NOT_THEIRS_AFTER.match(text[m.end():]):
            continue
        short = re.fullmatch(r"[A-Za-z]\d{1,2}", word)
        if short and not (re.fullmatch(r"[A-Z]\d{2}", word) or re.search(
                r"(?:tesla|nvidia|gpu|card|on an?|with an?|using an?|use an?|my)\s+" + re.escape(word) + r"\b|"
                + re.escape(word) + r"\s+(?:gpu|card)", text, re.IGNORECASE)):
            continue  # 't4' or 'a2' alone could be anything: needs a GPU word next to it
        gpu = hardware.resolve_gpu(word)
        if gpu.known and gpu.vendor in ("nvidia", "amd"):
            yield gpu


def find_gpu_in_text(text: str) -> hardware.ResolvedGpu | None:
    """The user's GPU as the text names it ('Your Tesla T4 GPU', 'on a P40', 'your GPU's capability is
    8.6'), skipping names given as requirements or examples; None when the text names none."""
    named = next(_named_gpus(text), None)
    cc = _THEIR_CC.search(text)
    if cc:
        major, minor = int(cc.group(1)), int(cc.group(2))
        if named is None or named.cc != (major, minor):
            return hardware.resolve_gpu(f"sm_{major}{minor}")
    return named


@lru_cache(maxsize=1)
def library_bugs() -> list[dict]:
    """Known bugs inside libraries that surface as AMP messages (data/library_bugs.yaml)."""
    text = resources.files("troubleshooter.data").joinpath("library_bugs.yaml").read_text(encoding="utf-8")
    bugs = yaml.safe_load(text)["bugs"]
    for b in bugs:
        b["_frames"] = re.compile(b["frames"], re.IGNORECASE)
        b["_also"] = re.compile(b["also"], re.IGNORECASE) if b.get("also") else None
    return bugs


def library_bug(pattern_id: str, text: str) -> dict | None:
    """The known library bug behind this message, when the traceback runs through the buggy code."""
    for bug in library_bugs():
        if pattern_id in bug["patterns"] and bug["_frames"].search(text) and (
                bug["_also"] is None or bug["_also"].search(text)):
            return bug
    return None


def pick(entries: list[dict] | None, ctx: Context, text: str = "") -> dict | None:
    """The first `contexts:` entry whose `when` keys are all present, `unless` keys absent, and whose
    `text` regex (a wording only one variant of the message has) matches the pasted text."""
    for entry in entries or ():
        when = entry.get("when") or []
        unless = entry.get("unless") or []
        wording = entry.get("text")
        if all(k in ctx.keys for k in when) and not any(k in ctx.keys for k in unless) and (
                not wording or re.search(wording, text, re.IGNORECASE)):
            return entry
    return None
