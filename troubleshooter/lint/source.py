"""Turn what the user handed us (files, notebooks, stdin, directories) into Python source units.

Reading is where bad input shows up, so every failure here becomes a `LintError` entry (path,
message, line) rather than an exception: one unreadable file must not hide the others' findings.
"""
from __future__ import annotations

import ast
import io
import json
import os
import re
import threading
import tokenize
from dataclasses import dataclass, field

from .lazy_re import lazy

MAX_BYTES = 2 * 1024 * 1024  # training scripts are far smaller; bigger inputs are refused
_SKIP_DIRS = {"__pycache__", "node_modules", "site-packages"}
# Cell magics whose body is still Python: drop the magic line, lint the rest.
_PY_CELL_MAGICS = {"time", "timeit", "capture", "prun", "debug"}


_PARSE_LOCK = threading.Lock()


def parse(text: str, path: str = "<unknown>") -> ast.Module:
    """`ast.parse`, one call at a time in this process. CPython 3.11 keeps the counter that guards
    the AST converter's recursion in per-interpreter state shared by all threads; when a garbage
    collection runs Python code mid-conversion and another thread parses meanwhile, the counter is
    reset under the first and its parse fails with `SystemError: AST constructor recursion depth
    mismatch` on perfectly valid code. Everything in the linter parses through here."""
    with _PARSE_LOCK:
        return ast.parse(text, filename=path)


def parse_problem(exc: BaseException) -> str:
    """Why the parser gave up, in words: it raises MemoryError with no message (or RecursionError)
    when an expression nests thousands deep (`-------1`, `a.b.b.b...`)."""
    if isinstance(exc, (RecursionError, MemoryError)):
        return "the code nests too deeply for Python's parser (thousands of operators or calls in one expression)"
    return str(exc) or type(exc).__name__


@dataclass
class LintError:
    """An input that could not be read or parsed (exit status 2), with where it failed when known."""

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
    # For notebooks: line in `text` -> line in the raw .ipynb (where GitHub can annotate it).
    raw_lines: dict[int, int] | None = None
    notes: list[str] = field(default_factory=list)  # said to the user, not an error (exit status unchanged)
    raw: str | None = None  # for notebooks: the JSON as read, where fixes are written back

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


_ASSIGN_MAGIC = lazy(r"^(\s*)[\w.]+(\s*,\s*[\w.]+)*\s*=\s*[%!]")  # files = !ls, t = %timeit -o f()
_HELP = lazy(r"^(\?\??[\w.]+|[\w.]+\?\??)\s*$")  # obj? / obj?? / ?obj
# IPython automagic: `pip install x`, `cd data`, `matplotlib inline` work without `%` in a cell
_AUTOMAGIC = lazy(r"^(pip|conda|mamba|cd|pwd|load_ext|reload_ext|matplotlib|autoreload|env|set_env|pinfo)"
                  r"(\s+(?![=(.\[,:+\-*/%<>!&|^])\S.*)?$")


def _blank(line: str) -> str:
    """An IPython-only line as Python that keeps the block structure: `pass` where indented, else empty."""
    indent = line[: len(line) - len(line.lstrip())]
    return indent + "pass" if indent else ""


def _is_ipython_line(line: str) -> bool:
    s = line.lstrip()
    return s.startswith(("%", "!")) or bool(_HELP.match(s)) or bool(_ASSIGN_MAGIC.match(line)) or (
        bool(_AUTOMAGIC.match(s)) and s.split()[0] != s.strip() or s.strip() in {"pwd", "cd"})


def strip_ipython(lines: list[str], cell: bool = False) -> list[str] | None:
    """IPython syntax as people write it -> Python with the same line numbers.

    Shell escapes (`!pip ...`), line magics (`%matplotlib inline`, `x = !ls`), help (`obj?`) and the
    lines a trailing backslash continues become blank. A cell magic whose body is Python (`%%time`,
    `%%writefile train.py`) keeps its body; any other (`%%bash`, `%%html`) blanks its body: up to the
    end of the cell, or in a `.py` export (`cell=False`) up to the next blank line. Returns None when
    a whole cell is a non-Python cell magic."""
    out: list[str] = []
    continued = False
    skipping = False
    for i, line in enumerate(lines):
        s = line.lstrip()
        if continued:
            out.append("")
            continued = line.rstrip().endswith("\\")
            continue
        if skipping:
            if not cell and not s:
                skipping = False
            out.append("")
            continue
        if s.startswith("%%"):
            mt = re.match(r"%%(\w+)(.*)", s)
            name, arg = (mt.group(1), (mt.group(2).split() or [""])[-1]) if mt else ("", "")
            python_body = name in _PY_CELL_MAGICS or (name in {"writefile", "file"} and arg.endswith(".py"))
            if not python_body:
                if cell and i == 0:
                    return None
                skipping = True
            out.append("")
            continue
        if _is_ipython_line(line):
            out.append(_blank(line))
            continued = line.rstrip().endswith("\\")
            continue
        out.append(line)
    return out


