"""Facts about GPU architectures and devices, read from `data/gpus.yaml`.

Kept as data so a new GPU is one line in the YAML file, and pure (no torch) so the
questionnaire can reason about a GPU the user names without having one.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from functools import lru_cache

# Tensor-core sizes (HALF_MULTIPLE = 8 elements, VOCAB_MULTIPLE = 64) and `padded_size` live in
# hardware_sizes.py so the linter reads them without importing this module; they are public here too.
from .hardware_sizes import HALF_MULTIPLE, VOCAB_MULTIPLE, padded_size  # noqa: F401


def _read_yaml(name: str):
    """A data file, loaded on first use: importing this module reads no file."""
    from importlib import resources

    import yaml

    return yaml.safe_load(resources.files("troubleshooter.data").joinpath(name).read_text(encoding="utf-8"))


@dataclass(frozen=True)
class Architecture:
    name: str
    min_cc: tuple[int, int]
    fp16_tensor_cores: bool
    bf16: bool
    tf32: bool
    fp8: bool


@dataclass(frozen=True)
class GpuModel:
    name: str
    match: tuple[str, ...]
    cc: tuple[int, int]
    memory_gb: float
    peak_tflops: dict
    approximate: bool = False

    @property
    def architecture(self) -> Architecture:
        return architecture_for(self.cc)


def parse_cc(value) -> tuple[int, int]:
    """'8.6' or (8, 6) or 8.6 -> (8, 6)."""
    if isinstance(value, (tuple, list)):
        return int(value[0]), int(value[1])
    major, _, minor = str(value).partition(".")
    return int(major), int(minor or 0)


@lru_cache(maxsize=1)
def _data() -> dict:
    return _read_yaml("gpus.yaml")


@lru_cache(maxsize=1)
def architectures() -> tuple[Architecture, ...]:
    archs = [
        Architecture(
            name=a["name"], min_cc=parse_cc(a["min_cc"]), fp16_tensor_cores=a["fp16_tensor_cores"],
            bf16=a["bf16"], tf32=a["tf32"], fp8=a["fp8"],
        )
        for a in _data()["architectures"]
    ]
    return tuple(sorted(archs, key=lambda a: a.min_cc))


@lru_cache(maxsize=1)
def gpu_models() -> tuple[GpuModel, ...]:
    return tuple(
        GpuModel(
            name=g["name"], match=tuple(g["match"]), cc=parse_cc(g["cc"]), memory_gb=g["memory_gb"],
            peak_tflops=dict(g["peak_tflops"]), approximate=bool(g.get("approximate", False)),
        )
        for g in _data()["gpus"]
    )


def architecture_for(cc) -> Architecture:
    """The newest architecture whose first compute capability is <= cc."""
    cc = parse_cc(cc)
    found = architectures()[0]
    for arch in architectures():
        if arch.min_cc <= cc:
            found = arch
    return found


def normalise_name(name: str) -> str:
    """'NVIDIA_A100-SXM4-40GB' -> 'nvidia a100 sxm4 40gb': the form every name table matches
    ('RTX 3090Ti' -> 'rtx 3090 ti': suffixes written without a space)."""
    text = re.sub(r"[-_/,;]", " ", str(name).lower())
    text = re.sub(r"(\d)(ti|super|laptop)\b", r"\1 \2", text)
    return " ".join(text.split())


def _word(pattern: str) -> re.Pattern:
    """A table's match string as a whole-word regex: 'l4' finds 'nvidia l4', not 'l40s'."""
    return re.compile(r"(?<![a-z0-9])" + re.escape(pattern.strip()) + r"(?![a-z0-9])")


def find_gpu(name: str) -> GpuModel | None:
    """Match a device name ('NVIDIA H100 80GB HBM3', 'rtx 4090', 'T4') to a GPU with peak figures."""
    needle = normalise_name(name)
    for gpu in gpu_models():
        if any(_word(m).search(needle) for m in gpu.match) or needle == gpu.name.lower():
            return gpu
    return None


