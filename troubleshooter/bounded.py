"""Reading what a user hands us without letting its size or shape hurt: files, stdin, JSON.

`lint /dev/zero` or `yes | lint -` must not grow until the machine runs out of memory, a named
pipe called `train.py` must not hang the linter, and `[[[[...` a hundred thousand deep must not
reach a recursive parser. Each of these is refused here with a sentence.
"""
from __future__ import annotations

import json
import os
import re
import stat
import sys
from typing import Any

from .errors import UserError

MAX_JSON_DEPTH = 64  # answers, recipe options, notebooks: real ones nest a few levels
_CHUNK = 1 << 16


class InputRefused(UserError):
    """The input is too big, not a regular file, or shaped to hurt whatever reads it next.
    `too_big` says which; `size` is the size in bytes where it is known (a file, not a stream)."""

    def __init__(self, message: str, too_big: bool = False, size: int | None = None):
        super().__init__(message)
        self.too_big, self.size = too_big, size


def _mb(n: int) -> str:
    return f"{n / (1024 * 1024):g} MB"


def read_bytes(path: str, limit: int, what: str | None = None) -> bytes:
    """The bytes of a regular file (or of stdin for `-`), at most `limit`: a bigger input, a
    device (`/dev/zero`), a named pipe or a socket is refused before it is read to its end.
    OSError (missing file, no permission, a directory) propagates for the caller to word."""
    what = what or ("stdin" if path == "-" else path)
    if path == "-":
        stream = getattr(sys.stdin, "buffer", None)
        if stream is None:  # a text stream (tests, embedded use)
            return _capped(sys.stdin.read(limit + 1).encode("utf-8", "surrogatepass"), limit, what)
        return _read_stream(stream, limit, what)
    st = os.stat(path)
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(21, "is a directory", path)
    if not stat.S_ISREG(st.st_mode):
        kind = ("a named pipe" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
                else "a device")
        raise InputRefused(f"{what} is {kind}, not a regular file: refused (only files are read)")
    if st.st_size > limit:
        raise InputRefused(f"{what} is {st.st_size / 1e6:.1f} MB, over the limit of {_mb(limit)}",
                           too_big=True, size=st.st_size)
    with open(path, "rb") as fh:
        return _read_stream(fh, limit, what)  # the file may grow between stat and read


def _read_stream(stream, limit: int, what: str) -> bytes:
    chunks, size = [], 0
    while size <= limit:
        chunk = stream.read(min(_CHUNK, limit + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return _capped(b"".join(chunks), limit, what)


def _capped(data: bytes, limit: int, what: str) -> bytes:
    if len(data) > limit:
        raise InputRefused(f"{what} holds more than {_mb(limit)}, the limit: refused", too_big=True)
    return data


# One string literal, written "unrolled" (a run of plain characters, then escape + run, ...): the
# same strings as `"(?:[^"\\]|\\.)*"`, matched about 7x faster, which a 270 KB notebook feels.
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_JSON_BRACKET = re.compile(r"[\[\]{}]")


def json_depth(text: str, stop_at: int = MAX_JSON_DEPTH) -> int:
    """How deeply JSON text nests (brackets outside strings), counted without parsing it; stops
    counting once past `stop_at`."""
    depth = deepest = 0
    for m in _JSON_BRACKET.finditer(_JSON_STRING.sub('""', text)):
        depth += 1 if m.group() in "[{" else -1
        if depth > deepest:
            deepest = depth
            if deepest > stop_at:
                break
    return deepest


def load_json(text: str, what: str = "the JSON", *, max_depth: int = MAX_JSON_DEPTH,
              error: type[UserError] = InputRefused) -> Any:
    """`json.loads`, refusing text that nests deeper than `max_depth` before parsing it (the
    parser and everything that walks its result recurse once per level)."""
    if json_depth(text, max_depth) > max_depth:
        raise error(f"{what} nests more than {max_depth} levels deep: refused")
    try:
        return json.loads(text)
    except RecursionError:  # unreachable below max_depth; kept so no input can give a traceback
        raise error(f"{what} nests too deeply: refused") from None
