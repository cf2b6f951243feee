"""What every tab needs: read an upload safely, turn any error into a sentence, write downloads.

Users upload whatever they have at hand (a checkpoint instead of a script, a 2 GB log); each
such mistake must come back as one readable sentence, never a traceback, so the page stays
usable.
"""
from __future__ import annotations

import atexit
import logging
import os
import re
import shutil
import tempfile
import threading
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
    """The server path of a file the caller uploaded, or None when nothing was given.

    Gradio hands page components a filepath str and API endpoints a FileData dict/object; a raw
    HTTP caller can put any string or dict there. Whatever the form, the file must lie in Gradio's
    upload folder (where an upload lands, under a directory named by a hash of its content and
    this server's secret seed): a path naming any other server file is refused, so a caller can
    read only what it uploaded itself."""
    if upload is None or upload == "":
        return None
    if isinstance(upload, (str, os.PathLike)):
        path = os.fspath(upload)
    elif isinstance(upload, dict):
        path = upload.get("path")
    else:
        path = getattr(upload, "path", None) or getattr(upload, "name", None)
    if not path:
        return None
    if not isinstance(path, str):
        raise UserError("a file must be sent as an upload (gradio_client.handle_file, or send it to "
                        "Gradio's upload endpoint first and pass the path it returns)")
    return _in_upload_folder(path)


def upload_folder() -> str:
    """Gradio's upload folder (GRADIO_TEMP_DIR, else <tmp>/gradio), resolved."""
    from gradio.utils import get_upload_folder

    return os.path.realpath(get_upload_folder())


def _in_upload_folder(path: str) -> str:
    folder = upload_folder()
    real = os.path.realpath(path)
    name = Path(path).name or "the file"
    if folder == os.path.sep or real == folder or os.path.commonpath([folder, real]) != folder:
        raise UserError(f"{name}: not an uploaded file; this server reads only files uploaded with the "
                        "request (gradio_client.handle_file, or send the file to Gradio's upload endpoint "
                        "first and pass the path it returns)")
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


# Advice written for the command line, reworded for the page and for the API: their users set
# these through controls or parameters, and cannot set the server's options or environment.
# (pattern, the page's words, the API's words)
_CLI_ADVICE = [
    (r"\s*\((?:raise it with|shrink the batch or raise) [^)]*TROUBLESHOOTER_MAX_\w+[^)]*\)",
     " (a limit this server's operator sets)", " (a limit this server's operator sets)"),
    (r"TROUBLESHOOTER_MAX_\w+(?:=\S+)?", "the server's model-size limit", "the server's model-size limit"),
    (r"\b[Rr]aise --timeout\b", "Ask the server's operator for a longer time limit",
     "Ask the server's operator for a longer time limit"),
    (r"python -m troubleshooter check --only (\w+)", r"the Check a model tab, with only its \1 check",
     r'the /check endpoint with checks="\1"'),
    (r"\s*\(--only\)", "", " (checks)"),
    (r"--only names no check", "choose at least one check", "checks names no check"),
    (r"a larger --budget\b", "a larger time budget", "a larger budget_s"),
    (r"--budget\b", "the time budget", "budget_s"),
    (r"\(run without --compile\)", "(run without torch.compile)", "(compile=False)"),
    (r"try --compile\b", "try torch.compile", "try compile=True"),
    (r"run with --device (\w+)", r"choose the device \1", r'pass device="\1"'),
    (r"\(use --device (\w+)\)", r"(choose the device \1)", r'(device="\1")'),
    (r"in --precisions\b", "in the precisions", "in precisions"),
    (r"--precisions\b", "the precisions", "precisions"),
    (r"--only\b", "the checks", "checks"),
    (r"--(select|ignore)\b", r"\1", r"\1"),
    (r"see `python -m troubleshooter rules`", "see the rule list (Explain a rule, in the Diagnose tab)",
     "see the /rules endpoint"),
    (r"`python -m troubleshooter check`", "the Check a model tab", "the /check endpoint"),
    (r"`python -m troubleshooter speedup`", "the Speedup check tab", "the /speedup endpoint"),
    (r"run `python -m troubleshooter lint [^`]*`", "diagnose the script (the Diagnose a script tab)",
     "lint the script (the /lint endpoint)"),
    (r"rerun with --nan\b", "trace it from the command line with `trace --nan` (the page traces without the NaN hooks)",
     "trace it from the command line with `trace --nan` (the /trace endpoint runs without the NaN hooks)"),
    (r"--steps\b", "steps", "steps"),
    (r"--autocast-policy host", "choose \"this CPU's own\" under Autocast op lists",
     'pass autocast_policy="host"'),
]
_PAGE_WORDS = [(re.compile(pattern), page) for pattern, page, _ in _CLI_ADVICE]
_API_WORDS = [(re.compile(pattern), api) for pattern, _, api in _CLI_ADVICE]