def peak_tflops(device_name: str, precision: str) -> float | None:
    """Dense peak TFLOP/s for a precision (fp32/tf32/fp16/bf16/fp8), None when unknown."""
    gpu = find_gpu(device_name)
    if gpu is None:
        return None
    return gpu.peak_tflops.get(precision)


# --- any GPU name, from any vendor -------------------------------------------------------------

@dataclass(frozen=True)
class ResolvedGpu:
    """What a GPU name (or a compute capability) says about mixed precision on that device.

    `resolve_gpu` never refuses a name: what cannot be known is assumed conservatively and
    said in `warnings`, so the questionnaire answers every user instead of exiting.
    """
    name: str            # the product as we understood it ("RTX 3080", "Instinct MI300X")
    vendor: str          # nvidia | amd | apple | intel | unknown
    backend: str         # the torch device type a script uses: cuda (also ROCm) | mps | xpu
    arch: str            # Ampere, Ada, CDNA3, Apple silicon, ... ("" when unknown)
    cc: tuple[int, int] | None
    bf16: bool           # native bf16 (tensor/matrix cores or equivalent)
    fp16_fast: bool      # fp16 runs faster than fp32 (tensor cores or a 2x fp16 rate)
    tensor_cores: bool
    tf32: bool
    fp8: bool
    memory_gb: float | None
    memory_from_name: bool = False   # the size was in the name the user gave
    known: bool = True               # found in a table (False: inferred)
    note: str = ""                   # what autocast does on this vendor's backend
    warnings: tuple[str, ...] = field(default_factory=tuple)
    model: GpuModel | None = None    # the gpus.yaml entry (peak TFLOP/s) when there is one
    memory_sizes_gb: tuple[float, ...] = ()  # a bare 'A100': the sizes it was sold with (memory_gb assumed)
    supported: bool = True           # False: not a GPU this tool advises on (Gaudi, TPU, an NPU)

    def to_dict(self) -> dict:
        return {"name": self.name, "vendor": self.vendor, "backend": self.backend, "architecture": self.arch,
                "compute_capability": f"{self.cc[0]}.{self.cc[1]}" if self.cc else None,
                "bf16": self.bf16, "fp16_fast": self.fp16_fast, "tensor_cores": self.tensor_cores,
                "tf32": self.tf32, "fp8": self.fp8, "memory_gb": self.memory_gb,
                "memory_from_name": self.memory_from_name, "memory_sizes_gb": list(self.memory_sizes_gb),
                "known": self.known, "note": self.note, "supported": self.supported,
                "warnings": list(self.warnings)}


# Compute capabilities whose CUDA cores run fp16 at twice the fp32 rate without tensor cores
# (P100, Jetson TX1/Nano, TX2); GeForce Pascal (6.1) runs it at 1/64.
_FAST_FP16_WITHOUT_TENSOR_CORES = {(5, 3), (6, 0), (6, 2)}
# 'sm_86', 'sm_90a' / 'sm_100f' (architecture- and family-specific targets of the same capability), 'compute_90'.
_CC_IN_TEXT = re.compile(r"(?:\b(?:sm|compute)[ _]?(\d{1,2})(\d)[af]?\b|\b(?:cc|compute capability|capability)[ :=]*(\d{1,2})\.(\d)\b"
                         r"|^\s*(\d{1,2})\.(\d)\s*$)", re.IGNORECASE)
_MEMORY_IN_TEXT = re.compile(r"(?<![\w.])(\d{1,4}(?:\.\d+)?)\s*-?\s*(?:gb|gib|g)(?![a-z0-9])", re.IGNORECASE)
_ROCM_GFX = re.compile(r"\bgfx\s*(\d{1,2})\.(\d)\b", re.IGNORECASE)


@lru_cache(maxsize=1)
def _products() -> dict:
    data = _read_yaml("gpu_products.yaml")
    for group in ("nvidia", "other", "accelerators"):
        for entry in data[group]:
            entry["_regex"] = re.compile(entry["match"])
    return data


