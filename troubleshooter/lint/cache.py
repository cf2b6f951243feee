"""A result cache for `lint` on large trees: a file linted before, unchanged, is not analysed again.

Each file's result is stored under a name made from its path. It is reused only when the key
matches: the text the linter read (for a notebook, its cells and where they sit in the file), the
rules in force, the configuration files beside it that framework rules may read (name, size and
modification time of each `*.yaml`, `*.yml`, `*.json` in its folder), the Python version, and the
tool itself (its version plus the size and modification time of every file of the linter, so an
edited checkout never reads stale results). Per-file ignores and excludes apply after the cache,
so changing them needs no fresh analysis.

Where: `.amp_troubleshooter_cache/` in the folder of the pyproject.toml that configures the linter,
else in the working folder; `AMP_TROUBLESHOOTER_CACHE_DIR` or `lint --cache-dir` moves it and
`lint --no-cache` skips it. Like ruff's, the folder holds a `.gitignore` (so git ignores it) and a
`CACHEDIR.TAG` (so backup tools skip it), and deleting it is always safe. Results of other tool
versions are deleted when a run writes its own. Stdin is never cached.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from .. import __version__
from ..findings import Finding
from .edits import Fix
from .engine import LintReport, finding_key
from .source import LintError, SourceUnit

CACHE_DIR_NAME = ".amp_troubleshooter_cache"
CACHE_DIR_ENV = "AMP_TROUBLESHOOTER_CACHE_DIR"
_TAG = "Signature: 8a477f597d28d172789f06886806bc55\n# This folder is a cache made by amp-troubleshooter lint.\n"
_SIDECARS = (".yaml", ".yml", ".json")


def default_dir(config_root: Path | None = None) -> Path:
    env = os.environ.get(CACHE_DIR_ENV, "").strip()
    if env:
        return Path(env)
    return (config_root or Path.cwd()) / CACHE_DIR_NAME


def _tool_fingerprint() -> str:
    """The tool version plus the size and modification time of every file of the linter."""
    h = hashlib.sha256(f"{__version__}\0{sys.version_info[:2]}".encode())
    root = Path(__file__).resolve().parent
    for path in sorted(root.rglob("*")):
        if path.suffix in (".py", ".json") and "__pycache__" not in path.parts:
            st = path.stat()
            h.update(f"{path.relative_to(root)}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return h.hexdigest()[:16]


class LintCache:
    """Per-file lint results under `folder/<tool fingerprint>/`."""

    def __init__(self, folder: str | os.PathLike, rules):
        self.root = Path(folder)
        self.tool = _tool_fingerprint()
        self.folder = self.root / self.tool
        self.rules = ",".join(r.id for r in rules)
        self._sidecars: dict[str, str] = {}
        self._ready = False
        self.broken: str | None = None  # why the cache could not be written, said once
        self.hits = self.misses = 0

    # keys ---------------------------------------------------------------------------------

    def _sidecar_signature(self, folder: str) -> str:
        """Names, sizes and modification times of the config files beside the script (framework
        rules may read them), listed once per folder and run."""
        if folder not in self._sidecars:
            stats = []
            try:
                with os.scandir(folder or ".") as entries:
                    for entry in entries:
                        if entry.name.endswith(_SIDECARS) and entry.is_file():
                            st = entry.stat()
                            stats.append((entry.name, st.st_size, st.st_mtime_ns))
            except OSError:
                pass
            self._sidecars[folder] = hashlib.sha256(repr(sorted(stats)).encode()).hexdigest()
        return self._sidecars[folder]

    def key(self, unit: SourceUnit) -> str:
        state = {"path": unit.path, "text": unit.text, "rules": self.rules,
                 "cells": sorted(unit.cell_map.items()) if unit.cell_map is not None else None,
                 "raw": sorted(unit.raw_lines.items()) if unit.raw_lines else None,
                 "errors": [e.to_dict() for e in unit.errors], "notes": unit.notes,
                 "beside": self._sidecar_signature(os.path.dirname(unit.path))}
        return hashlib.sha256(json.dumps(state, sort_keys=True, default=str).encode("utf-8")).hexdigest()

    def _entry(self, path: str) -> Path:
        name = hashlib.sha256(os.path.abspath(path).encode("utf-8", "surrogateescape")).hexdigest()
        return self.folder / name[:2] / f"{name}.json"

    # read / write -------------------------------------------------------------------------

    def get(self, unit: SourceUnit, key: str) -> LintReport | None:
        try:
            data = json.loads(self._entry(unit.path).read_text(encoding="utf-8"))
            report = _from_json(data["report"]) if data.get("key") == key else None
        except (OSError, ValueError, KeyError, TypeError):
            report = None
        if report is None:
            self.misses += 1
        else:
            self.hits += 1
        return report

    def put(self, unit: SourceUnit, key: str, report: LintReport) -> None:
        if self.broken is not None:
            return
        entry = self._entry(unit.path)
        try:
            self._prepare()
            entry.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=entry.parent, suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump({"key": key, "report": _to_json(report)}, fh)
            os.replace(tmp, entry)  # readers see the old entry or the new one, never half of one
        except OSError as exc:
            self.broken = f"cannot write the lint cache in {self.root}: {exc.strerror or exc} (--no-cache skips it)"

    def _prepare(self) -> None:
        """Create the folder with its .gitignore and CACHEDIR.TAG; drop other tool versions' results."""
        if self._ready:
            return
        tag = self.root / "CACHEDIR.TAG"
        ours = tag.is_file() and "amp-troubleshooter" in tag.read_text(encoding="utf-8", errors="replace")
        if not ours and self.root.is_dir() and any(self.root.iterdir()):  # never litter or prune a user's folder
            raise OSError(f"{self.root} holds other files and is not a lint cache; name a new or empty folder")
        self.folder.mkdir(parents=True, exist_ok=True)
        for name, text in ((".gitignore", "# Made by amp-troubleshooter lint: a cache, never committed.\n*\n"),
                           ("CACHEDIR.TAG", _TAG)):
            if not (self.root / name).exists():
                (self.root / name).write_text(text, encoding="utf-8")
        for other in self.root.iterdir():
            if other.is_dir() and other.name != self.tool and len(other.name) == len(self.tool):
                shutil.rmtree(other, ignore_errors=True)
        self._ready = True


def _to_json(report: LintReport) -> dict:
    return {"findings": [report.finding_dict(f) for f in report.findings],
            "errors": [e.to_dict() for e in report.errors], "notes": report.notes, "files": report.files,
            "notebook_lines": [[*k, v] for k, v in report.notebook_lines.items()]}


def _from_json(data: dict) -> LintReport:
    report = LintReport(errors=[LintError(**e) for e in data["errors"]], files=data["files"],
                        notes=list(data["notes"]),
                        notebook_lines={(p, c, line): raw for p, c, line, raw in data["notebook_lines"]})
    for d in data["findings"]:
        f = Finding.from_dict(d)
        report.findings.append(f)
        if d.get("fix"):
            report.fixes[finding_key(f)] = Fix.from_dict(d["fix"])
    return report
