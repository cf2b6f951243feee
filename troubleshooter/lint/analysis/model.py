"""FileModel: everything rules ask about one file, computed once from its parse tree."""
from __future__ import annotations

import ast
import weakref
from functools import cached_property, partial
from operator import attrgetter
from typing import Any, Callable

from .astutil import tail, walk, walk_indexed, walk_parsed
from .autocast import Autocast, AutocastResolution
from .events import LazyScope, Scope
from .names import Names
from .prefilter import defs_holding, event_capable_defs
from .roles import ROLES, Roles
from .walker import LightWalker, Walker


_ID, _ATTR = attrgetter("id"), attrgetter("attr")


def _walk_later(model_ref, scope: Scope) -> None:
    """A LazyScope's walk, on first use. The model is held weakly: a scope holding its model would make
    a reference cycle, and linting runs with the cycle collector off (lint/runner.py)."""
    LightWalker(model_ref(), scope).run(scope.node.body)


class Memo:
    """The one cache of derived facts for a file (helper summaries, subtrees, rule indexes).

    Keys are tuples naming what is cached; living on the FileModel, it dies with the file."""

    def __init__(self):
        self._data: dict[tuple, Any] = {}

    def get(self, key: tuple, compute: Callable[[], Any]) -> Any:
        if key not in self._data:
            self._data[key] = compute()
        return self._data[key]

    def has(self, key: tuple) -> bool:
        return key in self._data

    def peek(self, key: tuple) -> Any:
        return self._data[key]

    def put(self, key: tuple, value: Any) -> Any:
        self._data[key] = value
        return value


