"""AMP110 checkpoint-missing-scaler-state."""
import ast

from ..analysis import MANAGED_RE, walk, SAVE, Scope, chain_base, tail, text
from ..lazy_re import lazy
from .base import Hit, Rule


def _is_none(node) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def checkpoint_contents(m, scope: Scope, obj: ast.AST | None, depth: int = 0,
                        before: int | None = None) -> tuple[list[str], list[ast.AST]] | None:
    """String keys and value expressions of the dict being saved; None when it cannot be resolved.

    Follows a name through its dict assignments in the scope (skipping `ckpt = torch.load(...)`,
    `ckpt = None` and other values that are not dicts: other uses of the same name), `ckpt[k] = v`, `ckpt.update(...)`,
    `dict(...)`, and `asdict(State(...))` / `State(...)` for a class of this file. A key that holds
    `None` carries no state and is left out. With `before` (the save's line), a name is followed only
    through what is written to it above that line: a dict built further down is another checkpoint."""
    if depth > 4:
        return None
    if isinstance(obj, ast.Dict):
        pairs = [(k, v) for k, v in zip(obj.keys, obj.values) if not _is_none(v)]
        return [k.value for k, _ in pairs if isinstance(k, ast.Constant) and isinstance(k.value, str)], \
            [v for _, v in pairs] + [k for k, _ in pairs if k is not None and not isinstance(k, ast.Constant)]
    if isinstance(obj, ast.Call) and tail(obj.func) in {"asdict", "vars"} and obj.args:
        return checkpoint_contents(m, scope, obj.args[0], depth + 1)
    if isinstance(obj, ast.Call) and _local_call(obj) and tail(obj.func) in m.functions:
        return _returned_contents(m, tail(obj.func), depth)
    if isinstance(obj, ast.Call) and (tail(obj.func) == "dict" or tail(obj.func) in m.classes):
        kws = [k for k in obj.keywords if not _is_none(k.value)]
        return [k.arg for k in kws if k.arg], [k.value for k in kws] + list(obj.args)
    if isinstance(obj, ast.Name):
        keys, values, found = [], [], False
        for kind, n in _name_index(m, scope).get(obj.id, []):
            if before is not None and n.lineno > before:
                continue
            if kind == "assign":
                sub = checkpoint_contents(m, scope, n.value, depth + 1)
                if sub is None:
                    continue  # `ckpt = torch_load(...)`, `ckpt = None`: other uses of the same name
                found = True
                keys += sub[0]
                values += sub[1]
            elif kind == "item":
                t = n.targets[0] if len(n.targets) == 1 else None
                if t is not None and isinstance(t.slice, ast.Constant) and isinstance(t.slice.value, str):
                    keys.append(t.slice.value)
                values.append(n.value)
            else:  # ckpt.update(...)
                for a in n.args:
                    sub = checkpoint_contents(m, scope, a, depth + 1)
                    if sub:
                        keys += sub[0]
                        values += sub[1]
                keys += [k.arg for k in n.keywords if k.arg]
                values += [k.value for k in n.keywords]
        return (keys, values) if found else None
    return None


def _local_call(call: ast.Call) -> bool:
    """`f(...)` or `self.f(...)`: a call that can reach a function of this file."""
    return isinstance(call.func, ast.Name) or (
        isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name) and call.func.value.id == "self")


def _returned_contents(m, name: str, depth: int):
    """What `def name(...)` returns when it builds a dict: `torch.save(self.state_dict(), path)` in a
    trainer class whose `state_dict()` returns {"model": ..., "optimizer": ...}."""
    keys, values, found = [], [], False
    for s in m.by_name.get(name, []):
        for n in m.subtree(s.node):
            if isinstance(n, ast.Return) and n.value is not None:
                sub = checkpoint_contents(m, s, n.value, depth + 1)
                if sub is not None:
                    found = True
                    keys += sub[0]
                    values += sub[1]
    return (keys, values) if found else None


def _name_index(m, scope: Scope) -> dict[str, list[tuple[str, ast.AST]]]:
    """name -> its dict-building statements in the scope (`x = ...`, `x[k] = v`, `x.update(...)`), once per scope."""
    def build():
        index: dict[str, list[tuple[str, ast.AST]]] = {}
        for n in m.subtree(scope.node):
            if isinstance(n, ast.Assign):
                for t in n.targets:
                    if isinstance(t, ast.Name):
                        index.setdefault(t.id, []).append(("assign", n))
                    elif isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and not _is_none(n.value):
                        index.setdefault(t.value.id, []).append(("item", n))
            elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "update" \
                    and isinstance(n.func.value, ast.Name):
                index.setdefault(n.func.value.id, []).append(("update", n))
        return index
    return m.memo.get(("amp110_names", id(scope.node)), build)


def state_owners(values) -> set[str]:
    """Keys of objects whose state_dict() goes into the checkpoint."""
    out = set()
    for v in values:
        for n in walk(v):
            if isinstance(n, ast.Call) and tail(n.func) == "state_dict" and isinstance(n.func, ast.Attribute):
                k = chain_base(n.func.value)
                if k:
                    out.add(k)
    return out


