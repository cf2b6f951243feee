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
    """Gradio hands a filepath str (page components) or a FileData dict/object (API endpoints);
    normalise to a str. A FileData path must lie in Gradio's upload folder: an API caller names
    it, and must not make the server read its own files."""
    if upload is None or upload == "":
        return None
    if isinstance(upload, (str, os.PathLike)):
        return str(upload)
    if isinstance(upload, dict):
        path = upload.get("path")
    else:
        path = getattr(upload, "path", None) or getattr(upload, "name", None)
    if not path:
        return None
    return _in_upload_folder(str(path))


def _in_upload_folder(path: str) -> str:
    from gradio.utils import get_upload_folder

    folder = os.path.realpath(get_upload_folder())
    real = os.path.realpath(path)
    if os.path.commonpath([folder, real]) != folder:
        raise UserError(f"{Path(path).name}: not an uploaded file (send files with gradio_client.handle_file)")
    return real


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


# pickle's name for a class defined in the script that saved a checkpoint
_MAIN_CLASS = re.compile(r"\b__main__\.(\w+)")


def public_text(text: str) -> str:
    """A message fit for a user: server paths reduced to the file's own name (an upload's name is
    the one the user gave it), C++ assertion prefixes dropped, `__main__.X` said in words."""
    text = _ENFORCE.sub("", str(text))
    text = _MAIN_CLASS.sub(r"class `\1` from the script that saved it", text)
    return _ABS_PATH.sub(lambda m: m.group(1), text)


# Advice written for the command line, reworded for people who use the page or the API: they
# set these through controls/parameters, and cannot set the server's environment at all.
_CLI_ADVICE = [
    (re.compile(r"\s*\((?:raise it with|shrink the batch or raise) [^)]*TROUBLESHOOTER_MAX_\w+[^)]*\)"),
     " (a limit this server's operator sets)"),
    (re.compile(r"TROUBLESHOOTER_MAX_\w+(?:=\S+)?"), "the server's model-size limit"),
    (re.compile(r"\s*\(--only\)"), ""),
    (re.compile(r"--only names no check"), "choose at least one check"),
    (re.compile(r"a larger --budget\b"), "a larger time budget"),
    (re.compile(r"--budget\b"), "the time budget"),
    (re.compile(r"\(run without --compile\)"), "(run without torch.compile)"),
    (re.compile(r"try --compile\b"), "try torch.compile"),
    (re.compile(r"run with --device (\w+)"), r"choose the device \1"),
    (re.compile(r"\(use --device (\w+)\)"), r"(choose the device \1)"),
    (re.compile(r"--only\b"), "the checks"),
    (re.compile(r"--(select|ignore)\b"), r"\1"),
    (re.compile(r"see `python -m troubleshooter rules`"), "see the rule list (the `rules` endpoint)"),
    (re.compile(r"`python -m troubleshooter check`"), "the Check a model tab (the `check` endpoint)"),
    (re.compile(r"`python -m troubleshooter speedup`"), "the Speedup check tab (the `speedup` endpoint)"),
    (re.compile(r"--steps\b"), "steps"),
    (re.compile(r"--autocast-policy host"), "set the autocast op lists to this CPU's own (autocast_policy=host)"),
]


def for_page(text: str) -> str:
    """Library text as the page and API say it: no command-line flags or environment variables
    the reader cannot set from a browser."""
    text = str(text)
    for pattern, repl in _CLI_ADVICE:
        text = pattern.sub(repl, text)
    return text


def error_message(exc: BaseException) -> str:
    """One readable sentence for any exception; a bug in our code is logged with its traceback."""
    if isinstance(exc, UserError):
        return for_page(public_text(str(exc)))
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


def download_root() -> Path:
    """Where generated downloads live (only they: uploads are staged beside it, not in it), so
    the server may hand out files from here (`allowed_paths`) and from nowhere else."""
    folder = _root() / "downloads"
    folder.mkdir(exist_ok=True)
    return folder


def _prune(root: Path) -> None:
    cutoff = time.time() - _DOWNLOAD_TTL_S
    for child in root.iterdir():
        if child.name == "downloads":
            _prune(child)
            continue
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
    _prune(_root())
    folder = Path(tempfile.mkdtemp(dir=download_root()))
    path = folder / (_SAFE.sub("_", filename) or "download")
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return str(path)


def save_figure(fig, filename: str) -> str | None:
    """A matplotlib figure as a PNG download (None when there is no figure)."""
    if fig is None:
        return None
    path = write_download(filename, b"")
    fig.savefig(path, format="png", bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path