def cc_from_text(text: str) -> tuple[int, int] | None:
    """A compute capability written in the text: 'sm_86', 'sm86', 'cc 8.6', 'compute capability 8.6', '8.6'."""
    m = _CC_IN_TEXT.search(str(text))
    if not m:
        return None
    major, minor = next((m.group(i), m.group(i + 1)) for i in (1, 3, 5) if m.group(i))
    return int(major), int(minor)


def memory_from_text(text: str) -> float | None:
    """A memory size written in the name ('A100-SXM4-40GB', 'V100 16GB', '(sm_86, 10 GB)')."""
    sizes = [float(m.group(1)) for m in _MEMORY_IN_TEXT.finditer(str(text))]
    sizes = [s for s in sizes if 1 <= s <= 1024]
    return sizes[0] if sizes else None


def _nvidia(name: str, cc: tuple[int, int], memory, memory_from_name: bool, *, known: bool,
            tensor_cores: bool | None = None, warnings=(), model: GpuModel | None = None) -> ResolvedGpu:
    arch = architecture_for(cc)
    tc = arch.fp16_tensor_cores if tensor_cores is None else tensor_cores
    fp16_fast = arch.fp16_tensor_cores or cc in _FAST_FP16_WITHOUT_TENSOR_CORES or cc == (7, 5)
    if model is not None and not arch.fp16_tensor_cores:
        fp16_fast = model.peak_tflops.get("fp16", 0) >= 2 * model.peak_tflops.get("fp32", float("inf"))
    return ResolvedGpu(name, "nvidia", "cuda", arch.name, cc, arch.bf16, fp16_fast, tc, arch.tf32, arch.fp8,
                       memory, memory_from_name, known, "", tuple(warnings), model)


def _other(name: str, arch_name: str, memory, memory_from_name: bool, *, known: bool, warnings=()) -> ResolvedGpu:
    facts = _products()["other_architectures"][arch_name]
    return ResolvedGpu(name, facts["vendor"], facts["backend"], arch_name, None, facts["bf16"], facts["fp16_fast"],
                       facts.get("matrix_cores", True), False, facts["fp8"], memory, memory_from_name, known,
                       facts["note"], tuple(warnings))


def _vendor_hint(text: str) -> str:
    if re.search(r"\b(amd|radeon|instinct|rocm|hip|gfx\d)", text):
        return "amd"
    if re.search(r"\b(apple|mps|metal|m[1-9])\b", text):
        return "apple"
    if re.search(r"\b(intel|xpu|arc|iris|xe)\b", text):
        return "intel"
    if re.search(r"\b(nvidia|geforce|quadro|tesla|rtx|gtx|titan|cuda|jetson)\b", text):
        return "nvidia"
    return "unknown"


def _device_note(entry: dict, raw: str) -> tuple[str, ...]:
    return (f"{raw}: {entry['device_note']}",) if entry.get("device_note") else ()


# Words that name the kind of device, not a product: the answer cannot be known from them.
# A pattern string, compiled on first use (re caches it): compiling it costs ~10 ms, which every
# `lint` run paid for importing this module's constants.
_GENERIC = r"^(?:an? )?(?:nvidia |amd )?(?:cuda|gpu|cuda gpu|nvidia gpu|nvidia|graphics card|rocm|cuda \d+)$"


def _accelerator(raw: str, norm: str) -> ResolvedGpu | None:
    """A device that is not a GPU (Gaudi, TPU, Trainium, an NPU): said so, never guessed as a GPU."""
    entry = next((e for e in _products()["accelerators"] if e["_regex"].search(norm)), None)
    if entry is None:
        return None
    return ResolvedGpu(raw, entry["vendor"], entry["backend"], entry["name"], None, False, False, False, False, False,
                       None, False, True, entry["note"], (
                           f"{raw!r} is a {entry['name']}, not a GPU: {entry['note']}. This tool's mixed-precision "
                           "advice covers NVIDIA (CUDA), AMD (ROCm), Apple (MPS) and Intel (XPU) GPUs and CPUs",),
                       supported=False)


