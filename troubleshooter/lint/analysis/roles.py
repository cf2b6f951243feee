"""Roles of objects by construction: GradScalers, optimizers, schedulers, half models, autocast objects."""
from __future__ import annotations

import ast
import re

from ..lazy_re import lazy
from .astutil import chain_base, func_tail, is_false, is_true, kw_is_false, kwarg, peel, receiver, tail, text
from .vocab import OPT_NAME_RE, OPTIMIZER_CLASSES, SCHED_NAME_RE, SKLEARN_SCALER_RE


_FINITE_CHECKS = ("isfinite", "isnan", "isinf", "nan_to_num", "isfinite_", "all_finite")
_CASTS = ("half", "bfloat16", "to")
# methods a scaler is an argument of without being handed to code that may update it
_NOT_HANDING_ON = frozenset({"step", "unscale_", "scale", "update", "state_dict", "load_state_dict", "save", "print",
                             "isinstance"})
_SCHEDULE_FACTORY = lazy(r"get_\w*schedule")  # transformers' get_linear_schedule_with_warmup, ...
_OPTIMIZER_WORD = lazy(r"optimizer", re.I)
# The role tables `Roles._classify_roles` and `Roles._find_half_models` build on first use.
ROLES = frozenset({"scaler_ctor", "optimizer_ctor", "scheduler_keys", "autocast_vars", "autocast_factories",
                   "halved", "halved_pretrained", "instances"})
_HALF_TABLES = frozenset({"halved", "halved_pretrained"})
# The assigned values the role passes read: only these can be or hold a call (`_outcomes`)
_CALL_VALUES = (ast.Call, ast.IfExp, ast.Await)


def _outcomes(value: ast.AST):
    """What an assigned value can turn out to be: each branch of an if-expression, each with its
    `await` peeled (`x = A() if c else await B()` -> A(), B())."""
    value = peel(value)
    if isinstance(value, ast.IfExp):
        yield from _outcomes(value.body)
        yield from _outcomes(value.orelse)
    else:
        yield value


# Role tables that only some calls can add to, and whether a file has one (`_classify_value`): a GradScaler
# construction (qualified name ending "GradScaler"), an autocast object (ending "autocast"), and
# `partial(autocast, ...)` (function name "partial", its first argument a name, attribute or alias ending
# "autocast"), and a scheduler (a function name holding "sched", or a qualified name "lr_scheduler": a name,
# an attribute or an import alias holds it). A model definition file has none of them.
_CAN_FILL = {"scaler_ctor": lambda m: m.may_call_ending("GradScaler"),
             "autocast_vars": lambda m: m.may_call_ending("autocast"),
             "scheduler_keys": lambda m: m.may_name_part("sched") or any(
                 "lr_scheduler" in qual for qual in m.names.alias.values()),
             "autocast_factories": lambda m: "partial" in m.calls_by_tail() and (m.may_name_part("autocast") or any(
                 qual.endswith("autocast") for qual in m.names.alias.values()))}


