"""`speedup`: is AMP faster for this model on this machine? fp32 vs TF32 vs fp16 vs bf16.

Exit status: 0 when the precisions were measured (a low speedup, finding AMP209, is
information, not a failure), 1 when a precision failed with an error (the others are still
reported), 2 for a bad spec or bad options.
"""
from __future__ import annotations

import argparse
import json
import sys

from ..errors import UserError

DEFAULT_BUDGET_S = 20.0  # engine.speedup.DEFAULT_BUDGET_S (kept here: building the parser imports no torch)


def _budget(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def register(subparsers) -> None:
    from ..spec import add_spec_arguments

    parser = subparsers.add_parser(
        "speedup",
        help="time a training step in fp32, TF32, fp16 and bf16 on this host, with a verdict",
        description=("Times a full training step (forward, loss, backward, optimizer step) of the "
                     "model in each precision, interleaved, until the spread is small or the budget "
                     "runs out; reports step time, throughput, peak memory, speedup over fp32 and "
                     "a verdict. Exit 0: measured; 1: a precision failed; 2: bad input."),
    )
    add_spec_arguments(parser)
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: auto)")
    parser.add_argument("--precisions", default=None, metavar="LIST",
                        help="comma-separated subset of fp32,tf32,fp16,bf16 (default: all; "
                             "tf32 is reported unavailable where the device has none)")
    parser.add_argument("--budget", type=_budget, default=DEFAULT_BUDGET_S, metavar="SECONDS",
                        help=f"seconds for the whole run, start-up, model build and warm-up included (default: "
                             f"{DEFAULT_BUDGET_S:g}; a verdict, or \"inconclusive\" with the reason)")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile each precision's model (compile time counts in the budget)")
    parser.add_argument("--seed", type=int, default=0, help="seed for weights and batches (default: 0)")
    parser.add_argument("--plot", metavar="FILE.png", help="write a PNG: step time and peak memory per precision")
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output format")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.set_defaults(func=run)


def _progress_printer(enabled: bool):
    if not enabled:
        return None

    def progress(fraction: float, message: str) -> None:
        print(f"[{fraction:4.0%}] {message}", file=sys.stderr, flush=True)

    return progress


def run(args: argparse.Namespace) -> int:
    import time

    from ..cli import process_started_at

    # starting the process, importing torch and building the models count against --budget
    started_at = process_started_at() or time.time()
    from ..engine.precision import parse_precisions
    from ..engine.speedup import format_text, speedup_source
    from ..heap import freeze_if_command
    from ..spec import source_from_args

    freeze_if_command()  # torch and the engine are imported: later collections skip them
    source = source_from_args(args)
    precisions = parse_precisions(args.precisions) if args.precisions else None
    if args.plot and not args.plot.lower().endswith(".png"):
        raise UserError(f"--plot writes a PNG: give a file name ending in .png, not {args.plot!r}")
    result = speedup_source(
        source, allow_exec=args.allow_exec, device=args.device, precisions=precisions,
        budget_s=args.budget, compile=args.compile, seed=args.seed, started_at=started_at,
        progress=_progress_printer(args.format == "text" and not args.quiet and sys.stderr.isatty()),
    )
    if args.plot:
        from ..engine.speedup_plot import save_plot

        save_plot(result, args.plot)
    if args.format == "json":
        print(json.dumps(result, indent=2, default=str, allow_nan=False))
    else:
        sys.stdout.write(format_text(result))
        if args.plot:
            print(f"plot written to {args.plot}")
    return 1 if result.get("errors") else 0
