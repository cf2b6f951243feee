"""Where a spec comes from, as a small picklable value that can be handed to a worker process."""
from __future__ import annotations

import os
from dataclasses import dataclass

KINDS = ("yaml", "preset", "python")
MAX_READ_CHARS = 1024 * 1024  # more than the YAML size limit, so an oversized file is still refused as such


@dataclass(frozen=True)
class SpecSource:
    """kind 'yaml': value is the YAML text (or a path when `is_path`); 'preset': 'gpt:d_model=768';
    'python': the path of a file with build_model() and make_batch(batch_size)."""

    kind: str
    value: str
    base_dir: str | None = None  # where relative paths in a YAML spec (weights:) are resolved
    is_path: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")

    @classmethod
    def yaml_file(cls, path: str | os.PathLike) -> "SpecSource":
        path = os.path.abspath(os.fspath(path))
        return cls("yaml", path, base_dir=os.path.dirname(path), is_path=True)

    @classmethod
    def yaml_text(cls, text: str, base_dir: str | os.PathLike | None = None) -> "SpecSource":
        return cls("yaml", text, base_dir=os.fspath(base_dir) if base_dir is not None else None)

    @classmethod
    def preset(cls, text: str) -> "SpecSource":
        return cls("preset", text.strip())

    @classmethod
    def python_file(cls, path: str | os.PathLike) -> "SpecSource":
        return cls("python", os.path.abspath(os.fspath(path)), is_path=True)

    def describe(self) -> str:
        if self.kind == "preset":
            return f"preset {self.value}"
        if self.is_path:
            return self.value
        return "YAML spec"

    def read_text(self) -> str:
        """The YAML text (reading the file for `yaml_file` sources)."""
        from ..errors import SpecError

        if not self.is_path:
            return self.value
        try:
            with open(self.value, encoding="utf-8") as fh:
                return fh.read(MAX_READ_CHARS)  # past the spec size limit, which parse_yaml refuses
        except FileNotFoundError:
            raise SpecError(f"spec file not found: {self.value}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise SpecError(f"cannot read spec file {self.value}: {exc}") from None
