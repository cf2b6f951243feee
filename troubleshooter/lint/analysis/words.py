"""Which names a file may hold, asked of its lower-cased text at C speed instead of a set built from every
Name and Attribute node (1.6M of them on diffusers, ~0.14x a parse). The answers are supersets: a word in a
string or comment counts too, so they serve as gates ("may this file name X?") in front of exact work,
never as results (FileModel.identifiers stays the exact set, built when an exact reader asks)."""
from __future__ import annotations

import re
import unicodedata
from functools import lru_cache


def searchable(source: str) -> str:
    """`source` lower-cased as the parser reads names: NFKC-normalised first when it is not already (Python
    reads a name written `ｇｒａｄ` as `grad`), so every name of the parsed file, lower-cased, is in it."""
    if not source.isascii() and not unicodedata.is_normalized("NFKC", source):
        source = unicodedata.normalize("NFKC", source)
    return source.lower()


@lru_cache(maxsize=None)
def word_pattern(word: str) -> re.Pattern:
    """`word` as a whole word. The literal comes first so the search runs at memchr speed (a leading `\\b`
    made it 30x slower); the look-behind then rejects a word character before it."""
    w = re.escape(word)
    return re.compile(rf"{w}\b(?<!\w{w})")
