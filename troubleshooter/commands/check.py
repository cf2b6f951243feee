"""`check`: what mixed precision will do to a model, measured on this host.

    python -m troubleshooter check SPEC.yaml|--preset NAME[:k=v,...]|--python FILE --allow-exec
        [--device auto|cpu|cuda[:N]] [--only capability,alignment,skiprate,nan,headroom]
        [--steps N] [--seed S] [--budget SECONDS] [--autocast-policy cuda|host] [--format text|json]
        [--nproc N [--wrap ddp|fsdp2] [--param-dtype D] [--reduce-dtype D]]   (docs/distributed.md)

Exit status: 0 no warning/error finding, 1 some (or a check that could not finish), 2 bad spec
or options.
"""
from __future__ import annotations

import argparse
import json
import sys

# From the engine's torch-free option rules: building the CLI parser never imports torch.
from ..engine.check_options import CHECKS, DEFAULT_STEPS, MAX_BUDGET_S
from ..engine.check_options import FIRST_ANSWER_BUDGET_S as DEFAULT_BUDGET_S  # --budget asks for more
from ..engine.check_options import POLICIES as AUTOCAST_POLICIES


def _budget(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value <= MAX_BUDGET_S:
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0 (at most a day), got {text}")
    return value


def register(subparsers) -> None:
    from ..spec import add_spec_arguments

    p = subparsers.add_parser(
        "check", help="run capability, alignment, skip-rate, NaN and headroom checks on a model",
        description="Build the model from a spec and measure what fp16/bf16 mixed precision does to it: "
                    "device capability, tensor-core alignment, GradScaler skip rate over real fp16 steps, "
                    "the first module producing NaN/Inf per precision, and fp16 overflow/underflow headroom.",
    )
    add_spec_arguments(p)
    p.add_argument("--device", default="auto", help="auto (default), cpu, cuda or cuda:N")
    p.add_argument("--only", metavar="CHECKS", help=f"comma-separated subset of: {','.join(CHECKS)}")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS,
                   help=f"fp16 training steps for the skip-rate probe (default {DEFAULT_STEPS})")
    p.add_argument("--seed", type=int, default=0, help="seed for weights and synthetic batches (default 0)")
    p.add_argument("--budget", type=_budget, default=DEFAULT_BUDGET_S, metavar="SECONDS",
                   help=f"seconds for the whole run, start-up included (default {DEFAULT_BUDGET_S:g}: a first answer; "
                        "the fast checks run first, each stops at a step boundary, and the report says what did "
                        "not fit and the budget that would)")
    p.add_argument("--autocast-policy", choices=AUTOCAST_POLICIES, default="cuda",
                   help="on a CPU host: cuda (default) runs autocast with CUDA's op lists (exp, pow, sum, softmax, "
                        "norms and losses in float32), so the answers are your GPU's; host uses the CPU's own "
                        "lists, for training on CPUs")
    p.add_argument("--format", choices=("text", "json"), default="text")
    _add_distributed_arguments(p)
    p.set_defaults(func=run)


def _add_distributed_arguments(p) -> None:
    """check --nproc: the skip-rate and NaN checks under torch.distributed (engine/distributed_check.py)."""
    g = p.add_argument_group("distributed (docs/distributed.md)")
    g.add_argument("--nproc", type=int, default=None, metavar="N",
                   help="run the skip-rate and NaN checks on N ranks under torch.distributed.run, the model wrapped "
                        "as --wrap says; reports the ranks' skip agreement and what the reduction does to gradients")
    g.add_argument("--wrap", choices=("ddp", "fsdp2"), default="ddp",
                   help="DDP, or FSDP2's fully_shard on each child module and the root (default ddp)")
    g.add_argument("--param-dtype", default="float16", metavar="DTYPE",
                   help="compute dtype: FSDP2's MixedPrecisionPolicy param_dtype, DDP's autocast dtype "
                        "(float16 default, bfloat16, float32); float16 trains with a GradScaler")
    g.add_argument("--reduce-dtype", default=None, metavar="DTYPE",
                   help="gradient reduction dtype: FSDP2's reduce_dtype (default: the param dtype), DDP's "
                        "fp16/bf16 compression hook (default float32: no hook)")


def run(args: argparse.Namespace) -> int:
    import time

    from ..cli import process_started_at

    # starting the process, importing torch and building the model count against --budget
    started_at = process_started_at() or time.time()
    from ..engine.check import check_report, parse_only
    from ..heap import freeze_if_command
    from ..spec import source_from_args

    freeze_if_command()  # torch and the engine are imported: later collections skip them
    parse_only(args.only)
    source = source_from_args(args)
    if args.nproc is not None:
        return _run_distributed(args, source)
    progress = _stderr_progress if args.format == "text" and sys.stderr.isatty() else None
    report = check_report(source, allow_exec=args.allow_exec, device=args.device, only=args.only,
                          steps=args.steps, seed=args.seed, progress=progress, budget_s=args.budget,
                          started_at=started_at, autocast_policy=args.autocast_policy)
    if args.format == "json":
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(render_text(report))
    return int(report.exit_code)


def _run_distributed(args: argparse.Namespace, source) -> int:
    from ..engine.distributed_check import check_distributed, render_text as render_ranks
    from ..errors import UserError

    if args.only is not None and set(c.strip() for c in args.only.split(",")) - {"skiprate", "nan"}:
        raise UserError("with --nproc the checks are skiprate and nan (run under the wrapper); capability, alignment "
                        "and headroom run without --nproc")
    progress = _stderr_progress if args.format == "text" and sys.stderr.isatty() else None
    report = check_distributed(source, nproc=args.nproc, wrap=args.wrap, param_dtype=args.param_dtype,
                               reduce_dtype=args.reduce_dtype, steps=args.steps, seed=args.seed,
                               device=args.device, allow_exec=args.allow_exec,
                               timeout_s=3 * args.budget + 120, progress=progress)
    print(json.dumps(report, indent=2) if args.format == "json" else render_ranks(report))
    return int(report["exit_code"])


def _stderr_progress(fraction: float, message: str) -> None:
    print(f"[{fraction:4.0%}] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- text report


def render_text(result) -> str:
    """The report for people: the page's sections (engine.check_render), for a terminal."""
    from ..engine.check_render import render_text as render

    return render(result)
