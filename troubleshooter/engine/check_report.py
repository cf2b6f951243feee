"""`CheckReport`: one check run as a typed, picklable object.

The app runs a check in a worker process and the CLI runs it in-process; both get this object
(the engine's own result classes inside it), and JSON exists only at the edge: `to_dict()`
gives exactly the `check --format json` object and `from_dict()` reads one back. Keys this
version does not know (a newer engine's) are carried in `extra`, and a section the engine's
class cannot rebuild exactly stays the engine's dict, so nothing a check measured is lost
on the way.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..findings import Finding
from ..jsonsafe import jsonable

CHECKS = ("capability", "alignment", "skiprate", "nan", "headroom")
# The top-level keys in the order `run_check` writes them (`job` is added by the app).
_ORDER = ("device", "spec", "findings", *CHECKS, "skipped", "alignment_summary", "errors", "timings_s",
          "seed", "steps", "budget", "exit_code", "job")


@dataclass
class CheckError:
    """Why a check has no (or an incomplete) section: `failed`, `incomplete`, `budget`,
    `out_of_memory` or `not_available`; `precisions` names the ones not verified."""
    kind: str
    message: str
    precisions: list[str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def blocks_verdict(self) -> bool:
        """Everything but a check this build lacks means the run must not read as clean."""
        return self.kind != "not_available"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        if self.precisions is not None:
            out["precisions"] = list(self.precisions)
        out["message"] = self.message
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any] | str) -> "CheckError":
        if not isinstance(d, dict):
            return cls("failed", str(d))
        rest = {k: v for k, v in d.items() if k not in ("kind", "message", "precisions")}
        return cls(str(d.get("kind", "failed")), str(d.get("message", "")), d.get("precisions"), rest)


@dataclass
class BudgetInfo:
    """What the time budget was and what it cut (`cut`: one sentence per shortened check)."""
    budget_s: float | None
    cut: list[str] = field(default_factory=list)
    exceeded_s: float | None = None
    suggested_s: float | None = None  # with a cut: a budget expected to fit the rest
    more: str | None = None  # with a cut: how to ask for it (command-line words; the page and API reword)

    def to_dict(self) -> dict[str, Any]:
        out = {"budget_s": self.budget_s, "cut": list(self.cut), "exceeded_s": self.exceeded_s}
        if self.suggested_s is not None:
            out.update(suggested_s=self.suggested_s, more=self.more)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "BudgetInfo | None":
        if d is None:
            return None
        return cls(d.get("budget_s"), list(d.get("cut") or []), d.get("exceeded_s"), d.get("suggested_s"),
                   d.get("more"))


@dataclass
class CheckReport:
    """Every answer of one check run. Sections are None when the check did not run (see
    `skipped` and `errors`); `device` and `spec` are the engine's `describe_device` and
    `spec_info` dicts."""
    device: dict[str, Any]
    spec: dict[str, Any]
    findings: list[Finding] = field(default_factory=list)
    capability: Any = None  # engine.capability.CapabilityReport (its findings are in `findings`)
    alignment: Any = None  # list[engine.alignment.AlignmentRow]
    alignment_summary: dict[str, Any] | None = None
    skiprate: Any = None  # engine.skiprate.SkipRateResult
    nan: dict[str, Any] | None = None  # the NaN hunt's own dict: {"precisions": {...}, ...}
    headroom: Any = None  # engine.headroom.HeadroomResult
    skipped: dict[str, str] = field(default_factory=dict)
    errors: dict[str, CheckError] = field(default_factory=dict)
    timings_s: dict[str, float] = field(default_factory=dict)
    seed: int = 0
    steps: int = 0
    budget: BudgetInfo | None = None
    exit_code: int = 0
    job: dict[str, Any] | None = None  # when and where the app ran it (server-side times)
    extra: dict[str, Any] = field(default_factory=dict)  # keys a newer engine added
    key_order: tuple[str, ...] = field(default=(), compare=False, repr=False)  # as read, so JSON reads the same

    # ------------------------------------------------------------ reading
    @property
    def failed_checks(self) -> dict[str, CheckError]:
        """The checks that could not finish: nothing was verified there."""
        return {n: e for n, e in self.errors.items() if e.blocks_verdict}

    def section(self, name: str) -> dict[str, Any] | list | None:
        """A check's section as it appears in the JSON (None when it did not run)."""
        return _section_to_json(name, getattr(self, name))

    # ------------------------------------------------------------ JSON at the edge
    def to_dict(self) -> dict[str, Any]:
        """Exactly the `check --format json` object (plus `job` when the app ran it)."""
        out: dict[str, Any] = {"device": self.device, "spec": self.spec,
                               "findings": [f.to_dict() for f in self.findings]}
        out.update({c: self.section(c) for c in CHECKS})
        out["skipped"] = dict(self.skipped)
        if self.alignment_summary is not None:
            out["alignment_summary"] = self.alignment_summary
        out["errors"] = {n: e.to_dict() for n, e in self.errors.items()}
        out["timings_s"] = dict(self.timings_s)
        out["seed"] = self.seed
        out["steps"] = self.steps
        out["budget"] = None if self.budget is None else self.budget.to_dict()
        out.update(self.extra)
        out["exit_code"] = self.exit_code
        if self.job is not None:
            out["job"] = self.job
        if self.key_order:  # a newer engine's keys stay where it wrote them
            rank = {k: i for i, k in enumerate(self.key_order)}
            out = dict(sorted(out.items(), key=lambda kv: rank.get(kv[0], len(rank))))
        return jsonable(out)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CheckReport":
        """Read a `check --format json` object (what `to_dict` or the engine wrote)."""
        if not isinstance(d, dict) or "device" not in d or "spec" not in d:
            raise ValueError("not a check report: expected the `check --format json` object")
        known = set(_ORDER)
        return cls(
            device=d["device"], spec=d["spec"],
            findings=[Finding.from_dict(f) for f in d.get("findings") or []],
            capability=_section_from_json("capability", d.get("capability")),
            alignment=_section_from_json("alignment", d.get("alignment")),
            alignment_summary=d.get("alignment_summary"),
            skiprate=_section_from_json("skiprate", d.get("skiprate")),
            nan=d.get("nan"),
            headroom=_section_from_json("headroom", d.get("headroom")),
            skipped=dict(d.get("skipped") or {}),
            errors={n: CheckError.from_dict(e) for n, e in (d.get("errors") or {}).items()},
            timings_s=dict(d.get("timings_s") or {}),
            seed=d.get("seed", 0), steps=d.get("steps", 0),
            budget=BudgetInfo.from_dict(d.get("budget")),
            exit_code=int(d.get("exit_code", 0)),
            job=d.get("job"),
            extra={k: v for k, v in d.items() if k not in known},
            key_order=tuple(d),
        )


