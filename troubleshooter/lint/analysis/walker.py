"""Walk one scope's statements in order, recording training-step events with their context."""
from __future__ import annotations

import ast
import re
import weakref
from bisect import bisect_left
from functools import partial
from typing import TYPE_CHECKING

from .astutil import dict_like, func_tail, grad_of, is_grad_read, receiver, tail, walk
from .events import (BACKWARD, CLIP, FW_CLIP, GET_SCALE, GRAD, HELPER_BACKWARD, HELPER_OPT_STEP, OPT_STEP, SAVE, SCALE, SCALER_STEP,
                     SCHED_STEP, UNSCALE, UPDATE, ZERO_GRAD, Event, Guard, LazyScope, Loop, Scope, cond_key)
from .prefilter import EVENT_HELPERS, EVENT_LINES
from .vocab import CLIP_NAMES, MANAGED_RE, ZEROING

# A framework's own clipping/unscaling calls (`accelerator.clip_grad_norm_`, `fabric.clip_gradients`,
# Lightning's `self.clip_gradients`); lint/frameworks decides which of them unscale first.
# Statements with no body and no special case in `Walker._stmt`: only their expressions are scanned.
_SIMPLE_STATEMENTS = frozenset({ast.Expr, ast.Import, ast.ImportFrom, ast.Return, ast.AugAssign, ast.AnnAssign,
                                ast.Pass, ast.Raise, ast.Delete, ast.Global, ast.Nonlocal, ast.Assert, ast.Break,
                                ast.Continue})
# Memo key: the file has a `.grad`, a backward call or a scaler name (else no helper has a direct kind).
_DIRECT_KINDS_POSSIBLE = ("direct_kinds_possible",)
FRAMEWORK_CLIPS = frozenset({"clip_grad_norm_", "clip_grad_value_", "unscale_gradients", "clip_gradients"})

if TYPE_CHECKING:
    from .model import FileModel


