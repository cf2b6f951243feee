"""The functions the app hands to its worker processes, importable without torch.

A job's function crosses to the worker by reference (module and name). Referencing the engine's
own functions made the server import the engine, and torch with it (about 3 s and 150 MiB on the
first check or speedup of a page that started without torch); these stand-ins import the engine
only where they run: in the worker, which has torch loaded already.
"""
from __future__ import annotations

from typing import Any


def check_report(source, **kwargs: Any):
    """`engine.check.check_report` (a typed `CheckReport`, whose module is torch-free)."""
    from .engine.check import check_report as run

    return run(source, **kwargs)


def speedup_source(source, **kwargs: Any) -> dict[str, Any]:
    """`engine.speedup.speedup_source`."""
    from .engine.speedup import speedup_source as run

    return run(source, **kwargs)
