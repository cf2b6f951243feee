"""What this device can do in each precision, and which precision to train in.

`detect()` reads the host (CUDA, MPS or CPU) into a plain *profile* dict; `report_from_profile()`
turns a profile into the report. Keeping the decision a pure function of the profile lets tests
describe a V100, an H100 or a CPU with AMX without having one. Architecture facts (which
tensor-core dtypes a compute capability has, peak TFLOP/s) come from `data/gpus.yaml`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .. import hardware
from ..findings import Finding, Location, Severity
from . import cpu_features

AMP207 = ("AMP207", "bf16-unsupported")
AMP208 = ("AMP208", "no-fast-half-precision")


@dataclass
class CapabilityReport:
    device: str  # "cuda:0", "cpu", "mps"
    kind: str  # cuda | cpu | mps
    name: str
    recommended_precision: str  # bf16 | fp16 | fp32
    reason: str
    facts: dict[str, Any] = field(default_factory=dict)  # everything measured / looked up
    notes: list[str] = field(default_factory=list)  # advice that is not a problem (TF32 off, ...)
    findings: list[Finding] = field(default_factory=list)

    @property
    def bf16_native(self) -> bool:
        return bool(self.facts.get("bf16", {}).get("native"))

    @property
    def fp16_fast(self) -> bool:
        return bool(self.facts.get("fp16", {}).get("fast"))

    def findings_for(self, precision: str) -> list[Finding]:
        """The findings, raised to warnings when the user means to train in the unsupported dtype."""
        out = []
        for f in self.findings:
            wanted = (f.rule == AMP207[0] and precision == "bf16") or (f.rule == AMP208[0] and precision == "fp16")
            if wanted and f.severity is Severity.INFO:
                f = Finding(f.rule, f.name, Severity.WARNING, f.message, f.suggestion, f.location,
                            f.precision, f.data)
            out.append(f)
        return out

    def summary_line(self) -> str:
        def mark(ok):
            return "✓" if ok else ("?" if ok is None else "✗")

        if self.kind == "cuda":
            cc = self.facts.get("compute_capability", "")
            sm = "sm_" + cc.replace(".", "") if cc else "sm_?"
            tc = self.facts.get("tensor_cores", {})
            return (f"{self.name} · {sm} · bf16 {mark(self.bf16_native)} fp16 {mark(self.fp16_fast)} "
                    f"tf32 {mark(tc.get('tf32'))}")
        if self.kind == "mps":
            return f"{self.name} · fp16 {mark(self.fp16_fast)} bf16 {mark(self.bf16_native)}"
        flags = self.facts.get("cpu", {}).get("flags", {})
        return f"CPU (no GPU) · avx512_bf16 {mark(flags.get('avx512_bf16'))} amx_bf16 {mark(flags.get('amx_bf16'))}"

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "kind": self.kind, "name": self.name, **self.facts,
                "recommended_precision": self.recommended_precision, "reason": self.reason,
                "notes": list(self.notes), "summary": self.summary_line(),
                "findings": [f.to_dict() for f in self.findings]}

    def to_text(self) -> str:
        f = self.facts
        lines = [self.summary_line(), ""]

        def row(label, value):
            if value is not None and value != {} and value != []:
                lines.append(f"  {label:<26}{value}")

        row("device", f"{self.device} ({self.name})")
        if self.kind == "cuda":
            row("compute capability", f"{f.get('compute_capability')} ({f.get('architecture')})")
            if f.get("memory_gb") is not None:
                row("memory", f"{f['memory_gb']:.1f} GiB")
            row("tensor-core dtypes", ", ".join(f.get("tensor_core_dtypes", [])) or "none")
            bf = f.get("bf16", {})
            row("bf16", "native" if bf.get("native") else
                ("emulated only (is_bf16_supported() counts emulation)" if bf.get("emulated") else "no"))
            tf = f.get("tf32_settings", {})
            row("TF32 now", f"matmul={tf.get('matmul_allow_tf32')} cudnn={tf.get('cudnn_allow_tf32')} "
                            f"float32_matmul_precision={tf.get('float32_matmul_precision')!r}")
            peak = f.get("peak_tflops") or {}
            if peak:
                row("peak TFLOP/s (dense)", ", ".join(f"{k} {v:g}" for k, v in peak.items())
                    + (" (approximate)" if f.get("peak_tflops_approximate") else ""))
        row("torch", f.get("torch_version"))
        row("CUDA runtime", f.get("cuda_version"))
        cpu = f.get("cpu") or {}
        if cpu:
            if self.kind != "cpu":
                row("CPU", cpu.get("model"))
            flags = cpu.get("flags") or {}
            if flags:
                row("CPU features", " ".join(f"{k} {'✓' if v else ('?' if v is None else '✗')}"
                                             for k, v in flags.items()))
            row("torch CPU kernels", cpu.get("torch_capability"))
        if f.get("mps_available") is not None and self.kind != "cuda":
            row("MPS (Apple GPU)", "available" if f["mps_available"] else "not available")
        lines += ["", f"Recommended precision: {self.recommended_precision}", f"  {self.reason}"]
        for note in self.notes:
            lines.append(f"  note: {note}")
        for finding in self.findings:
            lines.append(f"  {finding.text_line()}")
        return "\n".join(lines) + "\n"


# --- the decision, from a profile ------------------------------------------------------------------

def _finding(rule: tuple[str, str], severity: Severity, message: str, suggestion: str, precision: str,
             device: str, **data) -> Finding:
    return Finding(rule[0], rule[1], severity, message, suggestion, Location(module=None, path=None),
                   precision=precision, data={"device": device, **data})


def _cuda_report(p: dict) -> CapabilityReport:
    device = p.get("device", "cuda:0")
    name = p.get("name") or "CUDA GPU"
    cc = hardware.parse_cc(p["compute_capability"])
    cc_text = f"{cc[0]}.{cc[1]}"
    arch = hardware.architecture_for(cc)
    gpu = hardware.find_gpu(name)
    tc = {"fp16": arch.fp16_tensor_cores, "bf16": arch.bf16, "tf32": arch.tf32, "fp8": arch.fp8}
    # Native bf16: the compute capability decides; torch's including_emulation=False answer agrees
    # when present. The default is_bf16_supported() also counts emulation (True on a V100).
    native = arch.bf16 if p.get("bf16_supported_native") is None else bool(p["bf16_supported_native"]) and arch.bf16
    emulated = p.get("bf16_supported_default")
    memory = p.get("memory_bytes")
    facts = {
        "compute_capability": cc_text, "architecture": arch.name,
        "gpu_model": gpu.name if gpu else None,
        "memory_gb": memory / 1024 ** 3 if memory else (gpu.memory_gb if gpu else None),
        "multiprocessors": p.get("multiprocessors"),
        "tensor_cores": tc, "tensor_core_dtypes": [k for k, v in tc.items() if v],
        "bf16": {"native": native, "emulated": bool(emulated) and not native if emulated is not None else None,
                 "is_bf16_supported_default": emulated},
        "fp16": {"fast": arch.fp16_tensor_cores},
        "tf32_settings": dict(p.get("tf32") or {}),
        "peak_tflops": dict(gpu.peak_tflops) if gpu else {},
        "peak_tflops_approximate": gpu.approximate if gpu else None,
        "torch_version": p.get("torch_version"), "cuda_version": p.get("cuda_version"),
        "cudnn_version": p.get("cudnn_version"), "gpu_count": p.get("gpu_count"),
    }
    findings, notes = [], []
    if native:
        precision = "bf16"
        reason = (f"{arch.name} (sm_{cc[0]}{cc[1]}) has bf16 tensor cores: bf16 autocast runs at fp16 speed "
                  "with float32's exponent range, so no GradScaler and no overflow or underflow to manage.")
    elif arch.fp16_tensor_cores:
        precision = "fp16"
        reason = (f"{arch.name} (sm_{cc[0]}{cc[1]}) has fp16 tensor cores but no native bf16: use fp16 autocast "
                  "with a GradScaler (dynamic loss scaling) for the speed-up.")
        findings.append(_finding(
            AMP207, Severity.INFO,
            f"{name} (sm_{cc[0]}{cc[1]}, {arch.name}) has no native bfloat16: bf16 autocast would be emulated "
            "and slower than fp32" + (" even though torch.cuda.is_bf16_supported() says True (it counts "
                                      "emulation)" if emulated else ""),
            "train in fp16 with torch.amp.GradScaler, or use an Ampere or newer GPU (sm_80+) for bf16",
            "bf16", device, compute_capability=cc_text))
    else:
        peak = gpu.peak_tflops if gpu else {}
        fast_fp16 = bool(peak.get("fp16") and peak.get("fp32") and peak["fp16"] >= 1.5 * peak["fp32"])
        findings.append(_finding(
            AMP207, Severity.INFO, f"{name} (sm_{cc[0]}{cc[1]}) has no native bfloat16",
            "use fp16 or fp32 here, or a GPU of sm_80 or newer for bf16", "bf16", device,
            compute_capability=cc_text))
        if fast_fp16:
            precision = "fp16"
            reason = (f"{name} has no tensor cores but runs fp16 at {peak['fp16'] / peak['fp32']:.0f}x its fp32 "
                      "rate: fp16 autocast with a GradScaler gives a modest speed-up and halves activation memory.")
            findings.append(_finding(
                AMP208, Severity.INFO,
                f"{name} (sm_{cc[0]}{cc[1]}, {arch.name}) has no tensor cores: fp16 is at most "
                f"{peak['fp16'] / peak['fp32']:.0f}x faster than fp32, far from the 8-16x of tensor-core GPUs",
                "expect a modest speed-up; measure it with `python -m troubleshooter speedup`",
                "fp16", device, compute_capability=cc_text))
        else:
            precision = "fp32"
            reason = (f"{arch.name} (sm_{cc[0]}{cc[1]}) has no tensor cores: fp16 and bf16 bring no speed "
                      "here, only memory savings; stay in fp32 unless memory is the limit.")
            findings.append(_finding(
                AMP208, Severity.WARNING,
                f"{name} (sm_{cc[0]}{cc[1]}, {arch.name}) has no tensor cores"
                + (" and slow fp16 arithmetic" if peak.get("fp16") else "")
                + ": mixed precision will not speed up training here",
                "stay in fp32 (use fp16 autocast only to save memory), or use a Volta or newer GPU (sm_70+)",
                "fp16", device, compute_capability=cc_text))
    tf = facts["tf32_settings"]
    if arch.tf32 and tf and not tf.get("matmul_allow_tf32") and tf.get("float32_matmul_precision") == "highest":
        notes.append("TF32 is off for fp32 matmuls (PyTorch's default); torch.backends.cuda.matmul.allow_tf32 "
                     "= True or torch.set_float32_matmul_precision('high') speeds up the fp32 parts for free "
                     "in most training")
    if emulated and not native:
        notes.append("torch.cuda.is_bf16_supported() returns True here because it counts emulation; "
                     "is_bf16_supported(including_emulation=False) is the honest test")
    if arch.fp8:
        notes.append(f"{arch.name} also has fp8 tensor cores (Transformer Engine / torchao), beyond torch.autocast")
    if gpu is None:
        notes.append(f"{name!r} is not in the GPU table: peak TFLOP/s unknown; architecture taken from sm_{cc[0]}{cc[1]}")
    return CapabilityReport(device, "cuda", name, precision, reason, facts, notes, findings)


def _cpu_facts(p: dict) -> dict:
    cpu = dict(p.get("cpu") or {})
    flags = dict(cpu.get("flags") or {})
    cpu["flags"] = {k: flags.get(k) for k in cpu_features.FLAGS}
    return cpu


def _cpu_report(p: dict) -> CapabilityReport:
    device = "cpu"
    cpu = _cpu_facts(p)
    flags = cpu["flags"]
    bf16 = any(flags.get(f) for f in cpu_features.BF16_FLAGS)
    fp16 = any(flags.get(f) for f in cpu_features.FP16_FLAGS)
    unknown = all(v is None for v in flags.values())
    facts = {"cpu": cpu, "bf16": {"native": bf16}, "fp16": {"fast": fp16},
             "mps_available": p.get("mps_available"), "torch_version": p.get("torch_version"),
             "cuda_version": p.get("cuda_version"), "gpu_count": p.get("gpu_count", 0)}
    findings, notes = [], []
    have = [f for f in (*cpu_features.BF16_FLAGS, *cpu_features.FP16_FLAGS) if flags.get(f)]
    if bf16:
        precision = "bf16"
        reason = (f"this CPU has native bf16 instructions ({', '.join(f for f in cpu_features.BF16_FLAGS if flags.get(f))}): "
                  "bf16 autocast speeds up matmuls and convolutions, with no loss scaling needed.")
    else:
        precision = "fp32"
        why = ("its instruction-set flags could not be read" if unknown else
               "it has neither avx512_bf16 nor AMX")
        reason = (f"this CPU has no native bf16 ({why}): bf16/fp16 autocast would be emulated by conversions "
                  "and usually runs slower than fp32. Train in fp32 here; mixed precision pays off on a GPU.")
        findings.append(_finding(
            AMP207, Severity.INFO, f"this CPU has no native bfloat16 ({why})",
            "train in fp32 on this CPU, or use a CPU with AMX / avx512_bf16 (e.g. Xeon Sapphire Rapids) "
            "or an Ampere+ GPU for bf16", "bf16", device))
    if not fp16:
        findings.append(_finding(
            AMP208, Severity.INFO, "this CPU has no fast float16 arithmetic (no avx512_fp16 / amx_fp16)",
            "fp16 on CPU saves memory only; for fp16 speed use a GPU with tensor cores (sm_70+)",
            "fp16", device))
    if have:
        notes.append("native half-precision instructions: " + ", ".join(have))
    if p.get("mps_available"):
        notes.append("an Apple GPU (MPS) is available: run with --device mps to use it")
    name = cpu.get("model") or "CPU"
    return CapabilityReport(device, "cpu", name, precision, reason, facts, notes, findings)


def _mps_report(p: dict) -> CapabilityReport:
    bf16 = bool(p.get("mps_bf16"))
    facts = {"bf16": {"native": bf16}, "fp16": {"fast": True}, "mps_available": True,
             "torch_version": p.get("torch_version"), "cpu": _cpu_facts(p)}
    findings = []
    if not bf16:
        findings.append(_finding(AMP207, Severity.INFO, "bfloat16 is not supported by MPS on this macOS / torch",
                                 "use fp16 autocast on MPS (macOS 14+ adds bf16)", "bf16", "mps"))
    reason = ("Apple GPUs run float16 natively: fp16 autocast saves memory and time; keep a GradScaler, "
              "as on CUDA, so small gradients do not underflow.")
    return CapabilityReport("mps", "mps", p.get("name") or "Apple GPU (MPS)", "fp16", reason, facts, [], findings)


def report_from_profile(profile: dict) -> CapabilityReport:
    """The report for a described device: {"device": "cuda:0"|"cpu"|"mps", ...} (see `detect`)."""
    kind = str(profile.get("device", "cpu")).split(":")[0]
    if kind == "cuda":
        return _cuda_report(profile)
    if kind == "mps":
        return _mps_report(profile)
    return _cpu_report(profile)


# --- reading the host ---------------------------------------------------------------------------

def _tf32_settings() -> dict:
    from .precision import tf32_settings

    return tf32_settings()


def host_profile(device: str = "auto", cpuinfo_text: str | None = None) -> dict:
    """Read the chosen device of this host into a profile dict."""
    import torch

    from .precision import resolve_device

    dev = resolve_device(device)
    cpu = cpu_features.cpu_features(cpuinfo_text)
    cpu["torch_capability"] = cpu_features.torch_cpu_capability()
    mps = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    profile: dict[str, Any] = {
        "device": str(dev), "torch_version": str(torch.__version__), "cuda_version": torch.version.cuda,
        "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "mps_available": mps, "cpu": cpu, "tf32": _tf32_settings(),
    }
    if dev.type == "cuda":
        index = dev.index or 0
        props = torch.cuda.get_device_properties(index)
        profile.update({
            "device": f"cuda:{index}", "name": props.name,
            "compute_capability": [props.major, props.minor], "memory_bytes": props.total_memory,
            "multiprocessors": props.multi_processor_count,
            "cudnn_version": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        })
        with torch.cuda.device(index):
            try:
                profile["bf16_supported_native"] = torch.cuda.is_bf16_supported(including_emulation=False)
            except TypeError:  # torch < 2.3 has no including_emulation: the compute capability decides
                profile["bf16_supported_native"] = None
            profile["bf16_supported_default"] = torch.cuda.is_bf16_supported()
    elif dev.type == "mps":
        try:
            torch.ones(1, dtype=torch.bfloat16, device="mps") * 2
            profile["mps_bf16"] = True
        except Exception:  # noqa: BLE001 - older macOS: no bf16 on MPS
            profile["mps_bf16"] = False
    return profile


def detect(device: str = "auto") -> CapabilityReport:
    """The capability report of this host's device ('auto' -> CUDA if present, else CPU)."""
    return report_from_profile(host_profile(device))
