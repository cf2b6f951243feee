"""Section `capability`: our capability report (text and JSON, through the command itself) held
against nvidia-smi, torch's own answers, and what the device measurably does.

A fact is only as good as its source: the name, compute capability and memory are compared
across three readers, and the architecture claims (native bf16, TF32 and fp8 tensor cores, fast
fp16) against measured matmul rates and an fp8 product, since torch's own `is_bf16_supported`
is just `major >= 8` (or counts emulation).
"""
from __future__ import annotations

import contextlib
import io
import json

MEMORY_TOLERANCE = 0.02  # nvidia-smi and torch read the same total; MiB rounding aside
FAST = 1.5  # a dtype with tensor cores: at least this much faster than strict fp32 in a large matmul


def cli_output(argv: list[str]) -> tuple[str, int]:
    """`python -m troubleshooter ARGV`, run in this process (the command's own code), printed text."""
    from troubleshooter.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(argv)
    return buf.getvalue(), code


def torch_answers(device: str) -> dict:
    """What torch itself says about the device."""
    import torch

    try:  # raises once the legacy and the per-backend TF32 switches were mixed (torch >= 2.9)
        global_precision = torch.get_float32_matmul_precision()
    except RuntimeError:
        global_precision = None
    out: dict = {"cuda_version": torch.version.cuda, "fp8_dtype": hasattr(torch, "float8_e4m3fn"),
                 "float32_matmul_precision": global_precision,
                 "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
                 "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    matmul = torch.backends.cuda.matmul
    out["matmul_fp32_precision"] = getattr(matmul, "fp32_precision", None)
    if not device.startswith("cuda"):
        return out
    index = torch.device(device).index or 0
    props = torch.cuda.get_device_properties(index)
    with torch.cuda.device(index):
        out.update(name=props.name, compute_capability=f"{props.major}.{props.minor}",
                   memory_gib=props.total_memory / 2**30, multiprocessors=props.multi_processor_count,
                   bf16_native=torch.cuda.is_bf16_supported(including_emulation=False),
                   bf16_with_emulation=torch.cuda.is_bf16_supported(),
                   tf32_supported=torch.cuda.is_tf32_supported() if hasattr(torch.cuda, "is_tf32_supported") else None)
    return out


def fp8_probe(device: str) -> dict:
    """Does an fp8 (e4m3) matrix product run here? (`torch._scaled_mm`, what fp8 training uses)."""
    import torch

    if not hasattr(torch, "float8_e4m3fn"):
        return {"runs": False, "why": "this torch has no float8 dtypes"}
    try:
        dev = torch.device(device)
        a = torch.randn(32, 32, device=dev).to(torch.float8_e4m3fn)
        b = torch.randn(32, 32, device=dev).to(torch.float8_e4m3fn).t()  # column-major, as cuBLASLt wants
        one = torch.tensor(1.0, device=dev)
        out = torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        return {"runs": bool(torch.isfinite(out.float()).all()), "why": None}
    except Exception as exc:  # noqa: BLE001 - the answer is "no", with the reason
        return {"runs": False, "why": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"}


def matmul_ratios(device: str, n: int, iters: int) -> dict:
    """Large-matmul TFLOP/s per dtype (fp32 strict, tf32, bf16, fp16) and each one's ratio to fp32."""
    from speedup_repeatability import matmul_rate

    rates = {p: matmul_rate(device, p, n, iters)["achieved_tflops"] for p in ("fp32", "tf32", "bf16", "fp16")}
    return {"n": n, "tflops": rates, "vs_fp32": {p: r / rates["fp32"] for p, r in rates.items()}}


def _same(values: list, tolerance: float | None = None) -> bool | None:
    """All the given (non-None) answers agree; None when fewer than two sources answered."""
    vals = [v for v in values if v is not None]
    if len(vals) < 2:
        return None
    if tolerance is not None:
        lo, hi = min(map(float, vals)), max(map(float, vals))
        return hi - lo <= tolerance * max(abs(hi), 1e-9)
    return len({str(v).strip().lower() for v in vals}) == 1


def compare_rows(ours: dict, smi: dict, torch_ans: dict, measured: dict, fp8: dict, cuda: bool) -> list[list]:
    """[fact, ours, nvidia-smi, torch, measured, agrees] rows. On a CPU only what applies there."""
    gpu = (smi.get("gpus") or [{}])[0] if smi.get("available") else {}
    smi_mem = float(gpu["memory.total"]) / 1024 if gpu.get("memory.total") else None
    ratio = measured.get("vs_fp32", {})
    tc = ours.get("tensor_cores") or {}

    def fast(p):  # the measured answer to "does this dtype have fast hardware here"
        return ratio[p] >= FAST if cuda and p in ratio else None

    rows = [  # fact, ours, nvidia-smi, torch, measured yes/no, the measured ratio behind it
        ["device name", ours.get("name"), gpu.get("name"), torch_ans.get("name"), None, None],
        ["compute capability", ours.get("compute_capability"), gpu.get("compute_cap"),
         torch_ans.get("compute_capability"), None, None],
        ["memory (GiB)", ours.get("memory_gb"), smi_mem, torch_ans.get("memory_gib"), None, None],
        ["GPU count", ours.get("gpu_count"), len(smi.get("gpus") or []) if smi.get("available") else None,
         torch_ans.get("gpu_count"), None, None],
        ["multiprocessors", ours.get("multiprocessors"), None, torch_ans.get("multiprocessors"), None, None],
        ["CUDA runtime", ours.get("cuda_version"), None, torch_ans.get("cuda_version"), None, None],
        ["native bf16", (ours.get("bf16") or {}).get("native"), None, torch_ans.get("bf16_native"),
         fast("bf16"), "bf16"],
        ["is_bf16_supported() (counts emulation)", (ours.get("bf16") or {}).get("is_bf16_supported_default"), None,
         torch_ans.get("bf16_with_emulation"), None, None],
        ["fast fp16", (ours.get("fp16") or {}).get("fast"), None, None, fast("fp16"), "fp16"],
        ["TF32 tensor cores", tc.get("tf32"), None, torch_ans.get("tf32_supported"), fast("tf32"), "tf32"],
        ["fp8 tensor cores (torch._scaled_mm runs)", tc.get("fp8"), None, None, fp8.get("runs") if cuda else None,
         None],
        ["TF32 on for fp32 matmuls now", (ours.get("tf32_settings") or {}).get("matmul_allow_tf32"), None,
         _tf32_now(torch_ans), None, None],
    ]
    out = []
    for fact, a, b, c, m, key in rows:
        agrees = _same([a, b, c, m], MEMORY_TOLERANCE if fact.startswith("memory") else None)
        shown = f"{'yes' if m else 'no'} ({ratio[key]:.1f}x fp32 in a matmul)" if key and m is not None else m
        out.append([fact, a, b, c, shown, agrees])
    return out


def _tf32_now(torch_ans: dict) -> bool | None:
    raw = torch_ans.get("matmul_fp32_precision")
    if raw in ("tf32", "ieee"):
        return raw == "tf32"
    return torch_ans.get("float32_matmul_precision") not in ("highest", None)


def run(ctx, res) -> None:
    import torch

    from .env import nvidia_smi

    device = ctx.device
    cuda = device.startswith("cuda")
    ours = text = None
    with res.step("capability command, text and JSON"):
        text, code = cli_output(["capability", "--device", device])
        raw, code_json = cli_output(["capability", "--device", device, "--format", "json"])
        if code_json not in (0, 1):  # 1: a warning found; anything else, the command failed
            raise RuntimeError(f"`capability --format json` exited {code_json}: {raw.strip()[-300:]}")
        ours = json.loads(raw)
        res.data.update(text=text, report=ours, exit_codes={"text": code, "json": code_json})
        if ours.get("summary", "").split(" · ")[0] not in text:
            raise AssertionError("the text and JSON reports name different devices")
    smi = ctx.data_of("env").get("nvidia_smi") or nvidia_smi()
    torch_ans, measured, fp8 = {}, {}, {}
    with res.step("torch's own answers"):
        torch_ans = torch_answers(device)
        res.data["torch"] = torch_ans
    with res.step("measured: matmul rates per dtype, an fp8 product"):
        n = ctx.sizes.matmul_sizes[len(ctx.sizes.matmul_sizes) // 2]
        measured = matmul_ratios(device, n, max(2, ctx.sizes.matmul_iters // 2))
        fp8 = fp8_probe(device)
        res.data.update(measured=measured, fp8=fp8)
        if cuda:
            torch.cuda.empty_cache()
    if ours is None:
        return
    with res.step("compare"):
        rows = compare_rows(ours, smi, torch_ans, measured, fp8, cuda)
        res.table("Capability: our report against nvidia-smi, torch and measurement",
                  ["fact", "ours", "nvidia-smi", "torch", "measured", "agree"], rows,
                  note=f"Our summary: {ours.get('summary')}; recommended precision: "
                       f"{ours.get('recommended_precision')}. Matmul rates at n = {measured.get('n')}: "
                       + ", ".join(f"{p} {v:.1f} TFLOP/s" for p, v in (measured.get("tflops") or {}).items()) + ".")
        disagree = [r[0] for r in rows if r[-1] is False]
        judged = [r for r in rows if r[-1] is not None]
        res.target("capability facts agree with nvidia-smi, torch and measurement", "every fact",
                   f"{len(judged) - len(disagree)} of {len(judged)} agree"
                   + (f"; differ: {', '.join(disagree)}" if disagree else ""), not disagree if judged else None)
