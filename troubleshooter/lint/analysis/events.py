"""The ordered events of a training step and the scopes (module, functions) that hold them."""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from enum import Enum

from .astutil import text
from .autocast import Autocast
from .vocab import EVAL_FUNC_RE


class EventKind(str, Enum):
    """What happens at a point of a training step. A str, so reports and old comparisons read its value."""

    BACKWARD = "backward"
    UNSCALE = "unscale"
    CLIP = "clip"
    GRAD = "grad"
    OPT_STEP = "opt_step"
    SCALER_STEP = "scaler_step"
    UPDATE = "update"
    SCHED_STEP = "sched_step"
    SAVE = "save"
    SCALE = "scale"
    GET_SCALE = "get_scale"
    ZERO_GRAD = "zero_grad"
    CALL = "call"
    HELPER_OPT_STEP = "helper_opt_step"  # a call to a local helper that steps an optimizer with no scaler in it
    HELPER_BACKWARD = "helper_backward"  # a call to a local helper that runs an unmanaged backward (a micro-step)
    FW_CLIP = "fw_clip"  # a framework's own clip/unscale (`accelerator.clip_grad_norm_`, `fabric.clip_gradients`)

    __hash__ = str.__hash__  # `kind in {"backward", ...}` keeps working

    def __str__(self) -> str:
        return self.value


BACKWARD, UNSCALE, CLIP, GRAD, OPT_STEP, SCALER_STEP, UPDATE, SCHED_STEP, SAVE, SCALE, GET_SCALE, ZERO_GRAD, CALL, \
    HELPER_OPT_STEP, HELPER_BACKWARD, FW_CLIP = tuple(EventKind)


@dataclass
class Loop:
    """A loop around events (`for`/`while`), with its trip count when the code says it."""

    node: ast.AST
    id: int
    count: ast.AST | None  # N in `for _ in range(N)`


@dataclass
class Guard:
    """An `if` that makes its body run every N iterations (gradient accumulation)."""

    node: ast.If
    count: ast.AST | None


@dataclass
class Event:
    """One step of a training loop found in a scope (a backward, a step, an unscale ...), in order."""

    kind: str
    node: ast.AST
    line: int
    col: int
    order: int
    loops: tuple = ()
    branches: tuple = ()  # ((stmt id, branch index, condition key, polarity), ...)
    autocast: tuple = ()  # Autocast regions, outermost first
    nograd: bool = False
    guards: tuple = ()
    recv: str | None = None  # key of the receiver (`scaler`, `optimizer`)
    arg: ast.AST | None = None  # optimizer of unscale_/scaler.step, loss of backward
    scaled: bool = False  # backward on scaler.scale(...)
    managed: bool = False  # backward done by accelerate/lightning/deepspeed
    via_call: str | None = None  # summary event standing for a call to a local helper

    @property
    def under_autocast(self) -> Autocast | None:
        """The innermost autocast region in force, None when none or disabled."""
        if not self.autocast:
            return None
        inner = self.autocast[-1]
        return inner if inner.enabled != "no" else None

    @property
    def innermost_loop(self) -> int | None:
        return self.loops[-1].id if self.loops else None


def compatible(a: Event, b: Event) -> bool:
    """False when a and b sit in branches that exclude each other (if/else, same condition)."""
    ids = {(s, i) for s, i, _, _ in a.branches}
    by_stmt = {s: i for s, i, _, _ in a.branches}
    by_key = {k: p for _, _, k, p in a.branches if k}
    for s, i, k, p in b.branches:
        if s in by_stmt and by_stmt[s] != i and (s, i) not in ids:
            return False
        if k and k in by_key and by_key[k] != p:
            return False
    return True


def _dotted(node: ast.AST) -> str | None:
    """`ast.unparse` of a name or a chain of attributes on a name (`self.scaler`), without the unparser:
    most `if` tests the walker keys are of this shape. None for anything else."""
    parts = []
    while node.__class__ is ast.Attribute:
        parts.append(node.attr)
        node = node.value
    if node.__class__ is not ast.Name:
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def cond_key(test: ast.AST) -> tuple[str, bool]:
    """Normalise an if-condition so `if scaler:` and `if scaler is None:` share a key."""
    pol = True
    while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test, pol = test.operand, not pol
    if (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], (ast.Is, ast.IsNot))
            and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value is None):
        pol = pol if isinstance(test.ops[0], ast.IsNot) else not pol
        test = test.left
    if isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and test.func.id == "bool" and test.args:
        test = test.args[0]
    key = _dotted(test) or text(test)
    if key.startswith("self."):
        key = key[5:]
    return key, pol


@dataclass
class Scope:
    """A function, method or the module body: where one training step's events are ordered."""

    node: ast.AST
    name: str
    cls: str | None
    events: list[Event] = field(default_factory=list)
    loops: list[Loop] = field(default_factory=list)
    guards: list[Guard] = field(default_factory=list)
    regions: list[tuple[Autocast, ast.AST, bool]] = field(default_factory=list)  # (region, with, nograd)
    calls: set[str] = field(default_factory=set)  # tail names of functions called
    nograd_func: bool = False
    branch_kinds: dict = field(default_factory=dict)  # stmt id -> {branch index: set(kinds)}

    def of(self, *kinds: str) -> list[Event]:
        events = self.events  # most scopes have none, and rules ask each scope several times
        return [e for e in events if e.kind in kinds] if events else []

    @property
    def is_eval(self) -> bool:
        if self.nograd_func:  # set while the model is built: read each time
            return True
        named = self.__dict__.get("_eval_name")  # the name never changes: its regex test runs once
        if named is None:
            named = self.__dict__["_eval_name"] = bool(EVAL_FUNC_RE.search(self.name))
        return named

    def sibling_has(self, e: Event, kinds: set[str]) -> bool:
        """True when another branch of an if/try that holds e contains one of `kinds`."""
        for s, i, _, _ in e.branches:
            for j, ks in self.branch_kinds.get(s, {}).items():
                if j != i and ks & kinds:
                    return True
        return False




class LazyScope(Scope):
    """A scope whose call names (`calls`) are partly or wholly found on first use: a function that records
    no event and holds no `with` is not walked at all until a rule asks which functions it calls, and a
    walked scope leaves the call names of its expressions that can record no event for then (walker.py)."""

    _calls: set[str] | None = None
    _walk = None

    def walk_later(self, walk) -> None:
        """`walk(scope)` completes `calls` (and, for a scope not walked yet, the statement lists) when
        they are first asked for."""
        self._walk = walk

    @property
    def calls(self) -> set[str]:
        if self._calls is None:
            self._calls = set()
        while self._walk is not None:  # a later walk may itself leave call names for later (walker.py)
            walk, self._walk = self._walk, None
            walk(self)
        return self._calls

    @calls.setter
    def calls(self, value: set[str]) -> None:
        self._calls = value or None
