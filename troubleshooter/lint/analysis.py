"""Parse a script once and derive what every rule needs: names, roles and ordered step events.

Rules never walk the AST for training-loop structure themselves. They read a `FileModel`:
- `names`: import aliases resolved to qualified names (`ac` -> `torch.amp.autocast`);
- roles by construction: which variables are GradScalers, optimizers, schedulers, autocast
  context objects (`ctx = torch.autocast(...)`), half-precision models;
- per scope (module level, each function or method), the ORDERED events of a training step:
  backward (scaled or not), unscale_, clip, .grad reads, optimizer/scaler steps, scaler.update,
  scheduler.step, torch.save, each tagged with the autocast regions, no_grad contexts, loops,
  `if` branches and accumulation guards it sits in.
Variables are keyed by their last name component (`self.scaler` and `scaler` are both
`scaler`) so roles follow an object across the methods of a class.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

# --- vocabularies ------------------------------------------------------------------------

CLIP_NAMES = {"clip_grad_norm_", "clip_grad_value_", "clip_grad_norm", "clip_grad_value",
              "dispatch_clip_grad", "clip_grad_norm_fp32"}
# Receivers whose clip/backward/save do the AMP bookkeeping themselves.
MANAGED_RE = re.compile(r"accelerator|fabric|engine|deepspeed|trainer|lightning", re.I)
OPTIMIZER_CLASSES = {"SGD", "Adam", "AdamW", "Adagrad", "Adadelta", "Adamax", "RMSprop", "Rprop",
                     "NAdam", "RAdam", "LBFGS", "SparseAdam", "Lion", "Adafactor", "LAMB", "Lamb",
                     "FusedAdam", "FusedLAMB", "AdamW8bit", "Adam8bit", "SophiaG", "Muon",
                     "ZeroRedundancyOptimizer", "Shampoo", "Adan", "LARS"}
OPT_NAME_RE = re.compile(r"optim|^opt$|^opt[_A-Z0-9]|_opt$|_opt_|^optimizer", re.I)
SCHED_NAME_RE = re.compile(r"sched", re.I)
EVAL_FUNC_RE = re.compile(r"eval|valid|test|infer|predict|generate|sample|decode|export|benchmark", re.I)
ZEROING = {"zero_", "detach_", "requires_grad_", "fill_"}
FP16_DTYPES = {"torch.float16", "torch.half", "float16", "half", "fp16", "torch.cuda.HalfTensor"}
BF16_DTYPES = {"torch.bfloat16", "bfloat16", "bf16"}
FP32_DTYPES = {"torch.float32", "torch.float", "float32", "fp32"}


_SKLEARN_SCALER = re.compile(r"(standard|minmax|robust|maxabs)scaler$")


def walk(node: ast.AST) -> list[ast.AST]:
    """All nodes under `node` (itself first), as a list: ~2x faster than `ast.walk`'s generator."""
    out = [node]
    i = 0
    AST = ast.AST
    while i < len(out):
        n = out[i]
        i += 1
        for name in n._fields:
            v = getattr(n, name, None)
            if v.__class__ is list:
                for x in v:
                    if isinstance(x, AST):
                        out.append(x)
            elif isinstance(v, AST):
                out.append(v)
    return out