# ---------------------------------------------------------------- sections <-> the engine's classes


def _capability(section: dict[str, Any]):
    from .capability import CapabilityReport

    fixed = ("device", "kind", "name", "recommended_precision", "reason", "notes", "summary")
    facts = {k: v for k, v in section.items() if k not in fixed}
    return CapabilityReport(section["device"], section["kind"], section["name"], section["recommended_precision"],
                            section["reason"], facts, list(section.get("notes") or []))


def _alignment(section: list[dict[str, Any]]):
    from .results import AlignmentRow

    return [AlignmentRow(r["module"], r["class"], r["dimension"], r["value"], r["multiple"], r.get("flops_share"),
                         r.get("note")) for r in section]


def _skiprate(section: dict[str, Any]):
    from .results import SkipRateResult

    return SkipRateResult(section["steps"], section["summary"], section["recommendation"], [],
                          section["device"], section["seed"], section["init_scale"])


def _headroom(section: dict[str, Any]):
    from .results import HeadroomResult

    renamed = {"first_nonfinite_fp32": "first_nonfinite"}
    names = {f.name for f in dataclasses.fields(HeadroomResult)}
    kwargs = {renamed.get(k, k): v for k, v in section.items() if renamed.get(k, k) in names}
    return HeadroomResult(**kwargs)


_REBUILD = {"capability": _capability, "alignment": _alignment, "skiprate": _skiprate, "headroom": _headroom}


def _section_to_json(name: str, value: Any) -> Any:
    if value is None or isinstance(value, (dict, str)):
        return value
    if name == "alignment" and isinstance(value, list):
        return [r.to_dict() if hasattr(r, "to_dict") else r for r in value]
    if name == "capability":
        out = value.to_dict()
        out.pop("findings", None)  # they are in the top-level list
        return out
    return value.to_dict()


def _section_from_json(name: str, section: Any) -> Any:
    """The engine's result object for a section, when it rebuilds that section exactly; else the
    section itself (an engine newer than this reader, or an error entry's leftovers)."""
    if section is None or name not in _REBUILD:
        return section
    try:
        typed = _REBUILD[name](section)
    except (KeyError, TypeError, ValueError, AttributeError, ImportError):
        return section
    return typed if jsonable(_section_to_json(name, typed)) == jsonable(section) else section
