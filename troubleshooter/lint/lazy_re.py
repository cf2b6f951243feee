"""Regular expressions compiled on their first use.

`re.compile` runs re's compiler, written in Python: 0.05-0.45 ms a pattern. The linter keeps ~30
patterns at module level, most for one rule's rarer cases, and a small tree (nanoGPT) uses about
half of them: compiling the rest at import was ~3 ms of its start-up. `lazy(pattern, flags)` stands
for `re.compile(pattern, flags)`; the first call of a method compiles the pattern and puts the
compiled pattern's bound methods on the object: a later call costs ~400 instructions (~5% of a
short search) more than on a compiled pattern, and timm's 315 files make ~4,600 such calls.
"""
from __future__ import annotations

import re

_METHODS = ("search", "match", "fullmatch", "findall", "finditer", "sub", "subn", "split")


class LazyPattern:
    """A pattern to compile when first used: `search`, `match`, ... as on `re.Pattern`."""

    def __init__(self, pattern: str, flags: int = 0):
        self.pattern = pattern
        self.flags = flags

    def __getattr__(self, name: str):  # only while no method is bound yet, or for another attribute
        compiled = self.__dict__.get("_compiled")
        if compiled is None:
            compiled = self.__dict__["_compiled"] = re.compile(self.pattern, self.flags)
            for method in _METHODS:
                setattr(self, method, getattr(compiled, method))
        return getattr(compiled, name)


def lazy(pattern: str, flags: int = 0) -> LazyPattern:
    return LazyPattern(pattern, flags)