def tail(node: ast.AST) -> str | None:
    """Last name component: `self.scaler` -> 'scaler', `scaler` -> 'scaler', `f()` -> None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def chain_base(node: ast.AST | None) -> str | None:
    """`model.cuda().half()` -> 'model': the object at the root of a method-call chain."""
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        node = node.func.value
    return tail(node) if isinstance(node, (ast.Name, ast.Attribute)) else None


def func_tail(call: ast.Call) -> str | None:
    return tail(call.func)


def receiver(call: ast.Call) -> ast.AST | None:
    return call.func.value if isinstance(call.func, ast.Attribute) else None


def text(node: ast.AST | None) -> str:
    if node is None:
        return ""
    try:
        return ast.unparse(node)
    except Exception:  # pragma: no cover - unparse handles every parsed node
        return ""


def names_in(node: ast.AST | None) -> set[str]:
    """Every Name id and attribute name mentioned in an expression."""
    out: set[str] = set()
    if node is None:
        return out
    for n in walk(node):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
    return out


# --- imports -------------------------------------------------------------------------------

class Names:
    """Import aliases -> qualified names, collected from every import anywhere in the file."""

    def __init__(self, nodes: list[ast.AST]):
        self.alias: dict[str, str] = {}
        self.imports: list[tuple[ast.AST, str, str]] = []  # (node, local name, qualified)
        for node in nodes:
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        self.alias[a.asname] = a.name
                        self.imports.append((node, a.asname, a.name))
                    else:
                        self.alias.setdefault(a.name.split(".")[0], a.name.split(".")[0])
                        self.imports.append((node, a.name.split(".")[0], a.name))
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    local = a.asname or a.name
                    qual = f"{node.module}.{a.name}"
                    # A later unguarded import wins over a try/except fallback seen first.
                    self.alias[local] = qual if local not in self.alias or not _is_old(qual) else self.alias[local]
                    self.imports.append((node, local, qual))

    def qual(self, node: ast.AST | None) -> str | None:
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name):
            base = self.alias.get(node.id, node.id)
            return ".".join([base, *reversed(parts)])
        return None


def _is_old(qual: str) -> bool:
    return ".cuda.amp." in qual or ".cpu.amp." in qual


# --- autocast --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Autocast:
    """An autocast region's settings, as far as the source tells them."""

    dtype: str  # fp16 | bf16 | fp32 | unknown
    device: str  # cuda | cpu | unknown
    enabled: str  # yes | no | dynamic
    line: int
    col: int
    # The device came from a variable whose value depends on the machine (`"cuda" if
    # torch.cuda.is_available() else "cpu"`, a `device` argument): true on CUDA only.
    conditional: bool = False

    @property
    def active(self) -> bool:
        return self.enabled != "no" and self.dtype != "fp32"

    @property
    def fp16(self) -> bool:
        return self.active and self.dtype == "fp16"


DEPRECATED = {
    "torch.cuda.amp.autocast": 'torch.amp.autocast("cuda", ...)',
    "torch.cuda.amp.GradScaler": 'torch.amp.GradScaler("cuda", ...)',
    "torch.cpu.amp.autocast": 'torch.amp.autocast("cpu", ...)',
    "torch.cpu.amp.GradScaler": 'torch.amp.GradScaler("cpu", ...)',
    "torch.cuda.amp.custom_fwd": 'torch.amp.custom_fwd(device_type="cuda")',
    "torch.cuda.amp.custom_bwd": 'torch.amp.custom_bwd(device_type="cuda")',
    "torch.cuda.amp.autocast_mode.autocast": 'torch.amp.autocast("cuda", ...)',
    "torch.cuda.amp.grad_scaler.GradScaler": 'torch.amp.GradScaler("cuda", ...)',
}


# --- events --------------------------------------------------------------------------------

BACKWARD, UNSCALE, CLIP, GRAD, OPT_STEP, SCALER_STEP, UPDATE, SCHED_STEP, SAVE, SCALE, \
    GET_SCALE, ZERO_GRAD, CALL = ("backward", "unscale", "clip", "grad", "opt_step", "scaler_step",
                                  "update", "sched_step", "save", "scale", "get_scale", "zero_grad", "call")
HELPER_OPT_STEP = "helper_opt_step"  # a call to a local helper that steps an optimizer with no scaler in it


@dataclass
class Loop:
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
    key = text(test)
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
    region_calls: list[tuple[Autocast, ast.Call]] = field(default_factory=list)  # calls under autocast
    nograd_func: bool = False
    branch_kinds: dict = field(default_factory=dict)  # stmt id -> {branch index: set(kinds)}

    def of(self, *kinds: str) -> list[Event]:
        return [e for e in self.events if e.kind in kinds]

    @property
    def is_eval(self) -> bool:
        return self.nograd_func or bool(EVAL_FUNC_RE.search(self.name))

    def sibling_has(self, e: Event, kinds: set[str]) -> bool:
        """True when another branch of an if/try that holds e contains one of `kinds`."""
        for s, i, _, _ in e.branches:
            for j, ks in self.branch_kinds.get(s, {}).items():
                if j != i and ks & kinds:
                    return True
        return False


# --- the model -------------------------------------------------------------------------------

