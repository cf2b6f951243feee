"""Linter settings from `[tool.amp-troubleshooter]` in pyproject.toml, as ruff and flake8 users expect.

    [tool.amp-troubleshooter]
    select = ["AMP1"]                       # rule ids or prefixes; default: every rule
    ignore = ["AMP117"]
    per-file-ignores = { "tests/*" = ["AMP101"], "notebooks/*.ipynb" = ["AMP11"] }

The file is the nearest pyproject.toml with that table, from the working folder upwards (or the
one `--config` names). Per-file patterns are shell globs matched against the path relative to
the file's folder; a pattern without `/` also matches the file name alone. `--select` and
`--ignore` on the command line replace the file's lists.
"""
from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from ..errors import UserError
from .engine import all_rules

TABLE = "amp-troubleshooter"
KEYS = ("select", "ignore", "per-file-ignores")


@dataclass
class LintConfig:
    select: list[str] | None = None
    ignore: list[str] | None = None
    per_file_ignores: dict[str, list[str]] = field(default_factory=dict)
    source: Path | None = None  # the pyproject.toml read, None when there was none

    @property
    def root(self) -> Path:
        return self.source.parent if self.source else Path.cwd()

    def ignored_for(self, path: str | None) -> list[str]:
        """Rule ids/prefixes `per-file-ignores` switches off for this file."""
        if not path or not self.per_file_ignores:
            return []
        absolute = Path(path).resolve()
        try:
            rel = absolute.relative_to(self.root.resolve()).as_posix()
        except ValueError:
            rel = absolute.as_posix()
        out: list[str] = []
        for pattern, ids in self.per_file_ignores.items():
            if fnmatch.fnmatch(rel, pattern) or ("/" not in pattern and fnmatch.fnmatch(absolute.name, pattern)):
                out += ids
        return out

    def drop_per_file_ignores(self, report) -> int:
        """Remove from a LintReport the findings `per-file-ignores` switches off; returns how many."""
        cache: dict[str | None, list[str]] = {}
        kept = []
        for f in report.findings:
            ids = cache.setdefault(f.location.path, self.ignored_for(f.location.path))
            if not any(i == "ALL" or f.rule.startswith(i) for i in ids):
                kept.append(f)
        dropped = len(report.findings) - len(kept)
        report.findings = kept
        return dropped


def find_pyproject(start: str | os.PathLike | None = None) -> Path | None:
    """The nearest pyproject.toml holding [tool.amp-troubleshooter], from `start` upwards."""
    folder = Path(start or os.getcwd()).resolve()
    for candidate in (folder, *folder.parents):
        path = candidate / "pyproject.toml"
        if path.is_file():
            try:
                if TABLE in _read(path).get("tool", {}):
                    return path
            except UserError:
                continue  # a broken pyproject.toml without our table does not stop the search
    return None


def _read(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path} is not valid TOML: {exc}") from None


def _ids(value, where: str) -> list[str]:
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UserError(f"{where} must be a list of rule ids, e.g. [\"AMP101\", \"AMP11\"]")
    ids = [v.strip().upper() for v in value if v.strip()]
    known = [r.id for r in all_rules()]
    bad = [i for i in ids if i != "ALL" and not any(k.startswith(i) for k in known)]
    if bad:
        raise UserError(f"{where}: unknown rule id{'s' if len(bad) > 1 else ''} {', '.join(bad)} "
                        f"(rules are {known[0]}..{known[-1]})")
    return ids


def load_config(path: str | os.PathLike | None = None, start: str | os.PathLike | None = None) -> LintConfig:
    """Settings from `path` (must exist), or from the nearest pyproject.toml; empty when none."""
    if path is not None:
        source = Path(path)
        if not source.is_file():
            raise UserError(f"--config {path}: no such file")
    else:
        source = find_pyproject(start)
        if source is None:
            return LintConfig()
    table = _read(source).get("tool", {}).get(TABLE, {})
    where = f"{source} [tool.{TABLE}]"
    if not isinstance(table, dict):
        raise UserError(f"{where} must be a table")
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise UserError(f"{where}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} "
                        f"(known: {', '.join(KEYS)})")
    per_file = table.get("per-file-ignores", {})
    if not isinstance(per_file, dict):
        raise UserError(f"{where} per-file-ignores must be a table of glob = [rule ids]")
    return LintConfig(
        select=_ids(table["select"], f"{where} select") if "select" in table else None,
        ignore=_ids(table["ignore"], f"{where} ignore") if "ignore" in table else None,
        per_file_ignores={str(k): _ids(v, f"{where} per-file-ignores {k!r}") for k, v in per_file.items()},
        source=source,
    )
