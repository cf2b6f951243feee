"""The suite's sections, in the order they run: what matters most for the GPU figures first,
torch.compile last (its compile time is the largest and least predictable cost)."""
from __future__ import annotations

from . import app, capability, checks, speed, trace, training
from .runner import Section


def run_env(ctx, res) -> None:
    """The machine, as the header of every table; nvidia-smi's own answers kept for capability."""
    env = ctx.environment
    res.data.update(nvidia_smi=env.get("nvidia_smi"))
    res.table("Environment", ["GPU", "driver", "CUDA runtime", "CUDA (driver)", "torch", "Python", "date"],
              [[", ".join(g["name"] for g in env.get("gpus", [])) or "none", env.get("driver"), env.get("cuda_runtime"),
                env.get("cuda_driver"), env.get("torch"), env.get("python"), env.get("date")]])
    if ctx.device.startswith("cuda"):
        import torch

        with res.step("CUDA context"):  # its start-up cost is not charged to the first measurement
            torch.zeros(1, device=ctx.device).add_(1).item()


SECTIONS = (
    Section("env", "Environment", run_env, 5, "GPU model, driver, CUDA, torch, date (always runs)"),
    Section("capability", "Capability vs nvidia-smi, torch and measurement", capability.run, 20,
            "capability text/JSON against nvidia-smi, torch's answers, matmul rates and an fp8 product"),
    Section("matmul", "bf16 matmul ceiling", speed.run_matmul, 15,
            "bf16 matmul TFLOP/s at three sizes, fp16/tf32/fp32 beside it"),
    Section("speedup", "Speedup check, eager", speed.run_speedup, 100,
            "speedup on GPT-2 small and cnn, twice each; verdict vs torch.utils.benchmark; "
            "the default speedup in a fresh process"),
    Section("check", "check on the GPU vs the CPU", checks.run, 100,
            "check on GPT-2 small, cnn, vit and the overflow/underflow fixtures, findings vs the CPU; "
            "the page's default check in a fresh process"),
    Section("recipe", "Recipe throughput", training.run_recipe, 60,
            "generated fp32/bf16/fp16 loops on GPT-2 small: tokens/s, vs fp32, MFU"),
    Section("nan_overhead", "NaN hunt overhead", training.run_nan_overhead, 35,
            "nanhunt vs plain vs detect_anomaly on GPT-2 small and the small CNN"),
    Section("profile", "Where a bf16 step's time goes", speed.run_profile, 20,
            "torch.profiler on GPT-2 small's bf16 training step: top ops, kernel time vs wall time"),
    Section("trace", "trace on the GPU", trace.run, 45, "trace on generated recipes and nanoGPT's train.py",
            alone=True),
    Section("app", "The app through gradio_client", app.run, 60,
            "a check and two queued speedups through the API (needs gradio)", waits=True),
    Section("speedup_compile", "Speedup check with torch.compile", speed.run_speedup_compiled, 180,
            "speedup --compile on GPT-2 small and cnn (fp32, bf16), twice each"),
    Section("recipe_compile", "Recipe throughput with torch.compile", training.run_recipe_compiled, 90,
            "the generated bf16 loop compiled: tokens/s and MFU"),
)
NAMES = tuple(s.name for s in SECTIONS)


def select(only: list[str] | None, skip: list[str] | None) -> list[Section]:
    """The sections to run (env always), in suite order; unknown names raise ValueError."""
    unknown = sorted((set(only or []) | set(skip or [])) - set(NAMES))
    if unknown:
        raise ValueError(f"unknown section(s) {', '.join(unknown)}: choose from {', '.join(NAMES)}")
    chosen = [s for s in SECTIONS if (not only or s.name in only or s.name == "env") and s.name not in (skip or [])]
    return chosen if chosen and chosen[0].name == "env" else [SECTIONS[0], *chosen]
