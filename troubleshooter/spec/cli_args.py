"""The spec options shared by `check` and `speedup`, and the source they name."""
from __future__ import annotations

import argparse

from ..errors import UserError
from .presets import PRESET_NAMES
from .source import SpecSource


def add_spec_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", nargs="?", metavar="SPEC.yaml", help="a YAML model spec (see docs/specs.md)")
    parser.add_argument("--preset", metavar="NAME[:k=v,...]",
                        help=f"a built-in model ({', '.join(PRESET_NAMES)}), e.g. gpt:d_model=768,n_layer=12")
    parser.add_argument("--python", metavar="FILE",
                        help="a Python file with build_model() and make_batch(batch_size); needs --allow-exec")
    parser.add_argument("--allow-exec", action="store_true",
                        help="allow running the --python file's code (in a child process with a time limit)")


def source_from_args(args: argparse.Namespace) -> SpecSource:
    given = [(k, v) for k, v in (("spec", getattr(args, "spec", None)), ("preset", getattr(args, "preset", None)),
                                 ("python", getattr(args, "python", None))) if v]
    if not given:
        raise UserError("no model given: pass SPEC.yaml, --preset NAME[:k=v,...] or --python FILE "
                        f"(presets: {', '.join(PRESET_NAMES)})")
    if len(given) > 1:
        raise UserError("give only one of SPEC.yaml, --preset and --python, not "
                        + " and ".join(k for k, _ in given))
    kind, value = given[0]
    if kind == "preset":
        return SpecSource.preset(value)
    if kind == "python":
        return SpecSource.python_file(value)
    return SpecSource.yaml_file(value)