class CheckpointMissingScalerState(Rule):
    id = "AMP110"
    name = "checkpoint-missing-scaler-state"
    severity = "warning"
    summary = "A training checkpoint (model + optimizer state) saved without `scaler.state_dict()` while a GradScaler is in use."
    why = ("GradScaler's scale and growth tracker are training state. A resumed run without them restarts at "
           "scale 65536 and skips several steps (or, with a low calibrated scale, overflows), so resuming does not "
           "reproduce the uninterrupted run.")
    example_bad = """
torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, "ckpt.pt")
"""
    example_good = """
torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "scaler": scaler.state_dict()}, "ckpt.pt")
"""
    fix = 'Add `"scaler": scaler.state_dict()` to the checkpoint and `scaler.load_state_dict(ckpt["scaler"])` on resume.'

    known_problems = ("A checkpoint helper imported from another file is judged by its arguments: handed the "
                      "optimizer and no scaler, it is reported at the call; one that reaches the scaler some other "
                      "way (a global, an attribute of an argument) is then a false warning. Frameworks whose own "
                      "checkpointing saves the scaler (Accelerate's `save_state`, Lightning) are not reported. A "
                      "key that holds `None` carries no state.")
    references = ('https://pytorch.org/docs/stable/notes/amp_examples.html (Saving/resuming)',)

    def check(self, m):
        scalers = [k for k in m.scaler_ctor if m.scaler_enabled(k)] or sorted(m.scaler_method_keys)
        if not scalers:
            return
        saves = []
        for s in m.event_scopes:
            for e in s.of(SAVE):
                contents = checkpoint_contents(m, s, e.arg)
                if contents is None and isinstance(e.arg, ast.Call) and tail(e.arg.func) == "state_dict":
                    contents = ([], [e.arg])  # torch.save(optimizer.state_dict(), "opt.pt")
                if contents is not None:
                    saves.append((e, contents))
        if any(any(m.is_scaler(o) for o in state_owners(values)) for _, (_, values) in saves):
            return  # the scaler state is saved somewhere (maybe in its own file)
        reported = set()
        for e, contents in saves:
            keys, values = contents
            same = (id(m.scope_of(e.node)), text(e.arg))
            if same in reported:
                continue  # `torch.save(ckpt, last)` and `torch.save(ckpt, best)`: one checkpoint, one finding
            owners = state_owners(values)
            has_opt = any(m.is_optimizer(o) for o in owners) or any("optim" in k.lower() for k in keys)
            has_scaler = any(m.is_scaler(o) or "scaler" in o.lower() for o in owners) or \
                any("scaler" in k.lower() or "amp" in k.lower() for k in keys) or \
                any(any("scaler" in n.lower() for n in _names(v)) for v in values)
            if has_opt and not has_scaler:
                reported.add(same)
                yield Hit.at(e.node, "checkpoint saves optimizer state but not the GradScaler state",
                             f'add `"scaler": {scalers[0]}.state_dict()` to the checkpoint')
        yield from _checkpointers_without_scaler(m, scalers[0])
        yield from _outside_helpers_without_scaler(m, scalers[0])


_CHECKPOINTER = lazy(r"Checkpointer$|CheckpointSaver$|CheckpointManager$")


def _checkpointers_without_scaler(m, scaler: str):
    """A framework checkpointer handed the optimizer (`DetectionCheckpointer(model, dir, optimizer=opt)`)
    saves what it is given: without the scaler among its objects, the scaler state is lost."""
    for n in m.calls:
        if not _CHECKPOINTER.search(tail(n.func) or ""):
            continue
        given = {k.arg or "" for k in n.keywords}
        if "optimizer" in given and not any("scal" in g.lower() or "amp" in g.lower() for g in given):
            yield Hit.at(n, "checkpointer is given the optimizer but not the GradScaler: its checkpoints "
                            "resume without the loss scale",
                         f"pass the scaler too (e.g. `scaler={scaler}`), or save `{scaler}.state_dict()` beside it")


def _names(node):
    for n in walk(node):
        if isinstance(n, ast.Name):
            yield n.id
        elif isinstance(n, ast.Attribute):
            yield n.attr


def _either_branch(arg: ast.AST) -> list[ast.AST]:
    """`scaler if use_amp else None` hands the scaler on the AMP path: look at both branches."""
    if isinstance(arg, ast.IfExp):
        return _either_branch(arg.body) + _either_branch(arg.orelse)
    return [arg]


def _outside_helpers_without_scaler(m, scaler: str):
    """`save_checkpoint(model, optimizer, epoch)` with the helper imported from another file: it is
    handed the optimizer but not the scaler, so whatever it writes cannot hold the scaler state.
    Helpers defined in this file are judged by their own `torch.save` instead."""
    for n in m.calls:
        name = tail(n.func) or ""
        if "save" not in name.lower() or name in m.functions or name == "save" or name.startswith("save_image"):
            continue
        r = n.func.value if isinstance(n.func, ast.Attribute) else None
        if r is not None and (MANAGED_RE.search(tail(r) or "") or tail(r) in {"torch", "np", "numpy", "plt", "self"}):
            continue
        args = [_either_branch(a) for a in list(n.args) + [k.value for k in n.keywords]]
        keys = [tail(a) for alts in args for a in alts if isinstance(a, (ast.Name, ast.Attribute))]
        if not any(m.is_optimizer(k) for k in keys if k):
            continue
        if any(k and (m.is_scaler(k) or "scal" in k.lower() or "amp" in k.lower()) for k in keys) or \
                any(k.arg and ("scal" in k.arg.lower() or "amp" in k.arg.lower()) for k in n.keywords):
            continue
        yield Hit.at(n, f"`{name}(...)` is handed the optimizer but not the GradScaler: the checkpoint it writes "
                        "cannot hold the loss scale", f"pass `{scaler}` too and save `{scaler}.state_dict()` in it")