class Walker:
    """Walk one scope's statements in order, recording events with their context."""

    def __init__(self, model: "FileModel", scope: Scope, regions: tuple = ()):
        self.m = model
        self.s = scope
        self.order = 0
        self.base_regions = regions
        self.loop_id = 0
        self._local_scaled: set[str] = set()
        self._apex_scaled: set[str] = set()
        # lines where an event may be recorded (prefilter.py); None: not known, every expression is scanned
        self._event_lines = model.memo.peek(EVENT_LINES) if model.memo.has(EVENT_LINES) else None
        self._deferred: list[ast.AST] = []  # expressions holding no event line: only their call names matter

    def run(self, body: list[ast.stmt]) -> Scope:
        self._body(body, ((), (), self.base_regions, self.s.nograd_func, ()))
        if self._deferred:
            self._settle_deferred()
        return self.s

    def _may_record(self, node: ast.AST) -> bool:
        """Some line of `node` holds a node `_exprs` can make an event of (every node of a parsed
        statement or expression lies within its lines)."""
        lines = self._event_lines
        if lines is None:
            return True
        i = bisect_left(lines, node.lineno)
        return i < len(lines) and lines[i] <= node.end_lineno

    def _scan(self, node: ast.AST, ctx) -> None:
        """`_exprs`, or, for an expression that can record no event, its call names, left for when a
        rule first asks for `calls` (few do): most statements of a scope that steps record nothing."""
        if self._may_record(node):
            self._exprs(node, ctx)
        else:
            self._deferred.append(node)

    def _settle_deferred(self) -> None:
        if isinstance(self.s, LazyScope):
            self.s.walk_later(partial(_call_names_later, weakref.ref(self.m), self._deferred))
        else:
            for node in self._deferred:
                self._call_names(node, None)

    def _body(self, body, ctx) -> None:
        for st in body:
            self._stmt(st, ctx)

    def _branch(self, ctx, stmt, idx, key="", pol=True):
        loops, branches, regions, nograd, guards = ctx
        return loops, branches + ((id(stmt), idx, key, pol),), regions, nograd, guards

    def _stmt(self, st: ast.stmt, ctx) -> None:
        if st.__class__ in _SIMPLE_STATEMENTS:  # most statements: none of the cases below applies
            self._scan(st, ctx)
            return
        loops, branches, regions, nograd, guards = ctx
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return
        if isinstance(st, (ast.For, ast.AsyncFor, ast.While)):
            self._scan(st.iter if not isinstance(st, ast.While) else st.test, ctx)
            count = None
            it = getattr(st, "iter", None)
            if isinstance(it, ast.Call) and func_tail(it) == "range" and len(it.args) == 1:
                count = it.args[0]
            self.loop_id += 1
            loop = Loop(st, self.loop_id, count)
            self.s.loops.append(loop)
            self._body(st.body, (loops + (loop,), branches, regions, nograd, guards))
            self._body(st.orelse, ctx)
            return
        if isinstance(st, ast.If):
            self._scan(st.test, ctx)
            # The key, the guard and the branch kinds are read only through events inside the `if` (an
            # accumulation guard with no event inside is no accumulation, rules/_steps.py): none is needed
            # when its lines hold no event line.
            inside = self._may_record(st)
            key, pol = self._cond_key(st.test) if inside else ("", True)
            body_ctx = self._branch(ctx, st, 0, key, pol)
            count = self._accum_count(st.test) if inside else False
            if count is not False:
                g = Guard(st, count)
                self.s.guards.append(g)
                body_ctx = body_ctx[:4] + (guards + (g,),)
            if not inside:
                self._body(st.body, body_ctx)
                self._body(st.orelse, self._branch(ctx, st, 1, key, not pol))
                return
            start = self._count_start()
            self._body(st.body, body_ctx)
            self._mark(st, 0, start)
            start = self._count_start()
            self._body(st.orelse, self._branch(ctx, st, 1, key, not pol))
            self._mark(st, 1, start)
            return
        if isinstance(st, (ast.With, ast.AsyncWith)):
            new_regions, new_nograd = regions, nograd
            for item in st.items:
                self._scan(item.context_expr, ctx)
                if isinstance(item.context_expr, ast.Call) and "scale_loss" in (func_tail(item.context_expr) or "") \
                        and isinstance(item.optional_vars, ast.Name):
                    self._apex_scaled.add(item.optional_vars.id)  # apex: amp.scale_loss(loss, opt) as scaled
                ac = self.m.autocast_of_with(item.context_expr)
                if ac is not None:
                    new_regions = new_regions + (ac,)
                if self.m.is_nograd(item.context_expr):
                    new_nograd = True
            for ac in new_regions[len(regions):]:  # `with autocast(...), no_grad():` is inference too
                self.s.regions.append((ac, st, new_nograd))
            self._body(st.body, (loops, branches, new_regions, new_nograd, guards))
            return
        if isinstance(st, ast.Try) or type(st).__name__ == "TryStar":
            start = self._count_start()
            self._body(st.body, self._branch(ctx, st, 0))
            self._body(st.orelse, self._branch(ctx, st, 0))
            self._mark(st, 0, start)
            for i, h in enumerate(st.handlers):
                start = self._count_start()
                self._body(h.body, self._branch(ctx, st, i + 1))
                self._mark(st, i + 1, start)
            self._body(st.finalbody, ctx)
            return
        if type(st).__name__ == "Match":
            self._scan(st.subject, ctx)
            for i, case in enumerate(st.cases):
                start = self._count_start()
                self._body(case.body, self._branch(ctx, st, i))
                self._mark(st, i, start)
            return
        if isinstance(st, ast.Assign) and isinstance(st.value, ast.Call) and self._is_scale_call(st.value):
            for t in st.targets:
                if tail(t):
                    self._local_scaled.add(tail(t))
        self._scan(st, ctx)

    _cond_key = staticmethod(cond_key)

    def _accum_count(self, test: ast.AST):
        return accum_count(test)

    def _count_start(self) -> int:
        return len(self.s.events)

    def _mark(self, stmt, idx, start) -> None:
        kinds = {e.kind for e in self.s.events[start:]}
        self.s.branch_kinds.setdefault(id(stmt), {}).setdefault(idx, set()).update(kinds)

    def _is_scale_call(self, node: ast.AST) -> bool:
        return (isinstance(node, ast.Call) and func_tail(node) == "scale" and receiver(node) is not None
                and (self.m.is_scaler(tail(receiver(node))) or "scal" in (tail(receiver(node)) or "").lower()))

    def _call_names(self, node: ast.AST, ctx) -> None:
        """`_exprs` for a scope that records no event: the call names `_call` notes, nothing more."""
        calls = self.s.calls
        Call = ast.Call
        for n in self.m.walk(node):
            if n.__class__ is Call:
                t = tail(n.func)
                if t:
                    calls.add(t)

    def _exprs(self, node: ast.AST, ctx) -> None:
        calls: list[ast.AST] = []
        skip_grad: set[int] = set()
        Call, Attribute, Compare, Assign = ast.Call, ast.Attribute, ast.Compare, ast.Assign
        for n in self.m.walk(node):
            cls = n.__class__  # exact-class dispatch: every node of every statement passes here
            if cls is Call:
                calls.append(n)
                f = n.func
                if isinstance(f, ast.Attribute):
                    inner = f.value
                    if isinstance(inner, ast.Attribute) and inner.attr == "data":
                        inner = inner.value
                    if isinstance(inner, ast.Attribute) and inner.attr == "grad" and f.attr in ZEROING:
                        skip_grad.add(id(inner))
                    if f.attr in ZEROING and isinstance(inner, ast.Subscript):
                        g = grad_of(inner)  # p.grad[rows].zero_(): zero is zero at any loss scale
                        if g is not None:
                            skip_grad.add(id(g))
                    if f.attr == "grad":
                        skip_grad.add(id(f))  # torch.autograd.grad(...)
            elif cls is Attribute:
                if n.attr == "grad":
                    calls.append(n)
            elif cls is Compare and any(isinstance(c, ast.Constant) and c.value is None
                                                    for c in n.comparators):
                for side in [n.left, *n.comparators]:
                    if isinstance(side, ast.Attribute) and side.attr == "grad":
                        skip_grad.add(id(side))
            elif cls is Assign and isinstance(n.value, ast.Constant) and n.value.value is None:
                for t in n.targets:
                    skip_grad.add(id(t))
            elif cls is Assign and isinstance(n.value, ast.Constant) and n.value.value == 0 \
                    and not isinstance(n.value.value, bool):
                for t in n.targets:  # p.grad[rows] = 0 freezes rows; zero is scale-invariant
                    g = grad_of(t) if isinstance(t, ast.Subscript) else None
                    if g is not None:
                        skip_grad.add(id(g))
        calls.sort(key=lambda c: (c.lineno, c.col_offset))
        for c in calls:
            if isinstance(c, ast.Attribute):
                if id(c) not in skip_grad:
                    self._add(GRAD, c, ctx)
                continue
            self._call(c, ctx)

    def _add(self, kind, node, ctx, **kw) -> Event:
        loops, branches, regions, nograd, guards = ctx
        self.order += 1
        e = Event(kind, node, node.lineno, node.col_offset, self.order, loops, branches, regions, nograd, guards, **kw)
        self.s.events.append(e)
        return e

    def _call(self, c: ast.Call, ctx) -> None:
        m = self.m
        t = func_tail(c)
        r = receiver(c)
        rk = tail(r) if r is not None else None
        q = (m.names.qual(c.func) or "") if t == "backward" or t == "save" else ""  # only these two ask
        if t:
            self.s.calls.add(t)
        if t == "backward":
            if q.endswith("autograd.backward") and c.args:
                self._backward(c.args[0], c, ctx)
            elif r is not None:
                if (rk and (MANAGED_RE.search(rk) or m.is_optimizer(rk) or rk == "self")) or \
                        (isinstance(r, ast.Name) and r.id in m.names.alias and c.args):
                    self._add(BACKWARD, c, ctx, recv=rk, arg=c.args[0] if c.args else None, managed=True)
                else:
                    self._backward(r, c, ctx)
            return
        if t in {"manual_backward"}:
            self._add(BACKWARD, c, ctx, recv=rk, arg=c.args[0] if c.args else None, managed=True)
            return
        if rk and m.is_scaler(rk):
            kind = {"unscale_": UNSCALE, "step": SCALER_STEP, "update": UPDATE, "scale": SCALE,
                    "get_scale": GET_SCALE}.get(t or "")
            if kind:
                self._add(kind, c, ctx, recv=rk, arg=c.args[0] if c.args else None)
                return
        if t in FRAMEWORK_CLIPS and rk and (MANAGED_RE.search(rk) or (rk == "self" and t == "clip_gradients"
                                                                       and not m.local_defs(t))):
            self._add(FW_CLIP, c, ctx, recv=rk)  # the framework unscales (or, Lightning's manual clip, does not)
            return
        if t in CLIP_NAMES:
            if rk and MANAGED_RE.search(rk):
                return
            if any(self._def_has(d, UNSCALE) for d in m.local_defs(t)):
                self._add(UNSCALE, c, ctx, via_call=t)
            self._add(CLIP, c, ctx, recv=rk)
            return
        if t == "step" and rk:
            if m.is_scheduler(rk):
                self._add(SCHED_STEP, c, ctx, recv=rk, arg=c.args[0] if c.args else None)
            elif m.is_optimizer(rk):
                self._add(OPT_STEP, c, ctx, recv=rk)
            return
        if t == "zero_grad":
            self._add(ZERO_GRAD, c, ctx, recv=rk)
            return
        if q in {"torch.save"} or (t == "save" and rk and MANAGED_RE.search(rk)) or \
                (t and "save" in t.lower() and c.args and dict_like(c.args[0])):
            self._add(SAVE, c, ctx, recv=rk, arg=c.args[0] if c.args else None)
            return
        # a call to a helper defined in this file: summarise what it does to the step
        defs = m.local_defs(t) if (r is None or rk == "self") else []
        if defs and m.memo.has(EVENT_HELPERS) and not any(id(d) in m.memo.peek(EVENT_HELPERS) for d in defs):
            return  # none of them can record an event: every summary below would be empty (prefilter.py)
        for kind in (HELPER_BACKWARD, UNSCALE, GRAD, SCALER_STEP, UPDATE):
            if any(self._def_has(d, kind) for d in defs):
                self._add(kind, c, ctx, via_call=t)
        if defs and all(self._plain_step_helper(d) for d in defs):
            self._add(HELPER_OPT_STEP, c, ctx, via_call=t)

    def _plain_step_helper(self, d: ast.AST) -> bool:
        """A local helper that steps an optimizer directly and never touches a scaler or runs backward."""
        stepped = False
        for n in self.m.subtree(d):
            if not isinstance(n, ast.Call) or not isinstance(n.func, ast.Attribute):
                continue
            rk = tail(n.func.value)
            if n.func.attr == "backward" or (rk and (self.m.is_scaler(rk) or "scal" in rk.lower())):
                return False
            if n.func.attr == "step" and rk and self.m.is_optimizer(rk) and not self.m.is_scheduler(rk):
                stepped = True
        return stepped

    def _backward(self, target: ast.AST, c: ast.Call, ctx) -> None:
        scaled = self._is_scale_call(target) or (isinstance(target, (ast.Name, ast.Attribute))
                                                 and tail(target) in self._local_scaled)
        loss = target.args[0] if scaled and isinstance(target, ast.Call) and target.args else target
        managed = isinstance(target, ast.Name) and target.id in self._apex_scaled and not scaled
        recv = tail(receiver(target)) if scaled and isinstance(target, ast.Call) else tail(target)
        self._add(BACKWARD, c, ctx, recv=recv, arg=loss, scaled=scaled or managed, managed=managed)

    def _def_has(self, d: ast.AST, kind: str) -> bool:
        key = ("def_has", id(d), kind)
        memo = self.m.memo
        if not memo.has(key):
            memo.put(key, False)  # a helper that (indirectly) calls itself adds nothing
            found = kind in self._direct_kinds(d)
            if not found:  # trainer classes nest helpers: step() -> _unscale_and_clip() -> scaler.unscale_
                found = any(self._def_has(inner, kind) for inner in self._called_defs(d))
            memo.put(key, found)
        return memo.peek(key)

    def _direct_kinds(self, d: ast.AST) -> frozenset:
        """What `d`'s own code (not the helpers it calls) does, of the kinds `_def_has` asks about; one
        pass over the subtree for all of them, kept for the file."""
        return self.m.memo.get(("def_direct", id(d)), lambda: self._find_direct_kinds(d))

    def _find_direct_kinds(self, d: ast.AST) -> frozenset:
        m = self.m
        if not m.memo.get(_DIRECT_KINDS_POSSIBLE, lambda: m.may_name("grad") or "backward" in m.calls_by_tail()
                          or m.may_hold_scaler):
            return frozenset()  # no `.grad`, no backward call, no scaler name anywhere in the file
        kinds = set()
        scaler_kind = {"unscale_": UNSCALE, "step": SCALER_STEP, "update": UPDATE}
        for n in m.subtree(d):
            cls = n.__class__
            if cls is ast.Attribute:
                if n.attr == "grad" and not isinstance(getattr(n, "ctx", None), ast.Store):
                    kinds.add(GRAD)
            elif cls is ast.Call:
                t = func_tail(n)
                r = receiver(n)
                rk = tail(r) if r is not None else None
                if t == "backward":
                    if not (rk and (MANAGED_RE.search(rk) or rk == "self" or m.is_optimizer(rk))):
                        kinds.add(HELPER_BACKWARD)
                elif r is not None and t in scaler_kind and m.is_scaler(rk):
                    kinds.add(scaler_kind[t])
        if GRAD in kinds:
            # a helper that zeroes or tests grads for None is not a read
            reads = [n for n in walk(d) if isinstance(n, ast.Attribute) and n.attr == "grad"]
            if not any(is_grad_read(n, d) for n in reads):
                kinds.discard(GRAD)
        return frozenset(kinds)

    def _called_defs(self, d: ast.AST) -> list[ast.AST]:
        """Functions of this file that `d` calls by name or as `self.method(...)` (kept for the file)."""
        return self.m.memo.get(("called_defs", id(d)), lambda: self._find_called_defs(d))

    def _find_called_defs(self, d: ast.AST) -> list[ast.AST]:
        out = []
        for n in self.m.subtree(d):
            if isinstance(n, ast.Call):
                r = receiver(n)
                if r is None or (isinstance(r, ast.Name) and r.id == "self"):
                    out += [f for f in self.m.local_defs(func_tail(n)) if f is not d]
        return out