class FileModel:
    """Everything rules ask about one file, computed once."""

    def __init__(self, tree: ast.Module, source: str):
        self.tree = tree
        self.source = source
        self.lines = source.splitlines()
        self.nodes = walk(tree)
        self._subtrees: dict[int, list[ast.AST]] = {id(tree): self.nodes}
        self.names = Names(self.nodes)
        self.assigns: dict[str, list[ast.AST]] = {}  # key -> assigned values
        self.consts: dict[str, ast.AST] = {}
        self.functions: dict[str, list[ast.AST]] = {}
        self.classes: dict[str, ast.ClassDef] = {}
        self.parents_of_func: dict[int, ast.ClassDef] = {}
        self.scaler_ctor: dict[str, list[ast.Call]] = {}
        self.optimizer_ctor: dict[str, list[ast.Call]] = {}
        self.scheduler_keys: set[str] = set()
        self.autocast_vars: dict[str, Autocast] = {}
        self.autocast_factories: dict[str, ast.Call] = {}
        self.halved: dict[str, ast.AST] = {}
        self.halved_pretrained: dict[str, ast.AST] = {}
        self.frozen: set[str] = set()
        self.instances: dict[str, str] = {}  # key -> local class name
        self.identifiers: set[str] = set()
        self.scaler_method_keys: set[str] = set()
        self.scaler_passed: set[str] = set()
        self._passed_to: list[tuple[str, str | None]] = []
        self.has_isfinite = False
        self._round_trips: set[int] = set()
        self.local_scaler_classes: set[str] = set()
        self._collect()
        self.scopes: list[Scope] = []
        self._build_scopes()

    # roles ---------------------------------------------------------------------------------

    def _collect(self) -> None:
        assign_counts: dict[str, int] = {}
        for node in self.nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions.setdefault(node.name, []).append(node)
                for a in node.args.args + node.args.kwonlyargs:
                    self.identifiers.add(a.arg.lower())
            elif isinstance(node, ast.ClassDef):
                self.classes[node.name] = node
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        self.parents_of_func[id(item)] = node
            elif isinstance(node, ast.Name):
                self.identifiers.add(node.id.lower())
            elif isinstance(node, ast.Attribute):
                self.identifiers.add(node.attr.lower())
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    for sub in (t.elts if isinstance(t, ast.Tuple) else [t]):
                        k = tail(sub)
                        if k:
                            self.assigns.setdefault(k, []).append(node.value)
                            assign_counts[k] = assign_counts.get(k, 0) + 1
                            if isinstance(sub, ast.Name):
                                self.consts[k] = node.value
            elif isinstance(node, ast.Call):
                self._collect_call(node)
        # a scaler handed to code outside this file may be updated there
        self.scaler_passed = {k for k, t in self._passed_to if t not in self.functions}
        # consts: names assigned exactly once, used to resolve dtype/device variables
        self.consts = {k: v for k, v in self.consts.items() if assign_counts.get(k) == 1}
        for k, values in self.assigns.items():
            for v in values:
                self._classify_value(k, v)

    def _collect_call(self, node: ast.Call) -> None:
        t = func_tail(node)
        r = receiver(node)
        rk = tail(r) if r is not None else None
        if t in {"isfinite", "isnan", "isinf", "nan_to_num", "isfinite_", "all_finite"}:
            self.has_isfinite = True
        if rk and t in {"scale", "unscale_"} and "scal" in rk.lower():
            self.scaler_method_keys.add(rk)
        base = chain_base(r)
        if t == "float" and isinstance(r, ast.Call) and func_tail(r) in {"half", "bfloat16", "to"}:
            self._round_trips.add(id(r))  # model.half().float(): back in float32 (parents are seen first)
        if id(node) in self._round_trips:
            pass
        elif t in {"half", "bfloat16"} and base:
            self.halved.setdefault(base, node)
        if t == "to" and base and id(node) not in self._round_trips:
            for a in list(node.args) + [k.value for k in node.keywords if k.arg == "dtype"]:
                if self.dtype_of(a) in {"fp16", "bf16"}:
                    self.halved.setdefault(base, node)
        if t == "requires_grad_" and r is not None and node.args and _is_false(node.args[0]):
            self.frozen.add(tail(r) or "")
        if t == "eval" and r is not None and tail(r):
            pass
        for a in node.args:
            k = tail(a)
            if k and "scaler" in k.lower() and t not in {"step", "unscale_", "scale", "update", "state_dict",
                                                         "load_state_dict", "save", "print", "isinstance"}:
                self._passed_to.append((k, t))

    def _classify_value(self, key: str, value: ast.AST) -> None:
        value = _peel(value)
        if isinstance(value, ast.IfExp):
            for branch in (value.body, value.orelse):
                self._classify_value(key, branch)
            return
        if not isinstance(value, ast.Call):
            if isinstance(value, (ast.Name, ast.Attribute)) and tail(value) in self.classes:
                pass
            return
        q = self.names.qual(value.func) or ""
        t = func_tail(value) or ""
        if t in {"GradScaler", "ShardedGradScaler"} or q.endswith("GradScaler"):
            self.scaler_ctor.setdefault(key, []).append(value)
        elif "lr_scheduler" in q or SCHED_NAME_RE.search(t) or re.match(r"get_\w*schedule", t):
            self.scheduler_keys.add(key)
        elif (q.startswith("torch.optim.") or t in OPTIMIZER_CLASSES or re.search(r"optimizer", t, re.I)) \
                and not SCHED_NAME_RE.search(key):
            self.optimizer_ctor.setdefault(key, []).append(value)
        ac = self.autocast_of_call(value)
        if ac is not None:
            self.autocast_vars[key] = ac
        elif t == "partial" and value.args and self.is_autocast_callable(value.args[0]):
            self.autocast_factories[key] = value
        if t in self.classes:
            self.instances[key] = t
        link = value
        while isinstance(link, ast.Call):  # model = Net().half().cuda(): any half link in the chain
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
        if key in self.scaler_ctor:
            return "torch"
        calls = [_peel(v) for v in self.assigns.get(key, []) if isinstance(_peel(v), ast.Call)]
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
        if self.scaler_origin(key) == "other":
            return False  # e.g. fairseq's DynamicLossScaler: its own scale()/update(), not torch's protocol
        if key in self.scaler_method_keys:
            return True
        return "scaler" in key.lower() and not _SKLEARN_SCALER.search(key.lower()) and not any(
            isinstance(v, ast.Call) for v in self.assigns.get(key, []))

    def scaler_enabled(self, key: str | None) -> bool:
        """False only when every construction says enabled=False literally."""
        ctors = self.scaler_ctor.get(key or "", [])
        if not ctors:
            return True
        return not all(_kw_is_false(c, "enabled") for c in ctors)

    def scaler_enabled_state(self, key: str) -> str:
        states = set()
        for c in self.scaler_ctor.get(key, []):
            kw = _kw(c, "enabled")
            states.add("yes" if kw is None or _is_true(kw) else "no" if _is_false(kw) else "dynamic")
        return "dynamic" if "dynamic" in states or len(states) > 1 else (states.pop() if states else "yes")

    def is_scheduler(self, key: str | None) -> bool:
        return bool(key) and (key in self.scheduler_keys or bool(SCHED_NAME_RE.search(key)))

    def is_optimizer(self, key: str | None) -> bool:
        if not key or self.is_scheduler(key) or self.is_scaler(key):
            return False
        return key in self.optimizer_ctor or bool(OPT_NAME_RE.search(key))

    @property
    def any_scaler(self) -> bool:
        """Anything that looks like loss scaling (GradScaler, apex, timm NativeScaler, a `scaler` arg)."""
        if self.scaler_ctor or self.scaler_method_keys:
            return True
        other = {k.lower() for k, vs in self.assigns.items() if any(
            isinstance(v, ast.Call) and re.search(r"(Standard|MinMax|Robust|MaxAbs)Scaler$", func_tail(v) or "")
            for v in vs)}  # sklearn feature scalers are not loss scaling
        return any(("scaler" in i and i not in other and not _SKLEARN_SCALER.search(i)) or "scale_loss" in i
                   or "loss_scale" in i
                   for i in self.identifiers)

    # dtype / device / autocast ---------------------------------------------------------------

    def dtype_of(self, node: ast.AST | None, depth: int = 0) -> str:
        if node is None:
            return "unknown"
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            s = node.value.lower()
        elif isinstance(node, ast.Call) and func_tail(node) == "getattr" and len(node.args) == 2 \
                and isinstance(node.args[1], ast.Constant):
            s = str(node.args[1].value).lower()
        else:
            s = self.names.qual(node) or ""
            if isinstance(node, ast.Name) and node.id in self.consts and depth < 3:
                return self.dtype_of(self.consts[node.id], depth + 1)
        if s in FP16_DTYPES:
            return "fp16"
        if s in BF16_DTYPES:
            return "bf16"
        if s in FP32_DTYPES:
            return "fp32"
        return "unknown"

    def device_of(self, node: ast.AST | None, depth: int = 0) -> str:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            d = node.value.split(":")[0].lower()
            return d if d in {"cuda", "cpu"} else "unknown"
        if isinstance(node, ast.Name) and node.id in self.consts and depth < 3:
            return self.device_of(self.consts[node.id], depth + 1)
        return "unknown"

    def device_candidates(self, node: ast.AST | None, depth: int = 0) -> set[str]:
        """Every device a device expression can take, following `str(d)`, `d.type`, `torch.device(...)`,
        `x if c else y` and every assignment of a name in the file; 'unknown' where a value is opaque."""
        if node is None or depth > 4:
            return {"unknown"}
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            d = node.value.split(":")[0].lower()
            return {d if d in {"cuda", "cpu", "mps", "xpu"} else "unknown"}
        if isinstance(node, ast.IfExp):
            return self.device_candidates(node.body, depth + 1) | self.device_candidates(node.orelse, depth + 1)
        if isinstance(node, ast.Call):
            t = func_tail(node)
            if t in {"str", "device"} and node.args:
                return self.device_candidates(node.args[0], depth + 1)
            if t == "split" and isinstance(node.func, ast.Attribute):
                return self.device_candidates(node.func.value, depth + 1)
            return {"unknown"}
        if isinstance(node, ast.Subscript):
            return self.device_candidates(node.value, depth + 1)
        if isinstance(node, ast.Attribute) and node.attr == "type":
            return self.device_candidates(node.value, depth + 1)
        if isinstance(node, (ast.Name, ast.Attribute)):
            values = self.assigns.get(tail(node) or "", [])
            if not values:
                return {"unknown"}
            out: set[str] = set()
            for v in values:
                out |= self.device_candidates(v, depth + 1)
            return out
        return {"unknown"}

    @property
    def moves_to_cuda(self) -> bool:
        """The script puts something on a CUDA device (`.cuda()`, `.to("cuda")`, `device="cuda"`)."""
        cached = self.__dict__.get("_moves_to_cuda")
        if cached is None:
            cached = any(isinstance(n, ast.Call) and func_tail(n) == "cuda" for n in self.nodes) or any(
                isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.split(":")[0] == "cuda"
                for n in self.nodes)
            self._moves_to_cuda = cached
        return cached

    def resolve_device(self, node: ast.AST | None) -> tuple[str, bool]:
        """(device, conditional) of an autocast device argument; conditional when it may also be the CPU."""
        direct = self.device_of(node)
        if direct != "unknown" or node is None or isinstance(node, ast.Constant):
            return direct, False
        cands = self.device_candidates(node)
        if cands == {"cuda"}:
            return "cuda", False
        if "cuda" in cands or ("unknown" in cands and self.moves_to_cuda):
            return "cuda", True
        if cands == {"cpu"}:
            return "cpu", False
        return "unknown", False

    def is_autocast_callable(self, func: ast.AST) -> bool:
        q = self.names.qual(func) or ""
        return q.endswith("autocast") and (q.startswith("torch") or q == "autocast")

    def autocast_of_call(self, call: ast.Call, extra: ast.Call | None = None) -> Autocast | None:
        """Autocast settings of `torch.autocast(...)`, `torch.cuda.amp.autocast(...)`, aliases."""
        if not self.is_autocast_callable(call.func):
            return None
        q = self.names.qual(call.func) or ""
        args = list(call.args)
        kws = {k.arg: k.value for k in call.keywords if k.arg}
        if extra is not None:  # partial(torch.autocast, device_type=..., dtype=...)
            args = list(extra.args[1:]) + args
            kws = {**{k.arg: k.value for k in extra.keywords if k.arg}, **kws}
        old_cuda = ".cuda.amp" in q
        old_cpu = ".cpu.amp" in q
        conditional = False
        if not (old_cuda or old_cpu) and q == "autocast":  # unresolved bare name: guess by first arg
            old_cuda = not (("device_type" in kws) or (args and isinstance(args[0], ast.Constant)
                                                       and isinstance(args[0].value, str)))
        if old_cuda or old_cpu:
            device = "cuda" if old_cuda else "cpu"
            enabled = kws.get("enabled", args[0] if args else None)
            dtype_node = kws.get("dtype", args[1] if len(args) > 1 else None)
        else:
            device, conditional = self.resolve_device(kws.get("device_type", args[0] if args else None))
            dtype_node = kws.get("dtype", args[1] if len(args) > 1 else None)
            enabled = kws.get("enabled", args[2] if len(args) > 2 else None)
        if dtype_node is None:
            dtype = {"cuda": "fp16", "cpu": "bf16"}.get(device, "unknown")
        else:
            dtype = self.dtype_of(dtype_node)
        en = "yes" if enabled is None or _is_true(enabled) else "no" if _is_false(enabled) else "dynamic"
        return Autocast(dtype, device, en, call.lineno, call.col_offset, conditional)

    def autocast_of_with(self, expr: ast.AST) -> Autocast | None:
        """The autocast region a `with` item opens, if it is one."""
        if isinstance(expr, ast.Call):
            ac = self.autocast_of_call(expr)
            if ac is not None:
                return ac
            k = func_tail(expr)
            if k in self.autocast_factories:
                f = self.autocast_factories[k]
                return self.autocast_of_call(ast.Call(func=f.args[0], args=expr.args, keywords=expr.keywords,
                                                      lineno=expr.lineno, col_offset=expr.col_offset), extra=f)
            if k and "autocast" in k.lower():
                return Autocast("unknown", "unknown", "dynamic", expr.lineno, expr.col_offset)
            return None
        k = tail(expr)
        if k in self.autocast_vars:
            a = self.autocast_vars[k]
            return Autocast(a.dtype, a.device, a.enabled, expr.lineno, expr.col_offset, a.conditional)
        if k and "autocast" in k.lower():
            return Autocast("unknown", "unknown", "dynamic", expr.lineno, expr.col_offset)
        return None

    def is_nograd(self, expr: ast.AST) -> bool:
        if isinstance(expr, ast.Call):
            t = func_tail(expr)
            if t in {"no_grad", "inference_mode"}:
                return not (expr.args and _is_false(expr.args[0]))
            if t == "set_grad_enabled" and expr.args and _is_false(expr.args[0]):
                return True
        return False

    # scopes ----------------------------------------------------------------------------------

    def _build_scopes(self) -> None:
        self.scopes.append(_Walker(self, Scope(self.tree, "<module>", None)).run(self.tree.body))
        for node in self.nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                cls = self.parents_of_func.get(id(node))
                scope = Scope(node, node.name, cls.name if cls else None)
                regions: list[Autocast] = []
                for d in node.decorator_list:
                    if self.is_nograd(d) or (isinstance(d, (ast.Name, ast.Attribute)) and
                                             tail(d) in {"no_grad", "inference_mode"}):
                        scope.nograd_func = True
                    ac = self.autocast_of_with(d) if isinstance(d, ast.Call) else None
                    if ac is not None:
                        regions.append(ac)
                self.scopes.append(_Walker(self, scope, tuple(regions)).run(node.body))
        self.by_name: dict[str, list[Scope]] = {}
        for s in self.scopes:
            self.by_name.setdefault(s.name, []).append(s)

    def subtree(self, node: ast.AST) -> list[ast.AST]:
        """Cached `walk(node)` for scopes and defs that several rules search."""
        key = id(node)
        if key not in self._subtrees:
            self._subtrees[key] = walk(node)
        return self._subtrees[key]

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


