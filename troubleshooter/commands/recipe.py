"""`recipe`: write a mixed-precision training loop for the chosen options (or list them)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import UserError
from ..recipes import recipe_options, render_recipe


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "recipe",
        help="generate a mixed-precision training loop that is right by construction",
        description="Generate a runnable training script (demo model included; plug in yours). "
        "Options come from the recipe library's options.yaml; `--list` shows what each adds.",
    )
    for opt in recipe_options():
        dest = opt["name"]
        if opt["type"] == "bool":
            p.add_argument(opt["flag"], dest=dest, action="store_true", default=None, help=opt["help"])
            continue
        metavar = "|".join(opt["choices"]) if opt["type"] == "choice" else opt["type"].upper()
        kind = {"int": int, "float": float}.get(opt["type"], str)
        default = "" if opt.get("default") is None else f" (default: {opt['default']})"
        p.add_argument(opt["flag"], dest=dest, type=kind, metavar=metavar, default=None, help=opt["help"] + default)
    p.add_argument("-o", "--output", metavar="PATH", help="write the script here (default: print it)")
    p.add_argument("--list", action="store_true", help="list the options and what each adds, then exit")
    p.add_argument("--format", choices=["text", "json"], default="text", help="output format of --list")
    p.set_defaults(func=run)


def _list_text() -> str:
    lines = []
    for opt in recipe_options():
        if opt["type"] == "bool":
            usage = opt["flag"]
        elif opt["type"] == "choice":
            usage = f"{opt['flag']} {'|'.join(opt['choices'])}"
        else:
            usage = f"{opt['flag']} {opt['type'].upper()}"
        default = "off" if opt.get("default") in (None, False) else opt["default"]
        lines.append(f"{usage}  (default: {default})\n    {opt['help']}\n    adds: {opt['adds']}")
    return "\n".join(lines)


def write_script(text: str, output: str) -> Path:
    """Write a generated script, with a clear error instead of a traceback when it cannot be."""
    path = Path(output)
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot write {output}: {exc.strerror or exc}") from None
    return path


def run(args: argparse.Namespace) -> int:
    if args.list:
        if args.format == "json":
            print(json.dumps(recipe_options(), indent=2))
        else:
            print(_list_text())
        return 0
    options = {opt["name"]: getattr(args, opt["name"]) for opt in recipe_options()}
    text = render_recipe(**{k: v for k, v in options.items() if v is not None})
    if not args.output or args.output == "-":
        sys.stdout.write(text)
        return 0
    path = write_script(text, args.output)
    print(f"wrote {path} ({len(text.splitlines())} lines): run it with `python {path}`", file=sys.stderr)
    return 0
