"""What each section measures on a GPU, and the tiny stand-ins of the CPU dry run.

One table per mode, so the dry run takes the very same code paths as the GPU run with only
the numbers changed (and fewer of the cases that take the same path: one preset check, one
compiled model, one traced recipe, two recipe precisions, two app checks), so that it stays quick
enough for the test suite. The GPU budgets are set so the whole suite should fit about 8 minutes on
one H100 (an estimate by reasoning until the first GPU run: see each section's estimate_s).
"""
from __future__ import annotations

from dataclasses import dataclass

GPT2 = "gpt:vocab_size=50257,d_model=768,n_layer=12,n_head=12,seq_len=1024,batch_size=16"  # GPT-2 small, 124M
# the same model on the CPU side of the check comparison: 1/64 of the tokens, or one CPU step takes ~10 s
GPT2_CPU_TWIN = "gpt:vocab_size=50257,d_model=768,n_layer=12,n_head=12,seq_len=128,batch_size=2"
TINY_GPT = "gpt:vocab_size=128,d_model=32,n_layer=1,n_head=2,seq_len=16,batch_size=2"
TINY_CNN = "cnn:width=8,stages=1,image_size=8,batch_size=4"
TINY_MLP = "mlp:hidden=32,depth=2,in_features=16,batch_size=8"
SMALL_CNN = "cnn:width=16,batch_size=16"  # bench/nan_overhead.py's CNN shape (BENCHMARKS, NaN-hunt overhead)
# the recipe's demo transformer: GPT-2 small (vocabulary padded to 64), and a toy for the dry run
RECIPE_GPT2 = {"VOCAB_SIZE": 50304, "SEQ_LEN": 1024, "N_EMBD": 768, "N_HEAD": 12, "N_LAYER": 12}
RECIPE_TINY = {"VOCAB_SIZE": 64, "SEQ_LEN": 16, "N_EMBD": 32, "N_HEAD": 2, "N_LAYER": 1}


@dataclass(frozen=True)
class CheckCase:
    label: str
    spec: str  # a preset string, or "fixture:overflow" / "fixture:underflow" (tests/fixtures/check)
    cpu_spec: str | None  # the CPU side of the comparison (None: the same spec)
    budget_s: float  # the check's own --budget on the device
    cpu_budget_s: float


@dataclass(frozen=True)
class Sizes:
    check_cases: tuple[CheckCase, ...]
    check_steps: int
    speedup_models: tuple[tuple[str, str, float], ...]  # (label, preset, budget per run)
    cli_speedup: tuple[str, str, float | None]  # (label, preset, --budget; None: the CLI's default)
    # (label, preset, --budget, --only; None: the CLI's defaults): the page's default check as a user first runs it
    cli_check: tuple[str, str, float | None, str | None]
    speedup_precisions: str | None  # None: all four
    compile_precisions: str
    compile_models: tuple[tuple[str, str, float], ...]
    reference_model: str  # the model held against torch.utils.benchmark
    reference_min_run_s: float
    matmul_sizes: tuple[int, ...]  # bf16 ceiling at each; the other dtypes at the middle one
    matmul_iters: int
    profile_model: tuple[str, str]  # (label, preset) whose bf16 step is profiled
    nan_cases: tuple[tuple[str, str], ...]  # (preset, precision)
    nan_repeats: int
    nan_steps: int
    recipe_precisions: tuple[str, ...]
    recipe_sizes: dict
    recipe_steps: int
    recipe_batch: int
    recipe_timeout_s: float
    compile_recipe_precisions: tuple[str, ...]
    trace_recipes: tuple[str, ...]  # the generated recipes traced (fp16: its GradScaler too)
    trace_steps: int
    trace_timeout_s: float
    nanogpt_args: tuple[str, ...]
    app_check_preset: str
    app_check_steps: int
    app_checks: str | None  # None: all five
    app_budget_s: float
    app_speedup_preset: str
    app_speedup_budget_s: float


