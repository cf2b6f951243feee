"""`trace`: run the user's own training script on this host and report what its mixed precision
actually does (docs/trace.md).

    python -m troubleshooter trace SCRIPT.py [--steps N] [--device auto|cpu|cuda[:N]] [--timeout S]
           [--nan] [--headroom] [--autocast-policy cuda|host] [--nproc N] [--no-steady] [--format text|json|github]
           [-- SCRIPT ARGS...]

Exit status: 0 no error/warning finding, 1 some (a script that raises or hits the time limit
counts), 2 the script cannot be started or the options are wrong.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

DEFAULT_STEPS = 20
DEFAULT_TIMEOUT = 120.0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "trace", help="run your training script for a few steps and report what its AMP really does",
        description="Run SCRIPT exactly as `python SCRIPT ARGS` would, in a child process with a time limit, "
                    "stop it after N optimizer steps, and report the AMP protocol mistakes, loss scale, skipped "
                    "steps and first non-finite module seen at run time, located in your files. "
                    "This EXECUTES the script. Arguments after `--` go to the script.")
    p.add_argument("script", metavar="SCRIPT.py", help="the training script to run")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS,
                   help=f"optimizer steps to observe, all optimizers together (default {DEFAULT_STEPS})")
    p.add_argument("--device", default="auto",
                   help="auto (default: as the script chooses), cpu (hides CUDA), cuda or cuda:N")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                   help=f"seconds before the script is stopped (default {DEFAULT_TIMEOUT:g})")
    p.add_argument("--nan", action="store_true",
                   help="localise the first non-finite module on every step (one host sync per step)")
    p.add_argument("--headroom", action="store_true",
                   help="measure fp16 gradient underflow under the loss scale on every step (AMP203)")
    p.add_argument("--autocast-policy", choices=("cuda", "host"), default="cuda",
                   help="on a host without a GPU: cuda (default) runs the script's CPU autocast regions with "
                        "CUDA's op lists (exp, pow, sum, softmax, norms and losses in float32), so the answers are "
                        "your GPU's; host uses the CPU's own lists, for training on CPUs")
    p.add_argument("--nproc", type=int, default=None, metavar="N",
                   help="run the script under torch.distributed.run with N ranks (as `torchrun --standalone "
                        "--nproc_per_node N`), trace every rank and merge them (docs/distributed.md)")
    p.add_argument("--no-steady", dest="steady", action="store_false",
                   help="keep every instrument armed on every step: by default, after 3 identical clean steps "
                        "the loss watch and the output-gradient keeper stand down until a step deviates "
                        "(docs/trace.md, \"Steady state\")")
    p.add_argument("--cwd", default=None,
                   help="working directory of the script (default: the current one, as `python SCRIPT` would)")
    p.add_argument("--format", choices=("text", "json", "github"), default="text")
    p.set_defaults(func=run, script_args=[])
    p.epilog = "Everything after `--` is passed to the script unchanged: trace train.py --steps 5 -- --lr 0.1"
    _split_at_double_dash(p)


def _split_at_double_dash(parser: argparse.ArgumentParser) -> None:
    """Everything after the first `--` belongs to the script, options included; argparse alone
    cannot express "a positional, then options, then a free tail"."""
    parse = parser.parse_known_args

    def parse_known_args(args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        tail: list[str] = []
        if "--" in args:
            i = args.index("--")
            args, tail = args[:i], args[i + 1:]
        ns, extras = parse(args, namespace)
        ns.script_args = tail
        return ns, extras

    parser.parse_known_args = parse_known_args


def run(args: argparse.Namespace) -> int:
    from ..trace import exit_code, render_text, trace_script
    from ..trace.report import render_github

    script_args = list(args.script_args)
    progress = _stderr_progress if args.format == "text" and sys.stderr.isatty() else None
    report = trace_script(args.script, script_args, steps=args.steps, device=args.device,
                          timeout_s=args.timeout, nan=args.nan, headroom=args.headroom,
                          cwd=args.cwd or os.getcwd(), progress=progress, autocast_policy=args.autocast_policy,
                          nproc=args.nproc, steady=args.steady)
    if args.format == "json":
        print(json.dumps(report, indent=2))
    elif args.format == "github":
        sys.stdout.write(render_github(report))
    elif report.get("distributed"):
        from ..trace.merge import render_text as render_ranks
        print(render_ranks(report, render_text))
    else:
        print(render_text(report))
    return exit_code(report)


def _stderr_progress(fraction: float, message: str) -> None:
    print(f"[{fraction:4.0%}] {message}", file=sys.stderr, flush=True)
