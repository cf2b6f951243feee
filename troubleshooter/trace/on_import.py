"""Run a callback right after a module is imported by the traced script, never importing it ourselves.

FSDP's modules cost about as much to import as torch itself does again (2 s on a busy 2-core
host), so a rank of `trace --nproc` that trains with DDP must not pay for them: their observers
are installed when, and only if, the script imports them.
"""
from __future__ import annotations

import importlib.abc
import sys
from typing import Callable

_CALLBACKS: dict[str, list[Callable]] = {}
_RESOLVING: set[str] = set()  # names this finder is asking the others about right now


def after_import(name: str, callback: Callable) -> None:
    """callback(module) once `name` has executed (at once when it already has)."""
    if name in sys.modules:
        _quietly(callback, sys.modules[name])
        return
    _CALLBACKS.setdefault(name, []).append(callback)
    if not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())


def _quietly(callback: Callable, module) -> None:
    try:
        callback(module)
    except Exception:  # noqa: BLE001 - a torch version we do not know: observe less, never break the script
        pass


class _AfterImport(importlib.abc.MetaPathFinder):
    """Wraps the loader of a watched module so the callbacks run after it executes. Another finder
    that delegates the same way (the framework layer's, trace/frameworks.py) asks this one back while
    it is asking: the name being resolved is answered None then, or the two would recurse forever."""

    def find_spec(self, name, path, target=None):
        if name not in _CALLBACKS or name in _RESOLVING:
            return None
        _RESOLVING.add(name)
        try:
            spec = next((s for s in (f.find_spec(name, path, target) for f in list(sys.meta_path)
                                     if f is not self and hasattr(f, "find_spec")) if s is not None), None)
        finally:
            _RESOLVING.discard(name)
        if spec is None:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original = loader.exec_module

        def exec_module(module):
            original(module)
            for callback in _CALLBACKS.pop(name, []):
                _quietly(callback, module)

        loader.exec_module = exec_module
        return spec
