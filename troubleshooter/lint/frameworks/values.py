"""What a setting's expression can be, and how sure we are: a literal in the call, an argparse or
dataclass default the command line may override, a value read from a config file, or unknown.

Framework precision is rarely a literal: `Accelerator(mixed_precision=args.mixed_precision)`,
`TrainingArguments(fp16=training_args.fp16)`, `Trainer(precision=cfg["precision"])`. A rule's
severity follows the certainty: an `error` needs a literal, a default gives a `warning` that names
it, and nothing known gives silence or `info`.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass

from ..analysis import func_tail, kwarg, tail, text
from .configs import ConfigFile, configs_of

LITERAL, DEFAULT, CONFIG, DYNAMIC, UNKNOWN = "literal", "default", "config", "dynamic", "unknown"


@dataclass(frozen=True)
class Value:
    """The values an expression may take (`options`), how they are known, and the evidence."""

    options: tuple = ()
    how: str = UNKNOWN
    evidence: str = ""
    line: int | None = None

    @property
    def known(self) -> bool:
        return bool(self.options) and self.how != UNKNOWN

    @property
    def certain(self) -> bool:
        """One value, written in the code itself."""
        return self.how == LITERAL and len(self.options) == 1

    def may(self, *values) -> bool:
        return any(o in values for o in self.options)

    def only(self, *values) -> bool:
        return self.known and all(o in values for o in self.options)

    def mapped(self, fn) -> "Value":
        return Value(tuple(dict.fromkeys(fn(o) for o in self.options)), self.how, self.evidence, self.line)


NOTHING = Value()


def _const(node: ast.AST):
    if isinstance(node, ast.Constant):
        return True, node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        return True, -node.operand.value if isinstance(node.operand.value, (int, float)) else None
    return False, None


def literal_dict(node: ast.AST, m=None, depth: int = 0) -> dict | None:
    """A dict display of constants (nested), e.g. a DeepSpeed config written in the script.
    Values that are not constants become "<expr>" (present, but not known)."""
    if isinstance(node, ast.Call) and func_tail(node) == "dict" and not node.args:
        return {k.arg: _literal_item(k.value, m, depth) for k in node.keywords if k.arg}
    if not isinstance(node, ast.Dict):
        return None
    out = {}
    for k, v in zip(node.keys, node.values):
        if isinstance(k, ast.Constant) and isinstance(k.value, str):
            out[k.value] = _literal_item(v, m, depth)
    return out


def _literal_item(v: ast.AST, m, depth: int):
    ok, value = _const(v)
    if ok:
        return value
    sub = literal_dict(v, m, depth + 1) if depth < 6 else None
    if sub is not None:
        return sub
    if m is not None and depth < 4:
        r = resolve(m, v, depth + 2)
        if r.known and len(r.options) == 1:
            return r.options[0]
    return "<expr>"


def _argparse_default(m, attr: str) -> Value | None:
    """The default of `--attr` (or dest=attr) in any add_argument of the file; store_true is False."""
    hit = m.memo.get(("argparse_defaults",), lambda: _argparse_index(m)).get(attr)
    return hit


def _argparse_index(m) -> dict[str, Value]:
    index: dict[str, Value] = {}
    for c in m.calls:
        t = func_tail(c)
        if t == "set_defaults":
            for k in c.keywords:
                ok, v = _const(k.value)
                if k.arg and ok:
                    index[k.arg] = Value((v,), DEFAULT, f"parser.set_defaults({k.arg}={v!r}) (line {c.lineno})", c.lineno)
            continue
        if t not in {"add_argument", "option"}:
            continue
        names = [a.value for a in c.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        dest_kw = kwarg(c, "dest")
        if isinstance(dest_kw, ast.Constant) and isinstance(dest_kw.value, str):
            dest = dest_kw.value
        else:
            longs = [n for n in names if n.startswith("--")] or [n for n in names if not n.startswith("-")] or names
            if not longs:
                continue
            dest = longs[0].lstrip("-").replace("-", "_")
        action = kwarg(c, "action")
        act = action.value if isinstance(action, ast.Constant) else None
        default = kwarg(c, "default")
        flag = kwarg(c, "is_flag")
        shown = names[0] if names else dest
        if default is not None and not (isinstance(default, ast.Constant) and default.value is None
                                        and isinstance(kwarg(c, "choices"), (ast.List, ast.Tuple))):
            ok, v = _const(default)
            if ok:
                choices = kwarg(c, "choices")
                extra = ""
                if isinstance(choices, (ast.List, ast.Tuple)):
                    opts = [e.value for e in choices.elts if isinstance(e, ast.Constant)]
                    extra = f", choices {opts}"
                index[dest] = Value((v,), DEFAULT, f"`{shown}` defaults to {v!r} (line {c.lineno}{extra})", c.lineno)
        elif act in {"store_true", "store_false"} or (flag is not None and isinstance(flag, ast.Constant) and flag.value):
            v = act == "store_false"
            index[dest] = Value((v,), DEFAULT, f"`{shown}` is a flag, off unless passed (line {c.lineno})", c.lineno)
        else:
            choices = kwarg(c, "choices")
            if isinstance(choices, (ast.List, ast.Tuple)):
                opts = tuple(e.value for e in choices.elts if isinstance(e, ast.Constant))
                index[dest] = Value(opts, DYNAMIC, f"`{shown}` is chosen on the command line from {list(opts)} "
                                                   f"(line {c.lineno})", c.lineno)
    return index


def _field_default(m, attr: str) -> Value | None:
    """`attr: bool = field(default=True)` or `attr: str = "x"` in a dataclass of this file."""
    return m.memo.get(("field_defaults",), lambda: _field_index(m)).get(attr)


def _field_index(m) -> dict[str, Value]:
    index: dict[str, Value] = {}
    for cls in m.classes.values():
        for st in cls.body:
            if not (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.value is not None):
                continue
            v = st.value
            if isinstance(v, ast.Call) and func_tail(v) == "field":
                v = kwarg(v, "default")
                if v is None:
                    continue
            ok, value = _const(v)
            if ok:
                index[st.target.id] = Value((value,), DEFAULT, f"`{cls.name}.{st.target.id}` defaults to {value!r} "
                                                               f"(line {st.lineno})", st.lineno)
    return index


def _loaded_config(m, base: ast.AST) -> ConfigFile | None:
    """The config file a variable was loaded from (`cfg = yaml.safe_load(open("train.yaml"))`,
    `OmegaConf.load("conf.yaml")`), when the file is beside the script."""
    key = tail(base)
    if not key:
        return None
    configs = configs_of(m)
    for v in m.assigns.get(key, []):
        for n in ast.walk(v):
            if isinstance(n, ast.Constant) and isinstance(n.value, str):
                cfg = configs.named(n.value)
                if cfg is not None:
                    return cfg
    return None


def _subscript_path(node: ast.AST) -> tuple[ast.AST, list[str]] | None:
    """`cfg["train"]["precision"]` / `cfg.train.precision` -> (cfg, ["train", "precision"])."""
    keys: list[str] = []
    while True:
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
            keys.append(node.slice.value)
            node = node.value
        elif isinstance(node, ast.Attribute):
            keys.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Call) and func_tail(node) == "get" and node.args and \
                isinstance(node.args[0], ast.Constant) and isinstance(node.func, ast.Attribute):
            keys.append(str(node.args[0].value))
            node = node.func.value
        else:
            break
    return (node, list(reversed(keys))) if keys and isinstance(node, (ast.Name, ast.Attribute)) else None


def resolve(m, node: ast.AST | None, depth: int = 0) -> Value:
    """What `node` may evaluate to (see Value); NOTHING when it cannot be told."""
    if node is None or depth > 6:
        return NOTHING
    ok, v = _const(node)
    if ok:
        return Value((v,), LITERAL, f"`{text(node)}` (line {node.lineno})", node.lineno)
    if isinstance(node, ast.IfExp):
        a, b = resolve(m, node.body, depth + 1), resolve(m, node.orelse, depth + 1)
        opts = tuple(dict.fromkeys(a.options + b.options))
        if a.known and b.known:
            return Value(opts, DYNAMIC, f"`{text(node)}` (line {node.lineno})", node.lineno)
        return Value(opts, UNKNOWN, f"`{text(node)}` (line {node.lineno})", node.lineno)
    if isinstance(node, ast.Call) and len(node.args) >= 2 and (
            func_tail(node) == "getenv" or (func_tail(node) == "get" and "environ" in text(node.func))):
        ok, v = _const(node.args[1])
        if ok:
            return Value((v,), DEFAULT, f"`{text(node)}` defaults to {v!r} (line {node.lineno})", node.lineno)
        return NOTHING
    if isinstance(node, ast.Name):
        values = m.assigns.get(node.id, [])
        if len(values) == 1 and values[0] is not node:
            inner = resolve(m, values[0], depth + 1)
            return inner
        if len(values) > 1:
            rs = [resolve(m, v, depth + 1) for v in values[:6]]
            if all(r.known for r in rs):
                opts = tuple(dict.fromkeys(o for r in rs for o in r.options))
                return Value(opts, DYNAMIC, "; ".join(r.evidence for r in rs[:3]), rs[0].line)
        return _param_default(m, node)
    path = _subscript_path(node)
    if path is not None:
        base, keys = path
        cfg = _loaded_config(m, base)
        if cfg is not None and cfg.has(*keys):
            val = cfg.get(*keys)
            return Value((val,), CONFIG, f"{cfg.where(*keys)}: {'.'.join(keys)}: {val!r}", None)
        if isinstance(base, ast.Name) and len(keys) == 1 and m.assigns.get(base.id):
            for v in m.assigns[base.id]:
                d = literal_dict(v, m, depth + 1)
                if d is not None and keys[0] in d and d[keys[0]] != "<expr>":
                    val = d[keys[0]]
                    return Value((val,), LITERAL, f"`{text(node)}` is {val!r} (line {v.lineno})", v.lineno)
    if isinstance(node, ast.Attribute):
        for found in (_argparse_default(m, node.attr), _field_default(m, node.attr)):
            if found is not None:
                return found
        base = tail(node.value)
        if base == "self" or isinstance(node.value, ast.Name) and node.value.id == "self":
            values = [v for v in m.assigns.get(node.attr, []) if v is not node]
            if len(values) == 1:
                return resolve(m, values[0], depth + 1)
    return NOTHING


def _param_default(m, node: ast.Name) -> Value:
    """A function parameter's literal default (`def main(mixed_precision="fp16")`)."""
    for defs in m.functions.values():
        for d in defs:
            lo, hi = d.lineno, getattr(d, "end_lineno", d.lineno)
            if not lo <= node.lineno <= hi:
                continue
            args = d.args.args + d.args.kwonlyargs
            defaults = [None] * (len(d.args.args) - len(d.args.defaults)) + list(d.args.defaults) + list(d.args.kw_defaults)
            for a, dv in zip(args, defaults):
                if a.arg == node.id and dv is not None:
                    ok, v = _const(dv)
                    if ok:
                        return Value((v,), DEFAULT, f"`{a.arg}` defaults to {v!r} (line {dv.lineno})", dv.lineno)
    return NOTHING


def resolve_kw(m, call: ast.Call | None, name: str) -> Value:
    """`resolve` of a keyword argument, with evidence that names it: `mixed_precision="fp16"` (line 12)."""
    node = kwarg(call, name) if call is not None else None
    if node is None:
        return NOTHING
    v = resolve(m, node)
    if not v.options and v.how == UNKNOWN:
        return Value((), UNKNOWN, f"`{name}={text(node)}` (line {node.lineno})", node.lineno)
    if isinstance(node, ast.Constant):
        return Value(v.options, v.how, f"`{name}={text(node)}` (line {node.lineno})", node.lineno)
    return Value(v.options, v.how, f"`{name}={text(node)}` (line {node.lineno}): {v.evidence}", v.line or node.lineno)
