"""Where an event happened in the user's code: the innermost frame outside torch, this package,
the standard library and installed packages, so a finding points into whichever of the user's
files made the call."""
from __future__ import annotations

import os
import sys
import sysconfig

import torch

_SKIP = tuple(sorted({
    os.path.dirname(os.path.realpath(torch.__file__)) + os.sep,
    os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep,  # troubleshooter/
    os.path.realpath(sysconfig.get_paths()["stdlib"]) + os.sep,
}))
# Installed third-party code (transformers' Trainer, typing_extensions' @deprecated wrapper around
# torch.cuda.amp.GradScaler) is not the user's to fix: a finding points at the user's call into
# it. Without a virtualenv site-packages sits below the stdlib path and was skipped with it; in a
# virtualenv it was not, and a GradScaler was "made" in typing_extensions.py.
_INSTALLED = {"site-packages", "dist-packages"}
_cache: dict[str, bool] = {}


def is_user_file(filename: str) -> bool:
    """True for a file of the user's program (not torch, not us, not the stdlib, not an installed
    package, not `<string>`)."""
    hit = _cache.get(filename)
    if hit is None:
        if filename.startswith("<"):
            hit = False
        else:
            real = os.path.realpath(filename)
            hit = not real.startswith(_SKIP) and not any(part in _INSTALLED for part in real.split(os.sep))
        _cache[filename] = hit
    return hit


def short_path(path: str) -> str:
    """A path relative to the current directory when it is below it (shorter in reports)."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def user_frame(depth: int = 2) -> tuple[str | None, int | None, str | None]:
    """(path, line, function) of the innermost user frame above the caller."""
    frame = sys._getframe(depth)
    while frame is not None:
        code = frame.f_code
        if is_user_file(code.co_filename):
            return code.co_filename, frame.f_lineno, code.co_name
        frame = frame.f_back
    return None, None, None


def user_frame_of_traceback(tb) -> tuple[str | None, int | None]:
    """The innermost user frame of a traceback (where the user's code called what raised)."""
    found = (None, None)
    while tb is not None:
        if is_user_file(tb.tb_frame.f_code.co_filename):
            found = (tb.tb_frame.f_code.co_filename, tb.tb_lineno)
        tb = tb.tb_next
    return found