def resolve_gpu(text: str) -> ResolvedGpu:
    """Any GPU name, compute capability or detected-device string -> its mixed-precision facts.

    Order of evidence: a compute capability written in the text (what `gpu_answer_from_device`
    passes for a detected GPU) beats the product tables, which beat inference from the vendor.
    A memory size in the text beats the product's usual size. Accelerators that are not GPUs come
    back with supported=False. Never raises for a non-empty text.
    """
    raw = str(text).strip()
    norm = normalise_name(raw)
    other_accelerator = _accelerator(raw, norm)
    if other_accelerator is not None:
        return other_accelerator
    if re.match(_GENERIC, norm.replace(":", " ").strip(" 0123456789") or norm):
        return ResolvedGpu(raw or "GPU", "nvidia" if "amd" not in norm and "rocm" not in norm else "amd", "cuda", "",
                           None, False, True, True, False, False, None, False, False, "", (
                               f"{raw!r} names the kind of device, not the GPU model: assumed a CUDA GPU with fp16 "
                               "tensor cores but no bf16 (every NVIDIA GPU since Volta runs that correctly). Give the "
                               "model as `nvidia-smi --query-gpu=name,compute_cap --format=csv` prints it (or its "
                               "compute capability, e.g. 'sm_86'), or answer 'detect' on that machine",))
    memory = memory_from_text(raw)
    from_name = memory is not None
    vendor = _vendor_hint(norm)
    products = _products()
    if vendor in ("amd", "apple", "intel") or any(e["_regex"].search(norm) for e in products["other"]):
        gfx = _ROCM_GFX.search(raw)
        for entry in products["other"]:
            if entry["_regex"].search(norm):
                return _other(entry["name"] if len(norm) < 4 else raw, entry["arch"],
                              memory if from_name else entry.get("memory_gb"), from_name, known=True,
                              warnings=_device_note(entry, raw))
        if vendor == "amd" and gfx:
            major, minor = int(gfx.group(1)), int(gfx.group(2))
            arch = {(9, 5): "CDNA4", (9, 4): "CDNA3", (9, 0): "CDNA2", (11, 0): "RDNA3", (11, 5): "RDNA3",
                    (12, 0): "RDNA4", (10, 3): "RDNA2"}.get((major, minor))
            if arch:
                return _other(raw, arch, memory, from_name, known=True)
        guess = {"amd": "CDNA3" if re.search(r"\binstinct\b|\bmi\d", norm) else "RDNA3", "apple": "Apple silicon",
                 "intel": "Xe-HPG"}.get(vendor)
        if guess:
            return _other(raw, guess, memory, from_name, known=False, warnings=(
                f"{raw!r} is not in our {vendor.upper() if vendor == 'amd' else vendor.title()} table: assumed a "
                f"recent {guess} part; `python -m troubleshooter capability` on that machine tells for sure",))
    cc = cc_from_text(raw) if vendor in ("nvidia", "unknown") else None
    model = find_gpu(raw) if len(norm) >= 2 else None
    product = next((e for e in products["nvidia"] if e["_regex"].search(norm)), None)
    if cc is not None:
        label = (model.name if model else product["name"] if product else f"sm_{cc[0]}{cc[1]} GPU")
        table_cc = parse_cc(model.cc) if model else (parse_cc(product["cc"]) if product else None)
        warn = ()
        if table_cc is not None and table_cc != cc:
            warn = (f"{raw!r}: the name says compute capability {table_cc[0]}.{table_cc[1]} but {cc[0]}.{cc[1]} "
                    f"was given; used {cc[0]}.{cc[1]}",)
            label, model = f"sm_{cc[0]}{cc[1]} GPU", None
        usual = (model.memory_gb if model else product.get("memory_gb") if product else None)
        return _nvidia(label, cc, memory if from_name else usual, from_name, known=True,
                       tensor_cores=product.get("tensor_cores") if product else None, warnings=warn, model=model)
    size_warning = ()
    if product is not None and from_name and memory > product.get("max_gpu_memory_gb", float("inf")):
        # A size larger than any of the product's GPUs holds names the system memory (GH200 480GB).
        size_warning = (f"{raw!r}: {memory:g} GB is more than any {product['name']} GPU holds (it is the "
                        f"system memory); used the GPU's {product.get('memory_gb')} GB",)
        memory, from_name = None, False
    if product is not None:
        cc = parse_cc(product["cc"])
        if model is not None and parse_cc(model.cc) != cc:
            model = None
        # A product variant the model table lumps with its base chip (H100 NVL vs H100) keeps its own size.
        variant = model is not None and product["name"] != model.name and product.get("memory_gb") is not None
        usual = product.get("memory_gb") if variant or model is None else model.memory_gb
        gpu = _nvidia(product["name"] if variant or model is None else model.name, cc,
                      memory if from_name else usual, from_name, known=True,
                      tensor_cores=product.get("tensor_cores"), warnings=size_warning, model=model)
        sizes = tuple(product.get("memory_variants_gb") or ())
        gpu = replace(gpu, warnings=gpu.warnings + _device_note(product, raw))
        return gpu if from_name or len(sizes) < 2 else replace(gpu, memory_sizes_gb=sizes)
    if model is not None:
        return _nvidia(model.name, parse_cc(model.cc), memory if from_name else model.memory_gb, from_name,
                       known=True, model=model)
    # Nothing known: a CUDA GPU of unknown generation. fp16 with GradScaler runs correctly on every
    # CUDA GPU (bf16 fails before Ampere), so the inference is Volta-class, said in a warning.
    return ResolvedGpu(raw or "unknown GPU", vendor if vendor != "unknown" else "unknown", "cuda", "", None,
                       False, True, True, False, False, memory, from_name, False, "", (
                           f"unknown GPU {raw!r}: assumed a CUDA GPU with fp16 tensor cores but no bf16 (what every "
                           "NVIDIA GPU since Volta runs correctly). Give its compute capability (e.g. 'sm_86' or "
                           "'8.6', from `nvidia-smi --query-gpu=compute_cap --format=csv`) or run "
                           "`python -m troubleshooter capability` there for an exact answer",))


