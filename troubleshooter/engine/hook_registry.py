"""Module hooks this package puts on a user's model, kept out of everything the user's code can
do with the model: `torch.save(model)`, `pickle`, `copy.deepcopy`.

Why: a forward hook is stored in the module's own `_forward_hooks` dict, so it travels with the
module. The NaN hunt's and the tracer's hooks are bound methods of objects holding weak
references, locks and local functions: `torch.save(model)` failed with "Can't pickle local
object" (and the trace blamed the user's line), and `copy.deepcopy(model)` (an EMA copy) carried
the hooks into the copy. Each such hook is registered here; `nn.Module.__getstate__`, which both
pickle and deepcopy call, returns the module's state without them (the live module keeps them,
and the state is a copy, so nothing the user holds changes). Installed on first use; with no
hook of ours registered it returns exactly what torch's own does.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any

from torch import nn

_ours: set[int] = set()  # RemovableHandle ids of the hooks this package registered
_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
               "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks_with_kwargs")
_torch_getstate = None


def ours(handle: Any) -> Any:
    """Mark a hook handle (from `module.register_forward_hook` and the like) as this package's."""
    _ours.add(handle.id)
    _install()
    return handle


def remove(handle: Any) -> None:
    """Remove one of our hooks from its module and forget it."""
    handle.remove()
    _ours.discard(handle.id)


def _getstate(self: nn.Module) -> dict:
    state = _torch_getstate(self)
    if _ours:
        for key in _HOOK_DICTS:
            hooks = state.get(key)
            if hooks and any(k in _ours for k in hooks):
                state[key] = OrderedDict((k, v) for k, v in hooks.items() if k not in _ours)
    return state


def _install() -> None:
    global _torch_getstate
    if _torch_getstate is None:
        _torch_getstate = nn.Module.__getstate__
        nn.Module.__getstate__ = _getstate