def _raw_source_lines(raw: str) -> list[tuple[int, str]]:
    """(1-based line in the raw .ipynb, decoded JSON string) for every line that holds one string."""
    out = []
    for no, line in enumerate(raw.splitlines(), 1):
        st = line.strip().rstrip(",")
        if st.startswith('"') and st.endswith('"'):
            try:
                out.append((no, json.loads(st)))
            except json.JSONDecodeError:
                pass
    return out


def notebook_unit(raw: str, path: str) -> SourceUnit:
    """Concatenate a notebook's code cells (so imports in cell 1 are seen in cell 5).

    Cells are numbered among code cells (markdown cells are not counted), as in `cell_map`;
    `raw_lines` maps each joined line to its line in the .ipynb file, where GitHub shows it."""
    from ..bounded import InputRefused, load_json

    try:
        nb = load_json(raw, "the notebook")
    except json.JSONDecodeError as exc:
        raise ValueError(f"malformed notebook: not JSON ({exc.msg} at line {exc.lineno})") from None
    except InputRefused as exc:
        raise ValueError(f"malformed notebook: {str(exc).replace('the notebook ', '', 1)}") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise ValueError("malformed notebook: no 'cells' list")
    unit = SourceUnit(path=path, text="", cell_map={}, raw_lines={}, raw=raw)
    raw_strings = _raw_source_lines(raw)
    cursor = 0
    pieces: list[str] = []
    line_no = 0
    code_no = 0
    for cell in nb["cells"]:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        code_no += 1
        src = cell.get("source", "")
        parts = src if isinstance(src, list) else [src]
        if isinstance(src, list):
            src = "".join(s for s in src if isinstance(s, str))
        if not isinstance(src, str):
            unit.errors.append(LintError(path, "malformed notebook cell: source is not text", None, code_no))
            continue
        raw_of: dict[int, int] = {}  # line in the cell -> line in the raw file
        if isinstance(cell.get("source"), list):
            for j, part in enumerate(parts):
                for k in range(cursor, len(raw_strings)):
                    if raw_strings[k][1] == part:
                        raw_of[j + 1] = raw_strings[k][0]
                        cursor = k + 1
                        break
        lines = strip_ipython(src.splitlines(), cell=True)
        if lines is None:
            continue
        cell_text = "\n".join(lines) + "\n"
        try:
            parse(cell_text, path)
        except SyntaxError as exc:
            unit.errors.append(LintError(path, f"syntax error: {exc.msg}", exc.lineno, code_no))
            continue
        except (ValueError, RecursionError, MemoryError) as exc:
            unit.errors.append(LintError(path, f"cannot parse cell: {parse_problem(exc)}", None, code_no))
            continue
        for j in range(len(lines)):
            unit.cell_map[line_no + j + 1] = (code_no, j + 1)
            if j + 1 in raw_of:
                unit.raw_lines[line_no + j + 1] = raw_of[j + 1]
        pieces.append(cell_text)
        line_no += len(lines)
    if code_no == 0:
        unit.notes.append(f"{path}: notebook has no code cells: nothing to lint")
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
            yield from _one("-")
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


def _one(path: str, in_dir: bool = False):
    """Read one input through `bounded.read_bytes`: at most MAX_BYTES of a regular file or of stdin
    (`/dev/zero`, `yes | lint -` and a named pipe called train.py are refused, not read forever)."""
    from ..bounded import InputRefused, read_bytes

    try:
        data = read_bytes(path, MAX_BYTES, "<stdin>" if path == "-" else path)
    except InputRefused as exc:
        if not exc.too_big:
            yield path, LintError(path, str(exc).replace(f"{path} is ", "", 1))
            return
        size = f"{exc.size / 1e6:.1f} MB" if exc.size is not None else f"more than {MAX_BYTES // (1024 * 1024)} MB"
        yield path, LintError(path, f"{'file' if path != '-' else 'stdin'} is {size}; the linter reads files up "
                                    f"to {MAX_BYTES // (1024 * 1024)} MB (split it, or lint the training script itself)")
        return
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