def gpu_answer_text(name: str, capability: tuple[int, int] | None, memory_gb: float | None,
                    vendor: str = "nvidia") -> str:
    """The answer string for a detected device: 'NVIDIA GeForce RTX 3080 (sm_86, 10 GB)'.

    `resolve_gpu` reads the capability and memory back from it, so the detected device decides,
    not whether our tables know its name. On ROCm torch reports the gfx version as the capability.
    """
    vendor = (vendor or "nvidia").strip().lower()
    parts = []
    if capability is not None:
        major, minor = int(capability[0]), int(capability[1])
        parts.append(f"sm_{major}{minor}" if vendor == "nvidia" else
                     f"ROCm gfx {major}.{minor}" if vendor in ("amd", "rocm", "hip") else "")
    elif vendor in ("apple", "mps"):
        parts.append("MPS")
    elif vendor in ("intel", "xpu"):
        parts.append("XPU")
    elif vendor in ("amd", "rocm", "hip"):
        parts.append("ROCm")
    if memory_gb:
        parts.append(f"{float(memory_gb):.0f} GB" if float(memory_gb) >= 10 else f"{float(memory_gb):.1f} GB")
    label = " ".join(str(name or "").replace("(", " ").replace(")", " ").split()) or f"{vendor} GPU"
    if vendor in ("amd", "rocm", "hip") and "amd" not in label.lower():
        label = "AMD " + label
    parts = [p for p in parts if p]
    return label + (f" ({', '.join(parts)})" if parts else "")
