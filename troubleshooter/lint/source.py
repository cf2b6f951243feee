"""Turn what the user handed us (files, notebooks, stdin, directories) into Python source units.

Reading is where bad input shows up, so every failure here becomes a `LintError` entry (path,
message, line) rather than an exception: one unreadable file must not hide the others' findings.
"""
from __future__ import annotations

import io
import json
import os
import re
import sys
import tokenize
from dataclasses import dataclass, field

MAX_BYTES = 2 * 1024 * 1024  # training scripts are far smaller; bigger inputs are refused
_SKIP_DIRS = {"__pycache__", "node_modules", "site-packages"}
# Cell magics whose body is still Python: drop the magic line, lint the rest.
_PY_CELL_MAGICS = {"time", "timeit", "capture", "prun", "debug"}


@dataclass
class LintError:
    path: str
    message: str
    line: int | None = None
    cell: int | None = None

    def to_dict(self) -> dict:
        return {"path": self.path, "message": self.message, "line": self.line, "cell": self.cell}


@dataclass
class SourceUnit:
    """Python text to lint plus, for notebooks, where each of its lines came from."""

    path: str
    text: str
    # For notebooks: line in `text` (1-based) -> (code-cell number, line within the cell).
    cell_map: dict[int, tuple[int, int]] | None = None
    errors: list[LintError] = field(default_factory=list)

    def locate(self, line: int) -> tuple[int | None, int]:
        if self.cell_map is None or line not in self.cell_map:
            return None, line
        return self.cell_map[line]


def decode_bytes(data: bytes, path: str) -> str:
    """Bytes -> text honouring a PEP 263 coding line; raises ValueError with a readable reason."""
    if not data.strip():
        raise ValueError("file is empty: nothing to lint")
    if b"\x00" in data[:8192]:
        raise ValueError("binary file (contains NUL bytes), not Python source")
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError:
        encoding = "utf-8"  # invalid bytes in the first two lines: report them below
    try:
        return data.decode(encoding)
    except (UnicodeDecodeError, LookupError) as exc:
        pos = getattr(exc, "start", None)
        where = f" at byte {pos}" if pos is not None else ""
        raise ValueError(f"not valid {encoding.upper()} text{where}: save the file as UTF-8 "
                         "(or declare its encoding with a `# -*- coding: ... -*-` line)") from None


def _strip_magics(lines: list[str]) -> list[str] | None:
    """Blank IPython magics/shell escapes; None when the whole cell is a non-Python cell magic."""
    out = []
    for i, line in enumerate(lines):
        s = line.lstrip()
        if i == 0 and s.startswith("%%"):
            name = re.match(r"%%(\w+)", s)
            if not name or name.group(1) not in _PY_CELL_MAGICS:
                return None
            out.append("")
        elif s.startswith(("%", "!")) or re.match(r"^[\w.]+\?\??\s*$", s):
            indent = line[: len(line) - len(s)]
            out.append(indent + "pass" if indent else "")
        elif re.match(r"^\s*\w+\s*=\s*[%!]", line):  # files = !ls
            out.append(line[: len(line) - len(s)] + "pass" if line[: len(line) - len(s)] else "")
        else:
            out.append(line)
    return out


def notebook_unit(raw: str, path: str) -> SourceUnit:
    """Concatenate a notebook's code cells (so imports in cell 1 are seen in cell 5)."""
    try:
        nb = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"malformed notebook: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise ValueError("malformed notebook: no 'cells' list")
    unit = SourceUnit(path=path, text="", cell_map={})
    pieces: list[str] = []
    line_no = 0
    code_no = 0
    for cell in nb["cells"]:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        code_no += 1
        src = cell.get("source", "")
        if isinstance(src, list):
            src = "".join(s for s in src if isinstance(s, str))
        if not isinstance(src, str):
            unit.errors.append(LintError(path, "malformed notebook cell: source is not text", None, code_no))
            continue
        lines = _strip_magics(src.splitlines())
        if lines is None:
            continue
        cell_text = "\n".join(lines) + "\n"
        try:
            compile(cell_text, path, "exec", flags=0x400, dont_inherit=True)  # PyCF_ONLY_AST
        except SyntaxError as exc:
            unit.errors.append(LintError(path, f"syntax error: {exc.msg}", exc.lineno, code_no))
            continue
        except (ValueError, RecursionError, MemoryError) as exc:
            unit.errors.append(LintError(path, f"cannot parse cell: {exc}", None, code_no))
            continue
        for j in range(len(lines)):
            unit.cell_map[line_no + j + 1] = (code_no, j + 1)
        pieces.append(cell_text)
        line_no += len(lines)
    if code_no == 0:
        raise ValueError("notebook has no code cells: nothing to lint")
    unit.text = "".join(pieces)
    return unit


def unit_from_bytes(data: bytes, path: str) -> SourceUnit:
    if len(data) > MAX_BYTES:
        raise ValueError(
            f"file is {len(data) / 1e6:.1f} MB; the linter reads files up to {MAX_BYTES // (1024 * 1024)} MB "
            "(split it, or lint the training script itself)"
        )
    text = decode_bytes(data, path)
    if path.endswith(".ipynb"):
        return notebook_unit(text, path)
    return SourceUnit(path=path, text=text)


def iter_inputs(paths: list[str]):
    """Yield (path, SourceUnit | LintError) for every file the paths name, in a stable order."""
    for p in paths:
        if p == "-":
            data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode()
            yield from _one("-", data=data)
        elif os.path.isdir(p):
            found = []
            for root, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIP_DIRS)
                for f in sorted(files):
                    if f.endswith((".py", ".ipynb")):
                        found.append(os.path.join(root, f))
            for f in found:
                yield from _one(f, in_dir=True)
        else:
            yield from _one(p)


def _one(path: str, data: bytes | None = None, in_dir: bool = False):
    if data is None:
        try:
            if os.path.getsize(path) > MAX_BYTES:
                size = os.path.getsize(path)
                yield path, LintError(path, f"file is {size / 1e6:.1f} MB; the linter reads files up to "
                                            f"{MAX_BYTES // (1024 * 1024)} MB (split it, or lint the training script itself)")
                return
            with open(path, "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            yield path, LintError(path, "no such file or directory")
            return
        except IsADirectoryError:
            yield path, LintError(path, "is a directory")
            return
        except OSError as exc:
            yield path, LintError(path, f"cannot read: {exc.strerror or exc}")
            return
    if in_dir and not data.strip():
        return  # empty __init__.py files inside a tree are normal
    try:
        yield path, unit_from_bytes(data, path)
    except ValueError as exc:
        yield path, LintError(path, str(exc))
