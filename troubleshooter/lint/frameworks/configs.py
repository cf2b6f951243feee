"""Configuration files that live beside a training script: an accelerate config YAML, a DeepSpeed
JSON, a Lightning CLI YAML, a Hugging Face arguments JSON/YAML.

Why: with a framework, the precision is often not in the script at all. `accelerate launch` reads
`mixed_precision: fp16` from a YAML, DeepSpeed reads `"fp16": {"enabled": true}` from a JSON the
script names, `LightningCLI` reads `trainer.precision` from a YAML. The linter reads them only for
files it read from disk (the CLI), never for text handed to `lint_text` (an upload names no folder),
and only the folder the script is in (plus paths the script names below that folder); each file is
capped at MAX_BYTES and at most MAX_FILES are looked at.
"""
from __future__ import annotations

import json
import os
import re
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

MAX_BYTES = 256 * 1024
MAX_FILES = 40
_SUFFIXES = (".yaml", ".yml", ".json")

# Keys that say what a config file is (top level unless dotted).
_KINDS = (
    ("deepspeed", {"zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size", "gradient_clipping",
                   "zero_allow_untested_optimizer", "steps_per_print", "fp16", "bf16"}),
    ("accelerate", {"compute_environment", "distributed_type", "mixed_precision", "num_processes"}),
    ("lightning", {"trainer"}),
    ("hf_args", {"output_dir", "per_device_train_batch_size", "model_name_or_path", "learning_rate"}),
)


@dataclass
class ConfigFile:
    """One parsed configuration file and where its keys sit (for evidence with a line number)."""

    path: str
    data: Any
    text: str
    kinds: set[str] = field(default_factory=set)

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    def get(self, *keys: str, default: Any = None) -> Any:
        node = self.data
        for k in keys:
            if not isinstance(node, dict) or k not in node:
                return default
            node = node[k]
        return node

    def has(self, *keys: str) -> bool:
        marker = object()
        return self.get(*keys, default=marker) is not marker

    def line_of(self, *keys: str) -> int | None:
        """The line of the last key of a path (`"fp16"` then `"enabled"`), each searched after the one
        before it (on the same line too: `"fp16": {"enabled": true}`)."""
        lines = self.text.splitlines()
        row, col, line = 0, 0, None
        for k in keys:
            pat = re.compile(r'(^|[\s{,])["\']?' + re.escape(k) + r'["\']?\s*:')
            for i in range(row, len(lines)):
                mt = pat.search(lines[i], col if i == row else 0)
                if mt:
                    row, col, line = i, mt.end(), i + 1
                    break
            else:
                return line
        return line

    def where(self, *keys: str) -> str:
        line = self.line_of(*keys)
        return f"{self.name}:{line}" if line else self.name


_CACHE: dict[tuple, "ConfigFile | None"] = {}  # (path, mtime, size) -> parsed: a folder's configs parse once per run


def _parse(path: str) -> ConfigFile | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (path, st.st_mtime_ns, st.st_size)
    if key not in _CACHE:
        if len(_CACHE) > 512:
            _CACHE.clear()
        _CACHE[key] = _parse_now(path)
    return _CACHE[key]


def _parse_now(path: str) -> ConfigFile | None:
    try:
        if os.path.getsize(path) > MAX_BYTES:
            return None
        with open(path, "rb") as fh:
            text = fh.read().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    try:
        if path.endswith(".json"):
            data = json.loads(text)
        else:  # bounded like every YAML from a user: a few hundred bytes of aliases can expand to billions
            from ...safeyaml import load as load_yaml

            data = load_yaml(text, os.path.basename(path))
    except Exception:  # noqa: BLE001 - a config we cannot parse (or refuse to) is simply not evidence
        return None
    if not isinstance(data, dict):
        return None
    cfg = ConfigFile(path, data, text)
    keys = set(data)
    for kind, markers in _KINDS:
        if kind == "deepspeed" and not (keys & (markers - {"fp16", "bf16"})) and not (
                isinstance(data.get("fp16"), dict) or isinstance(data.get("bf16"), dict)):
            continue  # HF arguments also say "fp16": true; DeepSpeed's blocks are mappings
        if kind == "lightning" and not isinstance(data.get("trainer"), dict):
            continue
        if kind == "accelerate" and not ({"compute_environment", "distributed_type"} & keys):
            continue
        if keys & markers:
            cfg.kinds.add(kind)
    return cfg


# folder -> its config file names, for the duration of one lint run (`listing_cache`); None outside one
_RUN_LISTINGS: ContextVar[dict[str, list[str]] | None] = ContextVar("config_listings", default=None)


@contextmanager
def listing_cache():
    """List each folder once for the run inside this block: every script of a folder asks for the config
    files beside it, and a tree has thousands of scripts in a few hundred folders."""
    token = _RUN_LISTINGS.set({})
    try:
        yield
    finally:
        _RUN_LISTINGS.reset(token)


def _config_names(folder: str) -> list[str]:
    """The config file names in `folder`, sorted, at most MAX_FILES (none when it is not a folder)."""
    cache = _RUN_LISTINGS.get()
    if cache is not None and folder in cache:
        return cache[folder]
    names: list[str] = []
    if os.path.isdir(folder):
        try:
            names = sorted(n for n in os.listdir(folder) if n.endswith(_SUFFIXES))[:MAX_FILES]
        except OSError:
            names = []
    if cache is not None:
        cache[folder] = names
    return names


class Configs:
    """The configuration files beside one script, parsed lazily and once."""

    def __init__(self, script_path: str | None):
        self.folder = os.path.dirname(os.path.abspath(script_path)) if script_path else None
        self._beside: list[ConfigFile] | None = None
        self._named: dict[str, ConfigFile | None] = {}

    def may_have_beside(self) -> bool:
        """Some config file name is in the folder (`beside` is empty otherwise): a listing, no file read."""
        return bool(self.folder and _config_names(self.folder))

    def beside(self) -> list[ConfigFile]:
        if self._beside is None:
            self._beside = []
            if self.folder:
                for n in _config_names(self.folder):
                    cfg = self.named(n)
                    if cfg is not None:
                        self._beside.append(cfg)
        return self._beside

    def named(self, rel: str) -> ConfigFile | None:
        """A file the script names (`"ds_config.json"`, `"configs/zero2.json"`), relative to its
        folder and inside it; None when absent, outside the folder, too big or not a mapping."""
        if not self.folder or not isinstance(rel, str) or not rel.endswith(_SUFFIXES):
            return None
        if rel not in self._named:
            path = os.path.normpath(os.path.join(self.folder, rel))
            inside = path == self.folder or path.startswith(self.folder + os.sep)
            self._named[rel] = _parse(path) if inside and os.path.isfile(path) else None
        return self._named[rel]

    def of_kind(self, kind: str) -> list[ConfigFile]:
        return [c for c in self.beside() if kind in c.kinds]


def configs_of(m) -> Configs:
    """The Configs of a FileModel (none for text that came from no folder)."""
    return m.memo.get(("configs",), lambda: Configs(getattr(m, "script_path", None)))