class FileModel(Roles, AutocastResolution):
    """Everything rules ask about one file, computed once."""

    # Built on first read (`__getattr__`, roles.py): the assignments, and the role tables.
    assigns: dict[str, list[ast.AST]]  # key -> assigned values, in walk order
    consts: dict[str, ast.AST]  # names assigned once -> the value
    scaler_ctor: dict[str, list[ast.Call]]
    optimizer_ctor: dict[str, list[ast.Call]]
    scheduler_keys: set[str]
    autocast_vars: dict[str, Autocast]
    autocast_factories: dict[str, ast.Call]
    halved: dict[str, ast.AST]
    halved_pretrained: dict[str, ast.AST]
    instances: dict[str, str]  # key -> local class name

    def __init__(self, tree: ast.Module, source: str):
        self.tree = tree
        self.source = source
        self.nodes, by_class = walk_indexed(tree)
        self.memo = Memo()
        self.script_path: str | None = None  # set by the engine for files read from disk (framework configs)
        self.memo.put(("subtree", id(tree)), self.nodes)
        self._by_class = by_class
        self._calls_index: dict[str, list[int]] | None = None  # calls_by_tail, built on first use
        self.names = Names(self.in_walk_order(self.of_class(ast.Import), self.of_class(ast.ImportFrom)))
        self.functions: dict[str, list[ast.AST]] = {}
        self.classes: dict[str, ast.ClassDef] = {}
        self.parents_of_func: dict[int, ast.ClassDef] = {}
        self.frozen: set[str] = set()
        self.scaler_method_keys: set[str] = set()
        self.scaler_passed: set[str] = set()
        self.scaler_named = False  # some name or attribute of the file holds "scaler" (roles.py)
        self._passed_to: list[tuple[str, str | None]] = []
        self.has_isfinite = False
        self.local_scaler_classes: set[str] = set()
        self._collect()
        self.scopes: list[Scope] = []
        self._build_scopes()


    def _build_scopes(self) -> None:
        defs = self.in_walk_order(self.of_class(ast.FunctionDef), self.of_class(ast.AsyncFunctionDef))
        capable = event_capable_defs(self, defs)  # first: the walks below skip helpers that record nothing
        self.scopes.append(Walker(self, LazyScope(self.tree, "<module>", None)).run(self.tree.body))
        with_defs = defs_holding(self, defs, (ast.With, ast.AsyncWith))
        later = partial(_walk_later, weakref.ref(self))
        for node in defs:
            cls = self.parents_of_func.get(id(node))
            lazy = id(node) not in capable and id(node) not in with_defs  # no event, no autocast region
            scope = LazyScope(node, node.name, cls.name if cls else None)
            regions: list[Autocast] = []
            for d in node.decorator_list:
                if self.is_nograd(d) or (isinstance(d, (ast.Name, ast.Attribute)) and
                                         tail(d) in {"no_grad", "inference_mode"}):
                    scope.nograd_func = True
                ac = self.autocast_of_with(d) if isinstance(d, ast.Call) else None
                if ac is not None:
                    regions.append(ac)
            if lazy:
                scope.walk_later(later)
                self.scopes.append(scope)
            else:
                walker = Walker if id(node) in capable else LightWalker
                self.scopes.append(walker(self, scope, tuple(regions)).run(node.body))
        self.by_name: dict[str, list[Scope]] = {}
        for s in self.scopes:
            self.by_name.setdefault(s.name, []).append(s)
        # The scopes that recorded an event, in order: the rules that read only events loop over these (a
        # model file has hundreds of functions and none of them records one). Events are final here: a
        # LazyScope's later walk records none.
        self.event_scopes: list[Scope] = [s for s in self.scopes if s.events]

    def __getattr__(self, name: str) -> Any:
        """Only for attributes not set yet: a role table's first read (roles.py)."""
        if name in ROLES:
            return self._role_table(name)
        if name in ("assigns", "consts"):
            self._collect_assigns()
            return self.__dict__[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @cached_property
    def identifiers(self) -> set[str]:
        """Every name, attribute and def parameter of the file, lower-cased (keyword-argument names are not
        in it), built on first use: the gates below ask it on every file."""
        of = self.of_class
        distinct = set(map(_ID, of(ast.Name)))  # at C speed (most names repeat), then each lower-cased once
        distinct.update(map(_ATTR, of(ast.Attribute)))
        for node in of(ast.FunctionDef) + of(ast.AsyncFunctionDef):
            args = node.args
            distinct.update(a.arg for a in args.args + args.kwonlyargs)
        return set(map(str.lower, distinct))

    @cached_property
    def _identifier_text(self) -> str:
        return "\n".join(self.identifiers)  # no name holds a newline: one substring search at C speed

    def may_call_ending(self, suffix: str) -> bool:
        """Some call's qualified function name (`names.qual(call.func)`) may end with `suffix`. A qualified
        name ends in the function's own last name unless the function is a bare imported alias (see
        `calls_resolving`), so this asks the call index's names and the aliases, not every call."""
        return self.memo.get(("may_call_ending", suffix), lambda: any(t.endswith(suffix) for t in self.calls_by_tail())
                             or any(local in self.calls_by_tail() and qual.endswith(suffix)
                                    for local, qual in self.names.alias.items()))

    def may_name(self, word: str) -> bool:
        """Some name, attribute or def parameter of the file is `word` (lower-case)."""
        return word in self.identifiers

    def may_name_part(self, part: str) -> bool:
        """Some name, attribute or def parameter of the file, lower-cased, holds `part`."""
        return part in self._identifier_text

    @cached_property
    def lines(self) -> list[str]:
        """The source's lines, split on first use: only files with a finding (or a rule asking) need them."""
        return self.source.splitlines()

    @property
    def may_hold_scaler(self) -> bool:
        """False when no name of the file can be a loss scaler (`is_scaler` is False for every key): no
        GradScaler construction, no `.scale`/`.unscale_` on a `*scal*` receiver, no `*scaler*` name."""
        return bool(self.scaler_ctor or self.scaler_method_keys or self.scaler_named)

    @property
    def calls(self) -> list[ast.Call]:
        """Every call in the file, in walk order (several rules scan only calls)."""
        return self.of_class(ast.Call)

    def calls_named(self, *names: str) -> list[ast.Call]:
        """The calls whose function's last name (`f` of `x.f(...)` / `f(...)`) is one of `names`, in walk
        order: rules and framework adapters look for a few names among every call of the file, and
        scanning all of them each time cost more than the rules' own work (the index is built once)."""
        index = self.calls_by_tail()
        calls = self.calls
        if len(names) == 1:
            return [calls[i] for i in index.get(names[0], ())]
        return [calls[i] for i in sorted(i for name in set(names) for i in index.get(name, ()))]

    def calls_by_tail(self) -> dict[str, list[int]]:
        """Each function name called in the file -> the positions in `calls` of its calls, in walk order."""
        index = self._calls_index
        if index is None:
            index = self._calls_index = self._index_calls()
        return index

    def _index_calls(self) -> dict[str, list[int]]:
        index: dict[str, list[int]] = {}
        for i, c in enumerate(self.calls):
            t = tail(c.func)
            if t is not None:
                index.setdefault(t, []).append(i)
        return index

    def calls_resolving(self, last: Callable[[str], bool], tails: tuple[str, ...] = ()) -> list[tuple[ast.Call, str]]:
        """(call, qualified function name, `names.qual(c.func) or ""`) for every call whose qualified name's
        last component passes `last`, or whose function's last name is one of `tails`, in walk order.

        The rules that look for a few full names (`torch.autocast`, `...DistributedDataParallel`) resolve
        only these: a qualified name ends in the function's own last name (`a.b.f` -> `f`) unless the
        function is a bare imported alias (`from x import f as g`; `g` -> `x.f`), so a call outside the
        name index's matches and the aliases' matches cannot have a qualified name that passes `last`."""
        index = self.calls_by_tail()
        wanted = {t for t in index if t in tails or last(t)}
        wanted.update(local for local, qual in self.names.alias.items()
                      if local in index and last(qual.rpartition(".")[2]))
        calls, qual = self.calls, self.names.qual
        picked = sorted(i for t in wanted for i in index[t])
        return [(calls[i], qual(calls[i].func) or "") for i in picked]

    def of_class(self, cls: type) -> list[ast.AST]:
        """Every node of exactly this class, in walk order: rules that look for a few node kinds scan
        these short lists instead of every node of the file (the index is built once, on first use)."""
        return self._by_class.get(cls, [])

    def in_walk_order(self, first: list[ast.AST], second: list[ast.AST]) -> list[ast.AST]:
        """Two lists of this file's nodes, each in walk order (two kinds of the class index), as one list
        in walk order. Positions come from `list.index` scans of the walk, one forward pass per list at
        C speed, and only when both lists hold something."""
        if not second:
            return list(first)
        if not first:
            return list(second)
        nodes = self.nodes
        both = first + second
        position: list[int] = []  # aligned with `both`
        for group in (first, second):
            i = 0
            for n in group:
                i = nodes.index(n, i)
                position.append(i)
        return [both[k] for k in sorted(range(len(both)), key=position.__getitem__)]

    def subtree(self, node: ast.AST) -> list[ast.AST]:
        """Cached `walk(node)` for scopes and defs that several rules search."""
        return self.memo.get(("subtree", id(node)), lambda: self.walk(node))

    def walk(self, node: ast.AST) -> list[ast.AST]:
        """`walk(node)` for a node of this file's tree, through the compiled getters."""
        try:
            return walk_parsed(node)
        except AttributeError:  # a node made after parsing without all its fields: the generic walk skips those
            return walk(node)

    def scope_of(self, node: ast.AST) -> Scope:
        """The innermost function scope whose lines contain `node` (the module scope otherwise)."""
        best = self.scopes[0]
        size = None
        for s in self.scopes[1:]:
            lo, hi = s.node.lineno, getattr(s.node, "end_lineno", s.node.lineno)
            if lo <= node.lineno <= hi and (size is None or hi - lo < size):
                best, size = s, hi - lo
        return best

    def callers(self, scope: Scope) -> list[Scope]:
        return [s for s in self.scopes if scope.name in s.calls and s is not scope]

    def local_defs(self, name: str | None) -> list[ast.AST]:
        return self.functions.get(name or "", [])


