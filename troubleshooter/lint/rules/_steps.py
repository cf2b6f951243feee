"""Shared step queries used by several rules (training regions, accumulation structure)."""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Callable, Iterator

from ..analysis import (BACKWARD, HELPER_BACKWARD, walk, OPT_STEP, SCALER_STEP, ZERO_GRAD, Autocast, Event, FileModel, Scope,
                        chain_base, names_in, text)
from ..lazy_re import lazy


def trains(m: FileModel, scope: Scope, unmanaged: bool = False) -> bool:
    """The scope, or a function that calls it, runs backward."""
    def has(s: Scope) -> bool:
        return any(e.kind == BACKWARD and not (unmanaged and e.managed) for e in s.events)
    return has(scope) or any(has(c) for c in m.callers(scope))


def training_regions(m: FileModel, dtypes=("fp16",), unmanaged: bool = False) -> Iterator[tuple[Scope, Autocast, ast.AST]]:
    """Autocast regions of the given dtype that run with grad, in code that trains."""
    for s in m.scopes:
        if not s.regions or s.is_eval:  # most scopes have no region: skip the name test
            continue
        for ac, with_node, nograd in s.regions:
            if ac.active and ac.dtype in dtypes and not nograd and trains(m, s, unmanaged):
                yield s, ac, with_node


_ACCUM_RE = lazy(r"accum|acc_steps|grad_acc|iters_to_acc|micro", re.I)


@dataclass
class Accumulation:
    """Where gradients accumulate over micro-batches: a guard or a loop, and the backwards it holds."""

    kind: str  # "guard" (if (i+1) % N == 0) or "loop" (for micro in range(N))
    node: ast.AST
    count: ast.AST | None
    backwards: list[Event]
    per_micro: Callable[[Event], bool]  # does this event run on every micro-batch?


def _stepped_every_time(b: Event, steps: list[Event], g) -> bool:
    """A backward followed, on the same path, by an optimizer step outside the guard is consumed every
    iteration. Asked only when the guard runs its own backward before its step: TD3/DDPG update the
    critic each step and the actor (backward and step) every N steps, a delayed update of another
    optimizer, not accumulation; a guard holding only zero_grad still makes an accumulation loop."""
    return any(e.kind in (OPT_STEP, SCALER_STEP) and g not in e.guards and e.loops == b.loops
               and e.guards == b.guards and e.branches == b.branches and e.line > b.line for e in steps)


def accumulations(scope: Scope) -> list[Accumulation]:
    out: list[Accumulation] = []
    steps = scope.of(OPT_STEP, SCALER_STEP, ZERO_GRAD)
    bws = scope.of(BACKWARD, HELPER_BACKWARD)  # a micro-step helper (`self.train_step(batch)`) counts
    for g in scope.guards:
        inside = [e for e in steps if g in e.guards]
        if not any(e.kind != ZERO_GRAD for e in inside) and not (inside and _ACCUM_RE.search(text(g.node.test))):
            continue  # a zero_grad alone in an `if i % 100 == 0:` is accumulation only if it says so
        loops = inside[0].loops
        if not loops:
            continue
        own_backward = any(g in b.guards for b in bws)  # the guarded step has its own backward
        micro = [b for b in bws if g not in b.guards and b.loops == loops
                 and not (own_backward and _stepped_every_time(b, steps, g))]
        if micro:
            b0 = micro[0]
            out.append(Accumulation("guard", g.node, g.count, micro,
                                    lambda e, g=g, b0=b0: (g not in e.guards and e.loops == b0.loops
                                                           and e.branches == b0.branches and e.guards == b0.guards)))
    for loop in scope.loops:
        inner_b = [b for b in bws if loop in b.loops]
        if not inner_b:
            continue
        end = getattr(loop.node, "end_lineno", loop.node.lineno)
        after = [e for e in steps if loop not in e.loops and e.line > end and e.kind != ZERO_GRAD
                 and e.loops == inner_b[0].loops[: inner_b[0].loops.index(loop)]]
        if after:
            b0 = inner_b[0]
            out.append(Accumulation("loop", loop.node, loop.count, inner_b,
                                    lambda e, loop=loop, b0=b0: (loop in e.loops and e.guards == b0.guards
                                                                 and e.branches == b0.branches)))
    return out