class Roles:
    """FileModel's part that collects names, assignments and what each object is."""

    def _collect(self) -> None:
        """One pass per node kind over the class index (walk order within each kind), not a dispatch
        over every node: names and attributes, most of a file, only feed the identifier set (model.py)."""
        of = self.of_class
        self.scaler_named = scaler_names = self.may_name_part("scaler")
        self._collect_calls(scaler_names)
        for node in self.in_walk_order(of(ast.FunctionDef), of(ast.AsyncFunctionDef)):
            self.functions.setdefault(node.name, []).append(node)
        for node in of(ast.ClassDef):
            self.classes[node.name] = node
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    self.parents_of_func[id(item)] = node
        # a scaler handed to code outside this file may be updated there
        self.scaler_passed = {k for k, t in self._passed_to if t not in self.functions}

    def _collect_assigns(self) -> None:
        """`assigns` (key -> its assigned values, in walk order) and `consts` (names assigned exactly once, to
        resolve dtype/device variables), on the first read of either (FileModel.__getattr__): a pass over
        every assignment of the file that a model definition file, asked nothing about its names, skips."""
        of = self.of_class
        self.assigns = assigns = {}
        consts: dict[str, ast.AST] = {}
        assign_counts: dict[str, int] = {}
        for node in self.in_walk_order(of(ast.Assign), [n for n in of(ast.AnnAssign) if n.value is not None]):
            for t in (node.targets if node.__class__ is ast.Assign else [node.target]):
                for sub in (t.elts if isinstance(t, ast.Tuple) else [t]):
                    k = tail(sub)
                    if k:
                        assigns.setdefault(k, []).append(node.value)
                        assign_counts[k] = assign_counts.get(k, 0) + 1
                        if isinstance(sub, ast.Name):
                            consts[k] = node.value
        self.consts = {k: v for k, v in consts.items() if assign_counts.get(k) == 1}

    def _role_table(self, name: str):
        """A role table on its first read: empty, without classifying anything, when no call of the file can
        add to it (`_CAN_FILL`); else the half models (`_find_half_models`) or all the others, built at once.
        A table known empty this way stays empty when the others are built later
        (tests/test_lint_on_demand.py forces every gate open)."""
        if name in _HALF_TABLES:
            self._find_half_models()
            return self.__dict__[name]
        can_fill = _CAN_FILL.get(name)
        if can_fill is not None and not can_fill(self):
            table = self.__dict__[name] = set() if name == "scheduler_keys" else {}
            return table
        self._classify_roles()
        return self.__dict__[name]

    def _classify_roles(self) -> None:
        """What each assigned name is (scaler, optimizer, scheduler, autocast object, instance of a local
        class): the `ROLES` but the half models, built on the first read of one of them
        (FileModel.__getattr__). A model definition file reads none of them (no step, no scaler, no autocast
        variable), and building them was a tenth of a bare parse on such trees. They depend only on what
        `_collect` gathered (names, assignments, constants, classes), so building them later gives what
        building them first gave."""
        self.scaler_ctor, self.optimizer_ctor, self.autocast_vars, self.autocast_factories = {}, {}, {}, {}
        self.scheduler_keys, self.instances = set(), {}
        for k, values in self.assigns.items():
            for v in values:
                if v.__class__ in _CALL_VALUES:
                    self._classify_value(k, v)

    def _find_half_models(self) -> None:
        """`halved` and `halved_pretrained`, on the first read of either: the names cast to half (`x.half()`,
        `.to(torch.float16)`, also through a dtype variable) or assigned a chain with a half link or float16
        `from_pretrained` weights. Read by the rules about saving and training half weights, which ask
        only once a file saves or trains something."""
        self.halved = halved = {}
        self.halved_pretrained = {}
        round_trips: set[int] = set()
        for node in self.calls_named("float"):  # model.half().float(): back in float32, before the casts are read
            r = receiver(node)
            if isinstance(r, ast.Call) and func_tail(r) in _CASTS:
                round_trips.add(id(r))
        to_calls = []
        for node in self.calls_named(*_CASTS):  # in walk order: the first cast of a base is kept
            if id(node) in round_trips:
                continue
            base = chain_base(receiver(node))
            if base and func_tail(node) == "to":
                to_calls.append((base, node))  # judged once every assignment is known (dtype variables)
            elif base:
                halved.setdefault(base, node)
        for base, node in to_calls:  # `.to(dtype=weight_dtype)`: half only if weight_dtype is always half
            if any(self.dtype_of(a) in {"fp16", "bf16"}
                   for a in list(node.args) + [k.value for k in node.keywords if k.arg == "dtype"]):
                halved.setdefault(base, node)
        for k, values in self.assigns.items():
            for v in values:
                if v.__class__ in _CALL_VALUES:
                    self._half_links(k, v)

    def _half_links(self, key: str, value: ast.AST) -> None:
        """model = Net().half().cuda(): the first half link (or float16 `from_pretrained`) of an assigned chain."""
        for link in _outcomes(value):
            self._half_link(key, link)

    def _half_link(self, key: str, link: ast.AST) -> None:
        while isinstance(link, ast.Call):
            lt = func_tail(link)
            if lt in {"half", "bfloat16"} or (lt == "to" and any(
                    self.dtype_of(a) in {"fp16", "bf16"} for a in list(link.args) + [k.value for k in link.keywords])):
                self.halved.setdefault(key, link)
                break
            if lt == "from_pretrained" and any(k.arg in {"torch_dtype", "dtype"} and self.dtype_of(k.value) == "fp16"
                                               for k in link.keywords):
                self.halved_pretrained.setdefault(key, link)  # float16 weights loaded straight from a hub
                break
            link = receiver(link)

    def _collect_calls(self, scaler_names: bool) -> None:
        """What calls of a few names say (finiteness checks, scaler methods, half casts, frozen weights),
        read from the call index by name, each name's calls in walk order. `scaler_names`: some identifier
        of the file holds "scaler" (else no argument can be a scaler handed on)."""
        index = self.calls_by_tail()
        if any(t in index for t in _FINITE_CHECKS):
            self.has_isfinite = True
        for node in self.calls_named("scale", "unscale_"):
            r = receiver(node)
            rk = tail(r) if r is not None else None
            if rk and "scal" in rk.lower():
                self.scaler_method_keys.add(rk)
        for node in self.calls_named("requires_grad_"):
            r = receiver(node)
            if r is not None and node.args and is_false(node.args[0]):
                self.frozen.add(tail(r) or "")
        if not scaler_names:
            return
        for node in self.calls:
            t = func_tail(node)
            for a in node.args:
                k = tail(a)
                if k and "scaler" in k.lower() and t not in _NOT_HANDING_ON:
                    self._passed_to.append((k, t))

    def _classify_value(self, key: str, value: ast.AST) -> None:
        for outcome in _outcomes(value):
            if isinstance(outcome, ast.Call):
                self._classify_call(key, outcome)

    def _classify_call(self, key: str, value: ast.Call) -> None:
        q = self.names.qual(value.func) or ""
        t = func_tail(value) or ""
        if t in {"GradScaler", "ShardedGradScaler"} or q.endswith("GradScaler"):
            self.scaler_ctor.setdefault(key, []).append(value)
        elif "lr_scheduler" in q or SCHED_NAME_RE.search(t) or _SCHEDULE_FACTORY.match(t):
            self.scheduler_keys.add(key)
        elif (q.startswith("torch.optim.") or t in OPTIMIZER_CLASSES or _OPTIMIZER_WORD.search(t)) \
                and not SCHED_NAME_RE.search(key):
            self.optimizer_ctor.setdefault(key, []).append(value)
        ac = self.autocast_of_call(value) if q.endswith("autocast") else None  # its own test, name resolved once
        if ac is not None:
            self.autocast_vars[key] = ac
        elif t == "partial" and value.args and self.is_autocast_callable(value.args[0]):
            self.autocast_factories[key] = value
        if t in self.classes:
            self.instances[key] = t
        inner = receiver(value)
        while isinstance(inner, ast.Call):  # model = Net().to(device) -> instance of Net
            if func_tail(inner) in self.classes:
                self.instances[key] = func_tail(inner)
            inner = receiver(inner) if receiver(inner) is not None else (inner.args[0] if inner.args else None)

    def scaler_origin(self, key: str | None) -> str:
        """'torch' (built by a GradScaler), 'other' (built only by something else: a framework's own
        `DynamicLossScaler`, a class of this file), or 'unknown' (an argument, an attribute set elsewhere)."""
        if not key:
            return "unknown"
        return self.memo.get(("scaler_origin", key), lambda: self._scaler_origin(key))

    def _scaler_origin(self, key: str) -> str:
        if key in self.scaler_ctor:
            return "torch"
        calls = [peel(v) for v in self.assigns.get(key, []) if isinstance(peel(v), ast.Call)]
        # only constructors tell the origin (`DynamicLossScaler(...)`); `kwargs.get("scaler")` does not
        if calls and all((func_tail(c) or "")[:1].isupper() and func_tail(c) not in {"GradScaler", "ShardedGradScaler"}
                         and not self._scaler_subclass(func_tail(c)) for c in calls):
            return "other"
        return "unknown"

    def _scaler_subclass(self, name: str | None) -> bool:
        cls = self.classes.get(name or "")
        return cls is not None and any("GradScaler" in text(b) for b in cls.bases)

    def is_scaler(self, key: str | None) -> bool:
        """Built by GradScaler(...), used with .scale()/.unscale_(), or a `*scaler*` name not built otherwise."""
        if not key:
            return False
        if key in self.scaler_ctor:
            return True
        if key not in self.scaler_method_keys and "scaler" not in key.lower():
            return False  # no test below can pass: the origin (read from the assignments) is not asked
        if self.scaler_origin(key) == "other":
            return False  # e.g. fairseq's DynamicLossScaler: its own scale()/update(), not torch's protocol
        if key in self.scaler_method_keys:
            return True
        return "scaler" in key.lower() and not SKLEARN_SCALER_RE.search(key.lower()) and not any(
            isinstance(v, ast.Call) for v in self.assigns.get(key, []))

    def scaler_enabled(self, key: str | None) -> bool:
        """False only when every construction says enabled=False literally."""
        ctors = self.scaler_ctor.get(key or "", [])
        if not ctors:
            return True
        return not all(kw_is_false(c, "enabled") for c in ctors)

    def scaler_enabled_state(self, key: str) -> str:
        states = set()
        for c in self.scaler_ctor.get(key, []):
            kw = kwarg(c, "enabled")
            states.add("yes" if kw is None or is_true(kw) else "no" if is_false(kw) else "dynamic")
        return "dynamic" if "dynamic" in states or len(states) > 1 else (states.pop() if states else "yes")

    def is_scheduler(self, key: str | None) -> bool:
        return bool(key) and (bool(SCHED_NAME_RE.search(key)) or key in self.scheduler_keys)

    def is_optimizer(self, key: str | None) -> bool:
        if not key or self.is_scheduler(key) or self.is_scaler(key):
            return False
        return key in self.optimizer_ctor or bool(OPT_NAME_RE.search(key))

    @property
    def any_scaler(self) -> bool:
        """Anything that looks like loss scaling (GradScaler, apex, timm NativeScaler, a `scaler` arg).
        Several rules ask; the scan of every identifier runs once per file."""
        return self.memo.get(("any_scaler",), self._any_scaler)

    def _any_scaler(self) -> bool:
        if self.scaler_ctor or self.scaler_method_keys:
            return True
        if not any(self.may_name_part(p) for p in ("scaler", "scale_loss", "loss_scale")):
            return False  # the test below needs a name holding one of these (three C-speed searches)
        named = [i for i in self.identifiers if "scal" in i]  # each test below needs "scal" in the name
        if not named:
            return False
        other = {k.lower() for k, vs in self.assigns.items() if any(
            isinstance(v, ast.Call) and re.search(r"(Standard|MinMax|Robust|MaxAbs)Scaler$", func_tail(v) or "")
            for v in vs)}  # sklearn feature scalers are not loss scaling
        return any(("scaler" in i and i not in other and not SKLEARN_SCALER_RE.search(i)) or "scale_loss" in i
                   or "loss_scale" in i
                   for i in named)