GPU = Sizes(
    check_cases=(
        CheckCase("GPT-2 small", GPT2, GPT2_CPU_TWIN, 60, 40),
        CheckCase("cnn", "cnn", None, 30, 30),
        CheckCase("vit", "vit", None, 30, 30),
        CheckCase("overflow fixture", "fixture:overflow", None, 20, 20),
        CheckCase("underflow fixture", "fixture:underflow", None, 20, 20),
    ),
    check_steps=20,
    speedup_models=(("GPT-2 small", GPT2, 12.0), ("cnn", "cnn", 6.0)),
    cli_speedup=("GPT-2 small", GPT2, None),
    cli_check=("gpt, the page's default", "gpt", None, None),
    speedup_precisions=None,
    compile_precisions="fp32,bf16",
    compile_models=(("GPT-2 small", GPT2, 12.0), ("cnn", "cnn", 6.0)),
    reference_model=GPT2,
    reference_min_run_s=4.0,
    matmul_sizes=(4096, 8192, 16384),
    matmul_iters=20,
    profile_model=("GPT-2 small", GPT2),
    # GPT-2 small, and the small CNN that issue 28's 0.2 target was set on (a CPU figure; launch-bound on a GPU)
    nan_cases=((GPT2, "bf16"), (SMALL_CNN, "fp32")),
    nan_repeats=5,
    nan_steps=2,
    recipe_precisions=("fp32", "bf16", "fp16"),
    recipe_sizes=RECIPE_GPT2,
    recipe_steps=40,
    recipe_batch=8,
    recipe_timeout_s=300,
    compile_recipe_precisions=("bf16",),
    trace_recipes=("bf16", "fp16"),
    trace_steps=5,
    trace_timeout_s=240,
    nanogpt_args=("--n_layer=2", "--n_head=4", "--n_embd=128", "--block_size=64", "--batch_size=8",
                  "--max_iters=20", "--eval_iters=2", "--eval_interval=1000", "--log_interval=1"),
    app_check_preset="gpt",
    app_check_steps=10,
    app_checks=None,
    app_budget_s=40,
    app_speedup_preset="cnn",
    app_speedup_budget_s=5,
)

DRY_RUN = Sizes(
    check_cases=(
        CheckCase("GPT-2 small (tiny stand-in)", TINY_GPT, None, 10, 10),
        CheckCase("overflow fixture", "fixture:overflow", None, 10, 10),
        CheckCase("underflow fixture", "fixture:underflow", None, 10, 10),
    ),
    check_steps=2,
    speedup_models=(("GPT-2 small (tiny stand-in)", TINY_GPT, 0.2), ("cnn (tiny stand-in)", TINY_CNN, 0.2)),
    cli_speedup=("mlp (tiny stand-in)", TINY_MLP, 2.0),
    cli_check=("mlp (tiny stand-in)", TINY_MLP, 3.0, "capability"),
    speedup_precisions="fp32,bf16",
    compile_precisions="fp32,bf16",
    compile_models=(("cnn (tiny stand-in)", TINY_CNN, 0.2),),
    reference_model=TINY_GPT,
    reference_min_run_s=0.1,
    matmul_sizes=(64, 128),
    matmul_iters=2,
    profile_model=("GPT-2 small (tiny stand-in)", TINY_GPT),
    nan_cases=((TINY_GPT, "fp32"),),
    nan_repeats=2,
    nan_steps=1,
    recipe_precisions=("fp32", "bf16"),
    recipe_sizes=RECIPE_TINY,
    recipe_steps=20,
    recipe_batch=4,
    recipe_timeout_s=120,
    compile_recipe_precisions=("bf16",),
    trace_recipes=("fp16",),
    trace_steps=2,
    trace_timeout_s=120,
    nanogpt_args=("--n_layer=1", "--n_head=2", "--n_embd=32", "--block_size=32", "--batch_size=4",
                  "--max_iters=8", "--eval_iters=1", "--eval_interval=1000", "--log_interval=1"),
    app_check_preset=TINY_MLP,
    app_check_steps=2,
    app_checks="alignment,skiprate",
    app_budget_s=10,
    app_speedup_preset=TINY_MLP,
    app_speedup_budget_s=1,
)