def divides_by(m: FileModel, count: ast.AST | None) -> bool:
    """Is a loss divided (or multiplied by 1/N) by N, or by a name N is made of, anywhere in the file?

    Only divisions that can be the loss count: the left side mentions a loss, the result is
    assigned to a `*loss*` name, returned from a helper, or fed to backward; `len(loader) // N`
    and other step arithmetic do not.
    """
    if count is None:
        return True  # unknown N: do not claim it is missing
    wanted = names_in(count) - {"self", "args", "config", "cfg", "opt", "hparams", "params", "training_args"}
    literal = text(count)

    def mentions_n(rhs: ast.AST) -> bool:
        return text(rhs) == literal or bool(wanted and names_in(rhs) & wanted)

    for rhs, direct in _divisions(m):
        if mentions_n(rhs):
            return True
    return False


def _divisions(m: FileModel) -> list[tuple[ast.AST, bool]]:
    """Right-hand sides of every division that can be a loss normalisation (computed once per file)."""
    return m.memo.get(("divisions",), lambda: _collect_divisions(m))


def _collect_divisions(m: FileModel) -> list[tuple[ast.AST, bool]]:

    def lossy(node: ast.AST) -> bool:
        return any("loss" in n.lower() for n in names_in(node))

    out: list[tuple[ast.AST, bool]] = []
    contexts: list[ast.AST] = []
    Div, BinOp = ast.Div, ast.BinOp
    for n in m.calls:
        attr = getattr(n.func, "attr", None)
        if attr in {"backward", "scale"}:
            contexts.append(n)
        elif attr in {"div", "div_", "true_divide"} and n.args and lossy(n.func):
            out.append((n.args[0], True))
    for n in m.of_class(ast.BinOp):
        if n.op.__class__ is Div and lossy(n.left):
            out.append((n.right, True))
    for n in m.of_class(ast.Assign):
        if any(lossy(t) for t in n.targets):
            contexts.append(n.value)
    for n in m.of_class(ast.Return):
        if n.value is not None:
            contexts.append(n.value)
    for n in m.of_class(ast.AugAssign):
        if n.op.__class__ is Div and lossy(n.target):
            out.append((n.value, True))
    for ctx in contexts:
        for n in walk(ctx):
            if n.__class__ is BinOp and n.op.__class__ is Div:
                out.append((n.right, False))
    return out


def scaler_key_for(scope: Scope, m: FileModel) -> str:
    """Source text of the scaler this scope uses (`scaler`, `self.grad_scaler`)."""
    for e in scope.events:
        if e.kind in ("scaler_step", "update", "unscale", "scale") and not e.via_call \
                and isinstance(e.node, ast.Call) and isinstance(e.node.func, ast.Attribute):
            return text(e.node.func.value)
    for e in scope.events:
        if e.kind == BACKWARD and e.scaled and isinstance(e.arg, ast.AST):
            scale_call = e.node.func.value if isinstance(e.node.func, ast.Attribute) else None
            if isinstance(scale_call, ast.Call) and isinstance(scale_call.func, ast.Attribute):
                return text(scale_call.func.value)
    return "scaler"


def always_calls(m: FileModel, helper: str, method: str) -> bool:
    """Every definition of `helper` calls `<scaler>.<method>(...)` as a top-level statement of its body
    (not under an `if`): calling the helper runs it."""
    defs = m.local_defs(helper)
    if not defs:
        return False
    for d in defs:
        if not any(isinstance(st, ast.Expr) and isinstance(st.value, ast.Call)
                   and isinstance(st.value.func, ast.Attribute) and st.value.func.attr == method
                   and m.is_scaler(chain_base(st.value.func.value)) for st in d.body):
            return False
    return True
