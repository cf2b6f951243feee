"""Linter settings from `[tool.amp-troubleshooter]` in pyproject.toml, as ruff and flake8 users expect.

    [tool.amp-troubleshooter]
    select = ["AMP1"]                       # rule ids or prefixes; default: every rule
    ignore = ["AMP117"]
    per-file-ignores = { "tests/*" = ["AMP101"], "notebooks/*.ipynb" = ["AMP11"] }
    exclude = ["third_party", "legacy/*.py"]   # not reported at all, even when named on the command line

The file is the nearest pyproject.toml with that table, from the working folder upwards (or the
one `--config` names). Patterns are shell globs matched against the path relative to the file's
folder; a pattern without `/` also matches any single file or folder name in that path.
`--select`, `--ignore` and `--exclude` on the command line replace the file's lists.
"""
from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserError
from .engine import all_rules

TABLE = "amp-troubleshooter"
KEYS = ("select", "ignore", "per-file-ignores", "exclude")


@dataclass
class LintConfig:
    """The `[tool.amp-troubleshooter]` settings in effect (empty when no pyproject.toml has the table)."""

    select: list[str] | None = None
    ignore: list[str] | None = None
    per_file_ignores: dict[str, list[str]] = field(default_factory=dict)
    exclude: list[str] = field(default_factory=list)
    source: Path | None = None  # the pyproject.toml read, None when there was none

    @property
    def root(self) -> Path:
        return self.source.parent if self.source else Path.cwd()

    def _matches(self, path: str, pattern: str) -> bool:
        """Glob against the path relative to the config's folder; without `/`, against any name in it."""
        absolute = Path(path).resolve()
        try:
            rel = absolute.relative_to(self.root.resolve())
        except ValueError:
            rel = absolute
        if fnmatch.fnmatch(rel.as_posix(), pattern):
            return True
        return "/" not in pattern and any(fnmatch.fnmatch(part, pattern) for part in rel.parts)

    def ignored_for(self, path: str | None) -> list[str]:
        """Rule ids/prefixes `per-file-ignores` switches off for this file."""
        if not path or path == "-" or not self.per_file_ignores:
            return []
        return [i for pattern, ids in self.per_file_ignores.items() if self._matches(path, pattern) for i in ids]

    def is_excluded(self, path: str | None) -> bool:
        return bool(path) and path != "-" and any(self._matches(path, p) for p in self.exclude)

    def apply(self, report) -> None:
        """Drop from a LintReport what `exclude` (findings and read errors) and `per-file-ignores` remove."""
        ignored: dict[str | None, list[str]] = {}
        excluded: dict[str | None, bool] = {}

        def keep(f) -> bool:
            path = f.location.path
            if path not in excluded:
                excluded[path] = self.is_excluded(path)
                ignored[path] = self.ignored_for(path)
            return not excluded[path] and not any(i == "ALL" or f.rule.startswith(i) for i in ignored[path])

        report.findings = [f for f in report.findings if keep(f)]
        if self.exclude:
            report.errors = [e for e in report.errors if not self.is_excluded(e.path)]


def find_pyproject(start: str | os.PathLike | None = None) -> Path | None:
    """The nearest pyproject.toml holding [tool.amp-troubleshooter], from `start` upwards. One that
    is not valid TOML is passed over, unless it names our table: then its settings were meant to
    apply, and silently linting without them would hide the mistake."""
    folder = Path(start or os.getcwd()).resolve()
    for candidate in (folder, *folder.parents):
        path = candidate / "pyproject.toml"
        if path.is_file() and _may_name_our_table(path):
            try:
                if _our_table(_read(path)) is not None:
                    return path
            except UserError:
                if _names_our_table(path):
                    raise
                continue  # a broken pyproject.toml without our table does not stop the search
    return None


def _inside(folder: str | os.PathLike, other: str | os.PathLike) -> bool:
    """`folder` is `other` or below it: a search from `folder` upwards has passed `other`'s chain."""
    return Path(folder).resolve().is_relative_to(Path(other).resolve())


MAX_PYPROJECT_BYTES = 1024 * 1024


def _read(path: Path) -> dict:
    from ..bounded import InputRefused, read_bytes

    try:  # here, not at the top: a lint run with no pyproject.toml table imports no TOML parser (~3 ms)
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    try:
        text = read_bytes(str(path), MAX_PYPROJECT_BYTES).decode("utf-8")
        return tomllib.loads(text)
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    except InputRefused as exc:
        raise UserError(f"cannot read {exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path} is not valid TOML: {exc}") from None
    except RecursionError:
        raise UserError(f"{path} is not valid TOML: it nests too deeply") from None


def _head(path: Path) -> bytes | None:
    """The file's bytes up to the reader's limit (one more, so an oversized file still says so);
    None when it cannot be opened."""
    try:
        with open(path, "rb") as fh:
            return fh.read(MAX_PYPROJECT_BYTES + 1)
    except OSError:
        return None


# Where TOML can put our table: the dotted path `tool.amp-troubleshooter` (a header, a dotted key; keys
# bare or quoted, blanks around the dot), or the name as a key of a `[tool]` table or a `tool = {...}`
# inline table. A file that only lists amp-troubleshooter as a dependency or a script shows none.
# (A pattern, compiled by `re` on first use: most files never spell the name.)
_TABLE_PLACE = (rb"""tool["']?[ \t]*\.[ \t]*["']?amp-troubleshooter"""
                rb"""|^[ \t]*\[\[?[ \t]*["']?tool["']?[ \t]*\]"""
                rb"""|\btool["']?[ \t]*=""")


def _may_name_our_table(path: Path) -> bool:
    """False only when the file cannot hold our table: its bytes hold no TOML \\u/\\U escape (the one
    way a quoted key can hide a name), and they either never spell the name or spell it nowhere a
    table of that name can be (`_TABLE_PLACE`). Most projects' pyproject.toml is then not parsed at
    all, nor the TOML parser imported (~4 ms of a small lint's start-up)."""
    raw = _head(path)
    if raw is None or b"\\u" in raw or b"\\U" in raw:  # unreadable: `_read` says why
        return True
    return TABLE.encode() in raw and re.search(_TABLE_PLACE, raw, re.M) is not None


def _names_our_table(path: Path) -> bool:
    return TABLE.encode() in (_head(path) or b"")[:MAX_PYPROJECT_BYTES]


def _our_table(data: dict):
    """`[tool.amp-troubleshooter]` of parsed TOML, or None when there is none (`tool` may be
    anything in someone's pyproject.toml, e.g. `tool = 5`)."""
    tool = data.get("tool")
    return tool.get(TABLE) if isinstance(tool, dict) else None


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


def _globs(value, where: str) -> list[str]:
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UserError(f"{where} must be a list of glob patterns, e.g. [\"third_party/*\", \"legacy.py\"]")
    return [v.strip() for v in value if v.strip()]


def load_config(path: str | os.PathLike | None = None, start: str | os.PathLike | None = None) -> LintConfig:
    """Settings from `path` (must exist), or from the nearest pyproject.toml above `start`, else
    above the working folder (as ruff's settings for files outside any configured project);
    empty when none."""
    if path is not None:
        source = Path(path)
        if not source.is_file():
            raise UserError(f"--config {path}: no such file")
    else:
        source = find_pyproject(start)
        if source is None and start is not None and not _inside(start, os.getcwd()):
            source = find_pyproject()  # the working folder's chain: not searched yet
        if source is None:
            return LintConfig()
    table = _our_table(_read(source))
    table = {} if table is None else table
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
        exclude=_globs(table.get("exclude", []), f"{where} exclude"),
        source=source,
    )
