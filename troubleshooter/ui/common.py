"""What every tab needs: read an upload safely, turn any error into a sentence, write downloads.

Users upload whatever they have at hand (a checkpoint instead of a script, a 2 GB log); each
such mistake must come back as one readable sentence, never a traceback, so the page stays
usable.
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

from ..errors import UserError

log = logging.getLogger("troubleshooter.app")

_SNIFF_BYTES = 8192
_DOWNLOAD_TTL_S = 3600.0
_download_root: Path | None = None


def _mib(n: float) -> str:
    return f"{n / (1024 * 1024):.1f} MiB"


def upload_path(upload) -> str | None:
    """Gradio hands a filepath str (or an object with `.name`/`path`); normalise to a str."""
    if upload is None or upload == "":
        return None
    if isinstance(upload, (str, os.PathLike)):
        return str(upload)
    if isinstance(upload, dict) and upload.get("path"):
        return str(upload["path"])
    name = getattr(upload, "path", None) or getattr(upload, "name", None)
    return str(name) if name else None


def display_name(path: str | None) -> str:
    """The name the user gave the file: Gradio keeps it as the last path component."""
    return Path(path).name if path else "<pasted>"


def check_size(path: str, max_bytes: int) -> int:
    try:
        size = os.path.getsize(path)
    except OSError as exc:
        raise UserError(f"cannot read the uploaded file {display_name(path)}: {exc.strerror or exc}") from None
    if size > max_bytes:
        raise UserError(
            f"{display_name(path)} is {_mib(size)}, larger than this server's limit of {_mib(max_bytes)} "
            "(the operator can raise it with --max-file-mb)"
        )
    return size


def read_upload_bytes(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read the uploaded file {display_name(path)}: {exc.strerror or exc}") from None


def looks_binary(data: bytes) -> bool:
    """NUL bytes in the first few KiB: true for checkpoints, zips, images, compiled files."""
    return b"\x00" in data[:_SNIFF_BYTES]


def read_text_upload(path: str, max_bytes: int, kinds: tuple[str, ...] = (), what: str = "a text file") -> str:
    """Read an uploaded text file, refusing binaries, undecodable text and over-size files.

    `kinds` lists accepted suffixes (e.g. (".py", ".ipynb")); empty accepts any suffix.
    """
    name = display_name(path)
    suffix = Path(name).suffix.lower()
    if kinds and suffix not in kinds:
        raise UserError(f"{name}: expected {what} ({', '.join(kinds)}), got a '{suffix or 'no extension'}' file")
    check_size(path, max_bytes)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read the uploaded file {name}: {exc.strerror or exc}") from None
    if looks_binary(data):
        raise UserError(f"{name} is a binary file, not {what}: upload the source text instead")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UserError(
            f"{name} is not UTF-8 text (byte {exc.start} cannot be decoded): save it as UTF-8 and upload again"
        ) from None


def check_text_size(text: str | None, max_bytes: int, what: str = "the pasted text") -> str:
    text = text or ""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise UserError(f"{what} is {_mib(size)}, larger than this server's limit of {_mib(max_bytes)}")
    return text


# An absolute path (two or more segments), not part of a URL or a dotted/relative name.
_ABS_PATH = re.compile(r"(?<![\w:/.~-])/(?:[^\s/'\"`()<>,;]+/)+([^\s/'\"`()<>,;]+)")
# PyTorch's C++ assertion prefix, e.g. "[enforce fail at inline_container.cc:180] . ".
_ENFORCE = re.compile(r"\[enforce fail at [^\]]*\]\s*\.?\s*")


def public_text(text: str) -> str:
    """A message fit for a user: server paths reduced to the file's own name (an upload's name is
    the one the user gave it), C++ assertion prefixes dropped."""
    text = _ENFORCE.sub("", str(text))
    return _ABS_PATH.sub(lambda m: m.group(1), text)


def error_message(exc: BaseException) -> str:
    """One readable sentence for any exception; a bug in our code is logged with its traceback."""
    if isinstance(exc, UserError):
        return public_text(str(exc))
    if isinstance(exc, MemoryError):
        return "the server ran out of memory for this request; try a smaller model or input"
    log.exception("unexpected error in an app callback")
    text = public_text(f"{type(exc).__name__}: {exc}".strip())
    return f"internal error ({text}); this is a bug in the troubleshooter, the server log has details"


_MD_SPECIAL = re.compile(r"([\\*_<>\[\]#|])")


def md_escape(text: str) -> str:
    """Text shown literally in Markdown (`__main__`, `<top level>` stay as typed); `code` spans
    are left alone since Markdown already shows them literally."""
    parts = str(text).split("`")
    return "`".join(p if i % 2 else _MD_SPECIAL.sub(r"\\\1", p) for i, p in enumerate(parts))


def error_markdown(exc_or_text: BaseException | str, title: str = "Error") -> str:
    """A quoted block: the title, then the reason itself (never a bare "Error")."""
    text = exc_or_text if isinstance(exc_or_text, str) else error_message(exc_or_text)
    body = "\n".join(f"> {md_escape(line)}" if line else ">" for line in text.splitlines())
    return f"> **{title}**\n{body}\n"


def _root() -> Path:
    global _download_root
    if _download_root is None or not _download_root.is_dir():
        _download_root = Path(tempfile.mkdtemp(prefix="amp-troubleshooter-downloads-"))
    return _download_root


def _prune(root: Path) -> None:
    cutoff = time.time() - _DOWNLOAD_TTL_S
    for child in root.iterdir():
        try:
            if child.stat().st_mtime < cutoff:
                shutil.rmtree(child, ignore_errors=True)
        except OSError:
            pass


_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def fresh_dir(prefix: str = "") -> Path:
    """A new private folder under the app's scratch root; folders older than an hour are removed,
    so downloads and uploaded spec files do not pile up on a long-running server."""
    root = _root()
    _prune(root)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=root))


def write_download(filename: str, content: str | bytes) -> str:
    """Write a file for a download button into its own fresh directory; return its path.

    Each call gets its own directory so the user's file keeps its plain name
    (`train_amp.py`, not a random one) and concurrent users never overwrite each other.
    """
    folder = fresh_dir()
    path = folder / (_SAFE.sub("_", filename) or "download")
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return str(path)


def md_cell(value) -> str:
    """Text safe inside a Markdown table cell."""
    return str("" if value is None else value).replace("|", "\\|").replace("\n", " ")


def fmt_num(value, digits: int = 3) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value:
            return "nan"
        return f"{value:.{digits}g}"
    return str(value)
