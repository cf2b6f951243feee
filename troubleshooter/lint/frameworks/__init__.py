"""What the training frameworks do with mixed precision, one adapter module per framework.

Most people never write `scaler.scale(loss)`: `Accelerator(mixed_precision="fp16")`,
`Trainer(precision="16-mixed")`, `Fabric(precision=...)`, `TrainingArguments(fp16=True)`, a
DeepSpeed JSON or an FSDP mixed-precision policy do it for them. The mistakes stay the same ones
in framework clothes. Each adapter (accelerate, lightning, fabric, hf_trainer, deepspeed, fsdp)
holds what that framework does, checked in its source per version (each module's docstring says
which), and answers the rules' questions:

- `setups(m)`: where the framework is set up in this file, the precision it was asked for
  (`Setup.precision`, a `values.Value` with its evidence: literal, a default, a config file beside
  the script, or unknown), and the names its objects go by;
- `owner(m, recv, scope)`: which setup a managed backward (`accelerator.backward`,
  `fabric.backward`, `self.manual_backward`, `engine.backward`) belongs to.

Rules (lint/rules/amp130.py ... amp140.py) read these answers; none of them spells a framework API.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field

from ..analysis import func_tail, receiver, tail
from .values import DEFAULT, NOTHING, Value

FP16, BF16, FP32, FP8 = "fp16", "bf16", "fp32", "fp8"
FP16_TRUE, BF16_TRUE = "fp16-true", "bf16-true"  # half weights, no float32 master copy


@dataclass
class Setup:
    """One place a framework is set up, with the precision it was asked to train in."""

    framework: str  # "accelerate", "lightning", "fabric", "hf_trainer", "deepspeed", "fsdp1", "fsdp2"
    node: ast.AST | None
    precision: Value = NOTHING  # options among FP16, BF16, FP32, FP8, FP16_TRUE, BF16_TRUE
    keys: frozenset = frozenset()  # names of the framework object (`accelerator`, `fabric`, `model_engine`)
    label: str = ""  # how a message names it: 'Accelerator(...) (line 12)'
    data: dict = field(default_factory=dict)

    @property
    def fp16(self) -> str:
        """"certain" (a literal float16 setting), "possible" (a default, a config file, unknown) or "no"."""
        p = self.precision
        if p.certain and p.options[0] == FP16:
            return "certain"
        if not p.known or p.may(FP16) or p.how == DEFAULT:  # a default the command line may change
            return "possible"
        return "no"

    def precision_words(self) -> str:
        """'float16 (`mixed_precision="fp16"` (line 12))' for messages."""
        p = self.precision
        if not p.known:
            return f"a precision this file does not set ({self.data.get('unknown_because', 'chosen at launch')})"
        return f"{'/'.join(str(o) for o in p.options)} ({p.evidence})"


def adapters():
    from . import accelerate, deepspeed, fabric, fsdp, hf_trainer, lightning
    return (hf_trainer, accelerate, lightning, fabric, deepspeed, fsdp)  # a Trainer subclass's accelerator first


def setups(m) -> list[Setup]:
    """Every framework setup in the file, adapter by adapter (memoised on the FileModel)."""
    return m.memo.get(("framework_setups",), lambda: [s for a in adapters() for s in _found(m, a)])


def of(m, *frameworks: str) -> list[Setup]:
    """The setups of these frameworks, in `setups` order. Only the adapters that can make one are asked: a
    model file with no training code would otherwise pay every adapter's search for a question about one."""
    return list(m.memo.get(("framework_setups_of", frameworks), lambda: [
        s for a in _adapters_for(frameworks) for s in _found(m, a) if s.framework in frameworks]))


_ADAPTERS_FOR: dict[tuple[str, ...], tuple] = {}


def _adapters_for(frameworks: tuple[str, ...]) -> tuple:
    """The adapters, in `adapters()` order, that can make a setup of one of these frameworks."""
    found = _ADAPTERS_FOR.get(frameworks)
    if found is None:
        found = _ADAPTERS_FOR[frameworks] = tuple(a for a in adapters() if not frameworks_of(a).isdisjoint(frameworks))
    return found


def frameworks_of(adapter) -> frozenset:
    """The `Setup.framework` names an adapter's `find` gives (its NAME; fsdp: fsdp1 and fsdp2)."""
    return getattr(adapter, "FRAMEWORKS", None) or frozenset({adapter.NAME})


