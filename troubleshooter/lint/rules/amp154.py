"""AMP154 dcp-checkpoint-drops-scaler."""
import ast

from ..analysis import func_tail, names_in, text
from ._distributed import qual
from .amp110 import checkpoint_contents
from .base import Hit, Rule

_DCP_SAVES = {"save", "async_save", "save_state_dict"}


class DcpCheckpointDropsScaler(Rule):
    id = "AMP154"
    name = "dcp-checkpoint-drops-scaler"
    severity = "warning"
    summary = ("A distributed checkpoint (`torch.distributed.checkpoint.save`) of a `Stateful` application state that "
               "holds the model and optimizer but not the GradScaler (or ShardedGradScaler), while one is in use.")
    why = ("DCP calls each Stateful object's `state_dict()` on every rank; the recipe's `AppState` returns the model "
           "and optimizer only. The loss scale is training state: a run resumed from it restarts at 65536 and skips "
           "steps again, or overflows from a scale that had settled lower. The scaler's state is the same on every "
           "rank (ShardedGradScaler agrees on found_inf), so it can go in as a plain entry.")
    example_bad = """
class AppState(Stateful):
    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer

    def state_dict(self):
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd}

scaler = ShardedGradScaler()
dcp.save({"app": AppState(model, optimizer)}, checkpoint_id=ckpt_dir)
"""
    example_good = """
class AppState(Stateful):
    def __init__(self, model, optimizer, scaler):
        self.model, self.optimizer, self.scaler = model, optimizer, scaler

    def state_dict(self):
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd, "scaler": self.scaler.state_dict()}

scaler = ShardedGradScaler()
dcp.save({"app": AppState(model, optimizer, scaler)}, checkpoint_id=ckpt_dir)
"""
    fix = ("Put the scaler in the state: `\"scaler\": scaler.state_dict()` in `AppState.state_dict()` (and "
           "`scaler.load_state_dict(...)` in its `load_state_dict`), or as its own entry of the saved dict.")
    known_problems = ("Only Stateful classes defined in this file are read. A checkpoint whose optimizer state is "
                      "written directly in the saved dict is AMP110's case (it reads `dcp.save` too).")
    references = ("https://pytorch.org/tutorials/recipes/distributed_checkpoint_recipe.html",
                  "https://pytorch.org/docs/stable/distributed.checkpoint.html")

    def check(self, m):
        if not ([k for k in m.scaler_ctor if m.scaler_enabled(k)] or m.scaler_method_keys):
            return
        for c in m.calls:
            if func_tail(c) not in _DCP_SAVES or "distributed.checkpoint" not in qual(m, c):
                continue
            saved = c.args[0] if c.args else next((k.value for k in c.keywords if k.arg == "state_dict"), None)
            contents = checkpoint_contents(m, m.scope_of(c), saved) if saved is not None else None
            if contents is None:
                continue
            keys, values = contents
            if any("scal" in k.lower() for k in keys) or any("scal" in n.lower() for v in values for n in names_in(v)):
                continue
            stateful = [v for v in values if isinstance(v, ast.Call) and func_tail(v) in m.classes]
            for v in stateful:
                cls = m.classes[func_tail(v)]
                if _holds_optimizer(cls) and not _holds_scaler(cls):
                    yield Hit.at(c, f"the distributed checkpoint saves `{func_tail(v)}`, whose state_dict() holds the "
                                    "optimizer but no GradScaler state: a resumed run restarts the loss scale",
                                 f"add `\"scaler\": scaler.state_dict()` to `{func_tail(v)}.state_dict()` (and load it "
                                 "back in its load_state_dict)")
                    break


def _methods(cls: ast.ClassDef, name: str) -> list[ast.AST]:
    return [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name]


def _holds_optimizer(cls: ast.ClassDef) -> bool:
    for f in _methods(cls, "state_dict"):
        for n in ast.walk(f):
            if isinstance(n, ast.Call) and func_tail(n) in {"get_state_dict", "get_optimizer_state_dict"}:
                return True
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and "optim" in n.value.lower():
                return True
            if isinstance(n, ast.Attribute) and "optim" in n.attr.lower():
                return True
    return False


def _holds_scaler(cls: ast.ClassDef) -> bool:
    return any("scal" in (text(n) or "").lower() for f in _methods(cls, "state_dict") for n in ast.walk(f)
               if isinstance(n, (ast.Name, ast.Attribute, ast.Constant)))
