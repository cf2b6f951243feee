"""`capability`: what this machine's device can do in fp16/bf16/tf32, and which precision to use."""
from __future__ import annotations

import json


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "capability", help="report the device's fp16/bf16/tf32 support and the precision to train in",
        description="Report the GPU (or CPU) capabilities that decide mixed precision: compute capability, "
                    "tensor-core dtypes, native bf16, TF32 settings, CPU bf16/AMX features, and the "
                    "recommended precision with the reason. Exit status 1 when a warning is found.")
    p.add_argument("--device", default="auto", help="auto (default), cpu, cuda, cuda:N or mps")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..engine.capability import detect
    from ..findings import has_problems

    report = detect(args.device)
    if args.format == "json":
        print(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        print(report.to_text(), end="")
    return 1 if has_problems(report.findings) else 0
