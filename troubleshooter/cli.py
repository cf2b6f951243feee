"""The command line: one subcommand per module in `troubleshooter.commands`.

Each command module defines `register(subparsers)` which adds its parser and sets
`func=run` where `run(args) -> int` returns the exit status. Adding a command means adding
one file; nothing here changes.
"""
from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
import time

from . import __version__, commands
from .errors import UserError

# Order in `--help`: the four user actions first, then helpers.
_ORDER = ["lint", "rules", "check", "capability", "inspect", "speedup", "ask", "explain", "recipe", "app", "server"]

# Heavy libraries only some commands need, and the extra that installs each
# (`pip install 'amp-troubleshooter[engine]'`); the base install is the linter alone.
_EXTRA_FOR = {"torch": "engine", "numpy": "engine", "matplotlib": "engine", "pydantic": "engine",
              "gradio": "app", "gradio_client": "app", "pygls": "lsp", "lsprotocol": "lsp"}


def _command_names() -> list[str]:
    names = [m.name for m in pkgutil.iter_modules(commands.__path__) if not m.name.startswith("_")]
    return sorted(names, key=lambda n: (_ORDER.index(n) if n in _ORDER else len(_ORDER), n))


def _command_modules(only: str | None = None):
    """Every command's module, or only `only`'s: `lint FILE` should not pay for importing the
    questionnaire, the recipes and YAML that other commands need (one command's module per file)."""
    names = _command_names()
    if only in names:
        names = [only]
    return [importlib.import_module(f"{commands.__name__}.{n}") for n in names]


def _prog() -> str:
    """`amp-troubleshooter` when run as the console script, `python -m troubleshooter` otherwise."""
    name = os.path.basename(sys.argv[0] if sys.argv and sys.argv[0] else "")
    return "amp-troubleshooter" if name.startswith("amp-troubleshooter") else "python -m troubleshooter"


def missing_extra_message(exc: ModuleNotFoundError, command: str | None) -> str | None:
    """A readable answer when a command needs a library the lint-only install leaves out."""
    top = (exc.name or "").split(".")[0]
    extra = _EXTRA_FOR.get(top)
    if extra is None:
        return None
    what = f"`{command}`" if command else "this command"
    return (f"{what} needs {top}, which is not installed here. Install it with "
            f"pip install 'amp-troubleshooter[{extra}]' (or pip install -r requirements.txt in a checkout); "
            "lint, rules, explain, recipe and ask work without it.")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with `command` (a command's name), that command's parser alone."""
    parser = argparse.ArgumentParser(
        prog=_prog(),
        description="AMP Troubleshooter: diagnose and fix PyTorch FP16/BF16 mixed-precision training.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in _command_modules(command):
        module.register(sub)
    return parser


DEBUG_ENV = "AMP_TS_DEBUG"
# Commands whose process runs none of the user's code and no server: once one has imported torch,
# the process exits without tearing the interpreter down (0.5-2 s on a busy 2-core host: freeing
# torch's modules and objects one by one), which would otherwise come on top of a --budget.
FAST_EXIT_COMMANDS = frozenset({"check", "speedup", "capability", "inspect"})
# `lint` runs no user code either and always exits so: tearing down its ~110 modules and the
# report (a last collection, then every module's objects freed one by one) took ~10 ms of the
# ~90 ms a small tree's lint costs (nanoGPT, BENCHMARKS.md "Linter speed").
FAST_EXIT_ALWAYS = frozenset({"lint"})
_process_started_at: float | None = None


def process_started_at() -> float | None:
    """`time.time()` when this process's CLI started (None when `main` was called in-process,
    as by the tests): the start a command's --budget is counted from."""
    return _process_started_at


def entry(started_at: float | None = None) -> None:
    """The process's entry point (the console script and `python -m troubleshooter`)."""
    global _process_started_at
    _process_started_at = started_at if started_at is not None else time.time()
    argv = sys.argv[1:]
    status = main(argv)
    command = argv[0] if argv else None
    if command in FAST_EXIT_ALWAYS or (command in FAST_EXIT_COMMANDS and "torch" in sys.modules):
        exit_now(status)
    sys.exit(status)


def exit_now(status: int) -> None:
    """Exit as `sys.exit` would, minus the interpreter's teardown: atexit handlers run (worker
    processes stopped, logging shut down) and output flushed, then `os._exit`."""
    import atexit

    atexit._run_exitfuncs()  # first: a handler may still print
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can reach the reader
            pass
    os._exit(status)
INTERNAL_ERROR_EXIT = 3  # 0 clean, 1 findings, 2 bad input or usage, 3 a bug of ours


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["app"]:  # every later argument, --help included, belongs to the app's own parser
        from .commands.app import launch
        return _guarded(lambda: launch(argv[1:]), "app")
    parser = build_parser(argv[0] if argv else None)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return _guarded(lambda: args.func(args), args.command)


def _guarded(call, command: str | None) -> int:
    """Run a command: user errors and missing optional libraries become one line and an exit status."""
    try:
        return int(call() or 0)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except ModuleNotFoundError as exc:
        message = missing_extra_message(exc, command)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # noqa: BLE001 - a bug of ours: one readable line, the traceback on request
        if os.environ.get(DEBUG_ENV):
            raise
        print(f"internal error in amp-troubleshooter {command or ''}: {type(exc).__name__}: {exc}\n"
              f"This is a bug in the tool, not in your input; set {DEBUG_ENV}=1 to see the traceback "
              "and please report it.", file=sys.stderr)
        return INTERNAL_ERROR_EXIT
