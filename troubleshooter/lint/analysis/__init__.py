"""Parse a script once and derive what every rule needs: names, roles and ordered step events.

Rules never walk the AST for training-loop structure themselves. They read a `FileModel`:
- `names` (names.py): import aliases resolved to qualified names (`ac` -> `torch.amp.autocast`);
- roles by construction (roles.py): which variables are GradScalers (and which are some other
  framework's loss scaler), optimizers, schedulers, autocast context objects, half models;
- autocast regions, dtypes and devices (autocast.py), resolved through every assignment in the file;
- per scope (module level, each function or method), the ORDERED events of a training step
  (events.py, walker.py): backward (scaled or not), unscale_, clip, .grad reads, optimizer/scaler
  steps, scaler.update, scheduler.step, saves, each tagged with the autocast regions, no_grad
  contexts, loops, `if` branches and accumulation guards it sits in; a call to a helper of the same
  file stands for what the helper (and the helpers it calls) does;
- one `memo` (model.py) for everything derived lazily.
Variables are keyed by their last name component (`self.scaler` and `scaler` are both `scaler`) so
roles follow an object across the methods of a class. Word lists live in data/*.json (vocab.py).
"""
from __future__ import annotations

from .astutil import (chain_base, dict_like, func_tail, grad_of, is_false, is_grad_read, is_true, kw_is_false,
                      kwarg, names_in, peel, receiver, tail, text, walk)
from .autocast import Autocast
from .events import (BACKWARD, CALL, CLIP, FW_CLIP, GET_SCALE, GRAD, HELPER_BACKWARD, HELPER_OPT_STEP, OPT_STEP, SAVE, SCALE, SCALER_STEP,
                     SCHED_STEP, UNSCALE, UPDATE, ZERO_GRAD, Event, EventKind, Guard, Loop, Scope, compatible,
                     cond_key)
from .model import FileModel, Memo
from .names import Names
from .vocab import (BF16_DTYPES, CLIP_NAMES, DEPRECATED, EVAL_FUNC_RE, FP16_DTYPES, FP32_DTYPES, MANAGED_RE,
                    OPT_NAME_RE, OPTIMIZER_CLASSES, SCHED_NAME_RE, ZEROING)
from .walker import Walker, accum_count

__all__ = [
    "Autocast", "BACKWARD", "BF16_DTYPES", "CALL", "CLIP", "CLIP_NAMES", "DEPRECATED", "EVAL_FUNC_RE", "Event",
    "EventKind", "FP16_DTYPES", "FP32_DTYPES", "FW_CLIP", "FileModel", "GET_SCALE", "GRAD", "Guard", "HELPER_BACKWARD", "HELPER_OPT_STEP", "Loop",
    "MANAGED_RE", "Memo", "Names", "OPT_NAME_RE", "OPTIMIZER_CLASSES", "OPT_STEP", "SAVE", "SCALE", "SCALER_STEP",
    "SCHED_NAME_RE", "SCHED_STEP", "Scope", "UNSCALE", "UPDATE", "Walker", "ZEROING", "ZERO_GRAD", "accum_count",
    "chain_base", "compatible", "cond_key", "dict_like", "func_tail", "grad_of", "is_false", "is_grad_read",
    "is_true", "kw_is_false", "kwarg", "names_in", "peel", "receiver", "tail", "text", "walk",
]