class _Walker:
    """Walk one scope's statements in order, recording events with their context."""

    def __init__(self, model: FileModel, scope: Scope, regions: tuple = ()):
        self.m = model
        self.s = scope
        self.order = 0
        self.base_regions = regions
        self.loop_id = 0
        self._local_scaled: set[str] = set()
        self._apex_scaled: set[str] = set()

    def run(self, body: list[ast.stmt]) -> Scope:
        self._body(body, ((), (), self.base_regions, self.s.nograd_func, ()))
        return self.s

    def _body(self, body, ctx) -> None:
        for st in body:
            self._stmt(st, ctx)

    def _branch(self, ctx, stmt, idx, key="", pol=True):
        loops, branches, regions, nograd, guards = ctx
        return loops, branches + ((id(stmt), idx, key, pol),), regions, nograd, guards

    def _stmt(self, st: ast.stmt, ctx) -> None:
        loops, branches, regions, nograd, guards = ctx
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return
        if isinstance(st, (ast.For, ast.AsyncFor, ast.While)):
            self._exprs(st.iter if not isinstance(st, ast.While) else st.test, ctx)
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
            self._exprs(st.test, ctx)
            key, pol = cond_key(st.test)
            body_ctx = self._branch(ctx, st, 0, key, pol)
            count = _accum_count(st.test)
            if count is not False:
                g = Guard(st, count)
                self.s.guards.append(g)
                body_ctx = body_ctx[:4] + (guards + (g,),)
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
                self._exprs(item.context_expr, ctx)
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
            self._exprs(st.subject, ctx)
            for i, case in enumerate(st.cases):
                start = self._count_start()
                self._body(case.body, self._branch(ctx, st, i))
                self._mark(st, i, start)
            return
        if isinstance(st, ast.Assign) and isinstance(st.value, ast.Call) and self._is_scale_call(st.value):
            for t in st.targets:
                if tail(t):
                    self._local_scaled.add(tail(t))
        self._exprs(st, ctx)

    def _count_start(self) -> int:
        return len(self.s.events)

    def _mark(self, stmt, idx, start) -> None:
        kinds = {e.kind for e in self.s.events[start:]}
        self.s.branch_kinds.setdefault(id(stmt), {}).setdefault(idx, set()).update(kinds)

    def _is_scale_call(self, node: ast.AST) -> bool:
        return (isinstance(node, ast.Call) and func_tail(node) == "scale" and receiver(node) is not None
                and (self.m.is_scaler(tail(receiver(node))) or "scal" in (tail(receiver(node)) or "").lower()))

    def _exprs(self, node: ast.AST, ctx) -> None:
        calls: list[ast.AST] = []
        skip_grad: set[int] = set()
        for n in walk(node):
            if isinstance(n, ast.Call):
                calls.append(n)
                f = n.func
                if isinstance(f, ast.Attribute):
                    inner = f.value
                    if isinstance(inner, ast.Attribute) and inner.attr == "data":
                        inner = inner.value
                    if isinstance(inner, ast.Attribute) and inner.attr == "grad" and f.attr in ZEROING:
                        skip_grad.add(id(inner))
                    if f.attr in ZEROING and isinstance(inner, ast.Subscript):
                        g = _grad_of(inner)  # p.grad[rows].zero_(): zero is zero at any loss scale
                        if g is not None:
                            skip_grad.add(id(g))
                    if f.attr == "grad":
                        skip_grad.add(id(f))  # torch.autograd.grad(...)
            elif isinstance(n, ast.Attribute) and n.attr == "grad":
                calls.append(n)
            elif isinstance(n, ast.Compare) and any(isinstance(c, ast.Constant) and c.value is None
                                                    for c in n.comparators):
                for side in [n.left, *n.comparators]:
                    if isinstance(side, ast.Attribute) and side.attr == "grad":
                        skip_grad.add(id(side))
            elif isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) and n.value.value is None:
                for t in n.targets:
                    skip_grad.add(id(t))
            elif isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) and n.value.value == 0 \
                    and not isinstance(n.value.value, bool):
                for t in n.targets:  # p.grad[rows] = 0 freezes rows; zero is scale-invariant
                    g = _grad_of(t) if isinstance(t, ast.Subscript) else None
                    if g is not None:
                        skip_grad.add(id(g))
            elif isinstance(n, ast.Lambda):
                pass
        if isinstance(node, (ast.Assign, ast.AugAssign)) and isinstance(node, ast.Assign):
            pass
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
        q = m.names.qual(c.func) or ""
        if t:
            self.s.calls.add(t)
        regions = ctx[2]
        if regions and regions[-1].active and not ctx[3]:
            self.s.region_calls.append((regions[-1], c))
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
                (t and "save" in t.lower() and c.args and _dict_like(c.args[0])):
            self._add(SAVE, c, ctx, recv=rk, arg=c.args[0] if c.args else None)
            return
        # a call to a helper defined in this file: summarise what it does to the step
        defs = m.local_defs(t) if (r is None or rk == "self") else []
        for kind in (UNSCALE, GRAD, SCALER_STEP, UPDATE):
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

    _def_cache: dict = {}

    def _def_has(self, d: ast.AST, kind: str) -> bool:
        key = (id(d), kind)
        cache = self.m.__dict__.setdefault("_def_cache", {})
        if key not in cache:
            cache[key] = False  # a helper that (indirectly) calls itself adds nothing
            found = False
            for n in self.m.subtree(d):
                if kind == GRAD and isinstance(n, ast.Attribute) and n.attr == "grad" and \
                        not isinstance(getattr(n, "ctx", None), ast.Store):
                    found = True
                elif isinstance(n, ast.Call) and receiver(n) is not None and self.m.is_scaler(tail(receiver(n))):
                    found = found or {UNSCALE: "unscale_", SCALER_STEP: "step", UPDATE: "update"}.get(kind) == func_tail(n)
                if found:
                    break
            if kind == GRAD and found:
                # a helper that zeroes or tests grads for None is not a read
                reads = [n for n in walk(d) if isinstance(n, ast.Attribute) and n.attr == "grad"]
                found = any(_is_grad_read(n, d) for n in reads)
            if not found:  # trainer classes nest helpers: step() -> _unscale_and_clip() -> scaler.unscale_
                found = any(self._def_has(inner, kind) for inner in self._called_defs(d))
            cache[key] = found
        return cache[key]

    def _called_defs(self, d: ast.AST) -> list[ast.AST]:
        """Functions of this file that `d` calls by name or as `self.method(...)`."""
        out = []
        for n in self.m.subtree(d):
            if isinstance(n, ast.Call):
                r = receiver(n)
                if r is None or (isinstance(r, ast.Name) and r.id == "self"):
                    out += [f for f in self.m.local_defs(func_tail(n)) if f is not d]
        return out


