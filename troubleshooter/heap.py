"""Keep the garbage collector off what a short-lived process has imported.

A job process (a worker's job, a trace's child, one `check` or `speedup` command) imports torch
and the rest before its first step: a few hundred thousand objects that live as long as the
process. Every full collection walks all of them again, and a small model's steps make enough
short-lived objects to trigger one every few steps. After the imports, `freeze_imports()` moves
everything alive into the collector's permanent generation, so collections look only at what the
run makes. In the test session the same freeze cut the in-process check tests' CPU time by about
40% (BENCHMARKS.md, "Test suite and start-up"); for one command the gain is smaller than this
shared machine's noise and was not measured apart from it.

Only for processes that run one job and end: in a long-lived process (the app server, a user's
notebook) cyclic garbage that exists when it is called would never be collected.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager


def freeze_imports() -> None:
    """Collect what is garbage now, then leave everything still alive out of later collections."""
    gc.collect()
    gc.freeze()


def freeze_if_command() -> None:
    """`freeze_imports()` when this process is our command line (`python -m troubleshooter`, the
    `amp-troubleshooter` script), which runs one command and ends; not when `cli.main` is called
    from someone else's long-lived process (a notebook, a test session)."""
    import os
    import sys

    argv0 = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    main = sys.modules.get("__main__")
    if argv0.startswith("amp-troubleshooter") or getattr(main, "__package__", None) == "troubleshooter":
        freeze_imports()


@contextmanager
def collector_paused():
    """The cycle collector off for a stretch that makes many objects and no reference cycles among
    them (linting: millions of short-lived AST nodes, each file's freed by reference counting), and
    back to how it was after."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