def for_page(text: str) -> str:
    """Library text as the page says it: no command-line flags or environment variables the
    reader cannot set from a browser; the page's controls instead."""
    return _reword(text, _PAGE_WORDS)


def for_api(text: str) -> str:
    """Library text as the API says it: the endpoints' parameter names (`budget_s`, `checks`,
    `device="cpu"`) instead of the command line's flags."""
    return _reword(text, _API_WORDS)


def _reword(text: str, rules) -> str:
    text = str(text)
    for pattern, repl in rules:
        text = pattern.sub(repl, text)
    return text


_DATA_KEYS = frozenset({"fix", "edits", "samples_ms", "losses", "text", "code", "argv"})  # data, not words


def api_words(value):
    """A JSON result with every message in the API's words (`for_api`); code, fixes and
    measurements are left exactly as they are."""
    if isinstance(value, str):
        return for_api(value) if "--" in value or "troubleshooter" in value.lower() else value
    if isinstance(value, dict):
        return {k: v if k in _DATA_KEYS else api_words(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [api_words(v) for v in value]
    return value


def error_message(exc: BaseException, surface: str = "page") -> str:
    """One readable sentence for any exception, in the words of the `surface` showing it ("page"
    or "api"); a bug in our code is logged with its traceback."""
    if isinstance(exc, UserError):
        text = public_text(str(exc))
        return for_api(text) if surface == "api" else for_page(text)
    if isinstance(exc, MemoryError):
        return "the server ran out of memory for this request; try a smaller model or input"
    log.exception("unexpected error in an app callback")
    text = public_text(f"{type(exc).__name__}: {exc}".strip())
    return f"internal error ({text}); this is a bug in the troubleshooter, the server log has details"


def stamp() -> str:
    """The time a result was made (the server's clock), shown beside the input it belongs to,
    so a result on screen is never mistaken for the one before it."""
    return time.strftime("%H:%M:%S")


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


_ROOT_PREFIX = "amp-troubleshooter-downloads-"
UPLOAD_CACHE_CLEANUP = (900, 2 * 3600)  # gr.Blocks(delete_cache=...): every 15 min, uploads older than 2 h


def _root() -> Path:
    """This server's scratch root (downloads, staged specs and scripts): removed when the server
    exits; roots that crashed servers left behind are removed once older than the TTL."""
    global _download_root
    if _download_root is None or not _download_root.is_dir():
        _remove_stale_roots()
        _download_root = Path(tempfile.mkdtemp(prefix=_ROOT_PREFIX))
        atexit.register(shutil.rmtree, str(_download_root), True)
    return _download_root


def _remove_stale_roots() -> None:
    cutoff = time.time() - _DOWNLOAD_TTL_S
    for old in Path(tempfile.gettempdir()).glob(_ROOT_PREFIX + "*"):
        try:
            if old.is_dir() and not old.is_symlink() and old.stat().st_mtime < cutoff \
                    and all(p.stat().st_mtime < cutoff for p in old.iterdir()):
                shutil.rmtree(old, ignore_errors=True)
        except OSError:
            pass


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


_PLOTTING_WARMED = threading.Event()


def warm_plotting() -> None:
    """Import matplotlib and draw one throwaway figure in a background thread, once per process.

    The server first needs matplotlib when a speedup or check job returns, and importing it and
    building its font cache took 2.5 s there on a busy 2-core host (0.3 s for a later plot): time
    the user waits after the budget is spent. Started with the job, it is done before the job is.
    """
    if _PLOTTING_WARMED.is_set():
        return
    _PLOTTING_WARMED.set()

    def draw() -> None:
        try:
            import io

            import matplotlib

            matplotlib.use("Agg")
            from matplotlib.figure import Figure

            fig = Figure(figsize=(1, 1))
            fig.add_subplot().plot([0, 1], [0, 1], label="x")
            fig.savefig(io.BytesIO(), format="png")
        except Exception:  # noqa: BLE001 - a warm-up only: the real plot reports its own failure
            pass

    threading.Thread(target=draw, name="warm-plotting", daemon=True).start()


def save_figure(fig, filename: str) -> str | None:
    """A matplotlib figure as a PNG download (None when there is no figure)."""
    if fig is None:
        return None
    path = write_download(filename, b"")
    fig.savefig(path, format="png", bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path