def _grad_of(sub: ast.Subscript) -> ast.Attribute | None:
    """The `.grad` attribute under `x.grad[...]` / `x.grad.data[...]`, or None."""
    v = sub.value
    if isinstance(v, ast.Attribute) and v.attr == "data":
        v = v.value
    return v if isinstance(v, ast.Attribute) and v.attr == "grad" else None


def _is_grad_read(node: ast.Attribute, root: ast.AST) -> bool:
    for parent in walk(root):
        if isinstance(parent, ast.Compare) and (parent.left is node or node in parent.comparators):
            return False
        if isinstance(parent, ast.Attribute) and parent.value is node and parent.attr in ZEROING | {"data"}:
            return parent.attr == "data"
        if isinstance(parent, ast.Assign) and node in parent.targets:
            return False
    return True


def _accum_count(test: ast.AST):
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


def _dict_like(node: ast.AST) -> bool:
    """What a save helper's first argument looks like when it is a checkpoint: a dict display, a
    name (`to_save`, `checkpoint`), `dict(...)` or `asdict(state)`."""
    return isinstance(node, (ast.Dict, ast.Name)) or (
        isinstance(node, ast.Call) and func_tail(node) in {"dict", "asdict", "vars"})


def _peel(value: ast.AST) -> ast.AST:
    return value.value if isinstance(value, ast.Await) else value


def _kw(call: ast.Call, name: str) -> ast.AST | None:
    for k in call.keywords:
        if k.arg == name:
            return k.value
    return None


def _kw_is_false(call: ast.Call, name: str) -> bool:
    v = _kw(call, name)
    return v is not None and _is_false(v)


def _is_false(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value in (False, 0) and node.value is not None


def _is_true(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is True