class LightWalker(Walker):
    """The walk of a scope that cannot record an event (prefilter.py): statements, loops, `with`
    regions and call names, without looking at what each call does (no branch keys, no guards)."""

    _exprs = Walker._call_names

    def _scan(self, node: ast.AST, ctx) -> None:
        """Only call names, and those left for the first read of `scope.calls` (few rules read a model
        function's): most of this walk is the expressions of functions walked only for their `with` regions."""
        self._deferred.append(node)

    @staticmethod
    def _cond_key(test: ast.AST) -> tuple[str, bool]:
        """No event is recorded here, so no branch key is ever read: skip unparsing every `if` test."""
        return "", True

    def _accum_count(self, test: ast.AST):
        """Nor is an accumulation guard: guards only matter for the events inside them (rules/_steps.py)."""
        return False


def _call_names_later(model_ref, nodes: list[ast.AST], scope: Scope) -> None:
    """The call names of a walked scope's deferred expressions, on first use of `scope.calls`. The model
    is held weakly, as for a LazyScope's walk (model.py): no reference cycle."""
    calls = scope.calls
    walk_of = model_ref().walk
    Call = ast.Call
    for node in nodes:
        for n in walk_of(node):
            if n.__class__ is Call:
                t = tail(n.func)
                if t:
                    calls.add(t)


def accum_count(test: ast.AST):
    """N of an accumulation guard (`(i + 1) % N == 0`), None if a guard of unknown N, False if none.

    `if accum_steps > 1:` compares the setting with a constant: it picks a configuration, it does
    not make its body run every N iterations, so it is no guard."""
    if isinstance(test, ast.Compare) and all(isinstance(c, ast.Constant) for c in test.comparators) \
            and isinstance(test.left, (ast.Name, ast.Attribute)):
        return False
    for n in walk(test):
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod):
            return n.right
    for n in walk(test):
        k = tail(n) if isinstance(n, (ast.Name, ast.Attribute)) else None
        if k and re.search(r"accum|sync_grad", k, re.I):
            return None
    return False


