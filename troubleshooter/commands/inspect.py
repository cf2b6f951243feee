"""`inspect`: what a checkpoint holds (dtypes, master weights, scaler/optimizer/scheduler state)."""
from __future__ import annotations

import json


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "inspect", help="inspect a training checkpoint's precision and resume state (never runs its code)",
        description="Load CHECKPOINT with torch.load(weights_only=True) and report the tensors' dtypes, whether "
                    "the model weights are half precision only (AMP124), the GradScaler scale (AMP202 when "
                    "below 1) and whether optimizer, scaler and scheduler state are there for a faithful "
                    "resume (AMP110). Exit status: 0 clean, 1 warnings or errors found, 2 unreadable or refused.")
    p.add_argument("checkpoint", metavar="CHECKPOINT.pt")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..engine.inspect_checkpoint import inspect_checkpoint
    from ..findings import has_problems

    report = inspect_checkpoint(args.checkpoint)
    if args.format == "json":
        print(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        print(report.to_text(), end="")
    return 1 if has_problems(report.findings) else 0
