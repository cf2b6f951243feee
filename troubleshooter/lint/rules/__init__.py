"""The rule catalogue: one module per rule (`ampNNN.py`), each defining one `Rule` subclass."""
from __future__ import annotations

import importlib
import pkgutil

from .base import Hit, Rule


def _load() -> list[Rule]:
    rules = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if not info.name.startswith("amp"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, Rule) and obj is not Rule and obj.__module__ == module.__name__:
                rules.append(obj())
    rules.sort(key=lambda r: r.id)
    return rules


RULES: list[Rule] = _load()
BY_ID: dict[str, Rule] = {r.id: r for r in RULES}

__all__ = ["RULES", "BY_ID", "Hit", "Rule"]