def _found(m, adapter) -> list[Setup]:
    """One adapter's setups in source order, searched once per file."""
    return m.memo.get(("framework_setups", adapter.NAME), lambda: sorted(
        adapter.find(m), key=lambda s: (getattr(s.node, "lineno", 0), getattr(s.node, "col_offset", 0))))


def owner(m, recv: str | None, scope) -> Setup | None:
    """The setup a managed backward on `recv` belongs to (None: not a framework we know)."""
    for a in adapters():
        hit = a.owner(m, recv, scope)
        if hit is not None:
            return hit
    return None


def by_keys(candidates: list[Setup], recv: str | None, scope) -> Setup | None:
    """The setup whose object is `recv`; with several, the one made in this function (`scope`)."""
    mine = [s for s in candidates if recv in s.keys]
    if scope is not None and len(mine) > 1:
        lo, hi = getattr(scope.node, "lineno", 0), getattr(scope.node, "end_lineno", 10 ** 9)
        inside = [s for s in mine if s.node is not None and lo <= s.node.lineno <= hi]
        return (inside or mine)[0]
    return mine[0] if mine else None


def imports(m, *prefixes: str) -> bool:
    """The file imports a module starting with one of `prefixes` (`accelerate`, `lightning`): `qual == p or
    qual.startswith(p + ".")` for an import's qualified name, i.e. `p` is one of its dotted heads."""
    heads = m.memo.get(("import_heads",), lambda: {qual.rsplit(".", k)[0] for _, _, qual in m.names.imports
                                                   for k in range(qual.count(".") + 1)})
    return any(p in heads for p in prefixes)


def prepared_entries(m, keys: set[str], methods: set[str]) -> list[tuple[str, int, bool]]:
    """(name, line, is an attribute) for every object handed to or returned by `<framework>.<method>(...)`
    (`accelerator.prepare`, `fabric.setup`)."""
    out: list[tuple[str, int, bool]] = []

    def add(node, line):
        if isinstance(node, ast.Starred):
            out.append(("*", line, True))  # `prepare(*objects)`: which names it prepares cannot be told
            return
        k = tail(node)
        if k:
            out.append((k, line, isinstance(node, ast.Attribute)))

    for c in m.calls_named(*methods):
        r = receiver(c)
        if r is not None and tail(r) in keys:
            for a in c.args:
                add(a, c.lineno)
    for node in m.of_class(ast.Assign):
        v = node.value
        if isinstance(v, ast.Call) and func_tail(v) in methods and receiver(v) is not None and tail(receiver(v)) in keys:
            for t in node.targets:
                for sub in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]):
                    add(sub, node.lineno)
    return out


def prepared_in(m, framework: str, scope) -> set[str]:
    """Names of objects the framework prepared that `scope` sees: attributes (`self.optimizer`)
    prepared anywhere, names prepared in this function or at module level. A local `optimizer`
    prepared in another function is another object."""
    entries = [e for st in of(m, framework) for e in st.data.get("prepared", [])]
    lo, hi = getattr(scope.node, "lineno", 1), getattr(scope.node, "end_lineno", 10 ** 9)
    funcs = [(s.node.lineno, getattr(s.node, "end_lineno", s.node.lineno)) for s in m.scopes[1:]]
    out = set()
    for name, line, attr in entries:
        if attr or lo <= line <= hi or not any(a <= line <= b for a, b in funcs):
            out.add(name)
    return out


def is_prepared(prepared: set[str], key: str | None) -> bool:
    """`key` went through the framework's prepare/setup, or a starred call may have taken it."""
    return key in prepared or "*" in prepared


def derives(m, bases: set[str], packages: tuple[str, ...]) -> set[str]:
    """Classes of this file deriving, directly or through each other, from a class named in `bases`
    that comes from one of `packages` (`pl.LightningModule`, `from transformers import Trainer`)."""
    def from_package(b: ast.AST) -> bool:
        q = m.names.qual(b) or ""
        name = q.rsplit(".", 1)[-1]
        return name in bases and q.startswith(packages)

    found: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, cls in m.classes.items():
            if name not in found and any(from_package(b) or (isinstance(b, ast.Name) and b.id in found)
                                         for b in cls.bases):
                found.add(name)
                changed = True
    return found


__all__ = ["BF16", "BF16_TRUE", "FP16", "FP16_TRUE", "FP32", "FP8", "Setup", "adapters", "by_keys", "derives", "is_prepared", "prepared_entries", "prepared_in", "imports", "of", "owner",
           "setups"]
