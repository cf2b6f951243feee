"""Where an event happened in the user's code: the innermost frame outside torch, this package,
the standard library and installed packages, so a finding points into whichever of the user's
files made the call."""
from __future__ import annotations

import importlib.util
import os
import re
import sys
import sysconfig
import traceback


def _torch_folder() -> str | None:
    """torch's package folder, found without importing torch: the trace parent imports this
    module to shorten paths and never needs torch itself (importing it cost every CLI trace
    ~1 s here, 7 s on a fresh GPU host). None where torch is not installed."""
    try:
        spec = importlib.util.find_spec("torch")  # torch's own spec once it is imported
    except (ImportError, ValueError):  # ValueError: a `torch` in sys.modules without a spec
        return None
    return os.path.dirname(os.path.realpath(spec.origin)) if spec is not None and spec.origin else None


_SKIP = tuple(sorted({folder + os.sep for folder in (
    _torch_folder(),
    os.path.dirname(os.path.dirname(os.path.realpath(__file__))),  # troubleshooter/
    os.path.realpath(sysconfig.get_paths()["stdlib"]),
) if folder}))
# Installed third-party code (transformers' Trainer, typing_extensions' @deprecated wrapper around
# torch.cuda.amp.GradScaler) is not the user's to fix: a finding points at the user's call into
# it. Without a virtualenv site-packages sits below the stdlib path and was skipped with it; in a
# virtualenv it was not, and a GradScaler was "made" in typing_extensions.py.
_INSTALLED = {"site-packages", "dist-packages"}
_TOOL = os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep  # troubleshooter/
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


def display_path(path: str) -> str:
    """A path as a report shows it: relative to the current directory below it, an installed
    package's file from its package folder on (`torch/serialization.py`), else as given."""
    parts = path.split(os.sep)
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] in _INSTALLED:
            return os.sep.join(parts[i + 1:])
    return short_path(path)


_lines: dict[tuple[int, int], tuple] = {}  # (id(code), instruction offset) -> (code, line)
MAX_REMEMBERED_LINES = 100_000


def line_of(frame) -> int:
    """`frame.f_lineno`, remembered per code object and instruction: reading f_lineno scans the
    code's line table from its start (36,500 CPU instructions a step in bench/trace_overhead.py,
    6% of the tracer's; more where the training loop is one long function). The code object is
    kept with its line, so its id is never reused."""
    code = frame.f_code
    key = (id(code), frame.f_lasti)
    hit = _lines.get(key)
    if hit is not None and hit[0] is code:
        return hit[1]
    line = frame.f_lineno
    # under a debugger's tracer the frame's line is its own business; code made at run time
    # (exec in a loop) must not grow this without end
    if frame.f_trace is None and len(_lines) < MAX_REMEMBERED_LINES:
        _lines[key] = (code, line)
    return line


def user_frame(depth: int = 2) -> tuple[str | None, int | None, str | None]:
    """(path, line, function) of the innermost user frame above the caller."""
    frame = sys._getframe(depth)
    while frame is not None:
        code = frame.f_code
        if is_user_file(code.co_filename):
            return code.co_filename, line_of(frame), code.co_name
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


def is_tool_file(filename: str) -> bool:
    """A file of this package (the child that runs the script, the wrappers around torch calls)."""
    return not filename.startswith("<") and os.path.realpath(filename).startswith(_TOOL)


def script_traceback(exc: BaseException) -> str:
    """The exception's traceback as the script's own: this package's frames (the child that runs
    the script, the thin wrappers around torch calls) and runpy's are left out, so a user reads
    their lines and torch's, never the tool's."""
    te = traceback.TracebackException(type(exc), exc, exc.__traceback__)
    _strip(te, set())
    return "".join(te.format())


def _strip(te: traceback.TracebackException, seen: set[int]) -> None:
    if id(te) in seen:
        return
    seen.add(id(te))
    te.stack = traceback.StackSummary.from_list(
        [f for f in te.stack if not is_tool_file(f.filename) and not f.filename.startswith("<frozen runpy")])
    for chained in (te.__cause__, te.__context__, *(getattr(te, "exceptions", None) or ())):
        if chained is not None:
            _strip(chained, seen)


# a line of ours that only hands a call on to what it wraps (torch's function, the script's op)
_PASS_THROUGH = re.compile(r"\b(orig|original|func|op|target)(\.redispatch)?\(")
_OUR_NAMES = re.compile(r"troubleshooter|main\.<locals>|\b(HookSet|Numerics|OutsideOps|Recorder|PolicyRun|OpTape|"
                        r"HalfOnFloat32|TraceStop|TraceTimeout)\b")


def caused_by_tool(exc: BaseException) -> bool:
    """The exception comes from this package, not from the script: raised by a line of ours that
    is not just handing a call on, or naming one of our objects (a pickling error about a hook)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if frames and is_tool_file(frames[-1].filename) and not _PASS_THROUGH.search(frames[-1].line or ""):
        return True
    return bool(_OUR_NAMES.search(str(exc)))
