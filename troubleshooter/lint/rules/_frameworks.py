"""Shared queries of the framework rules (AMP130-AMP141): which setup a scope's step belongs to,
the events after a framework's backward, and severity from how sure the precision is."""
from __future__ import annotations

import ast

from ..analysis import BACKWARD, CLIP, FW_CLIP, Event, Scope, compatible, kwarg
from .. import frameworks
from ..frameworks import Setup
from ..frameworks.values import resolve

NAMES = {"accelerate": "Accelerate", "lightning": "Lightning", "fabric": "Fabric", "hf_trainer": "the Hugging Face Trainer",
         "deepspeed": "DeepSpeed", "fsdp1": "FSDP1", "fsdp2": "FSDP2"}


def framework_name(setup: Setup) -> str:
    return NAMES.get(setup.framework, setup.framework)


def severity(setup: Setup, certain: str = "error", possible: str = "warning") -> str | None:
    """`certain` when the file asks for float16 literally, `possible` when it may (a default, a
    config file, or nothing said), None when the precision is known not to be float16."""
    return {"certain": certain, "possible": possible}.get(setup.fp16)


def precision_note(setup: Setup) -> str:
    """'(float16: `mixed_precision="fp16"` (line 12))' or '(if launched with float16: ...)'."""
    if setup.fp16 == "certain":
        return f"float16 is asked for: {setup.precision.evidence}"
    if setup.precision.known and setup.precision.may(frameworks.FP16):
        return f"float16 is one of the settings: {setup.precision.evidence}"
    if setup.precision.known:
        return f"whenever float16 is chosen ({setup.precision.evidence}, which the command line may change)"
    return f"whenever it runs in float16 ({setup.data.get('unknown_because') or 'its precision is not set in this file'})"


def framework_backwards(m, scope: Scope) -> list[tuple[Event, Setup]]:
    """Backward calls of this scope that a framework owns (`accelerator.backward(loss)`, ...)."""
    out = []
    for e in scope.of(BACKWARD):
        if e.via_call:
            continue
        s = frameworks.owner(m, e.recv, scope)
        if s is not None:
            out.append((e, s))
    return out


def after(scope: Scope, e: Event) -> list[Event]:
    """Events of the scope after `e` that can run on the same path."""
    return [x for x in scope.events if x.order > e.order and compatible(e, x)]


def setup_near(setups: list[Setup], scope: Scope) -> Setup | None:
    """The setup made in this scope, else the only one (None when several elsewhere)."""
    lo, hi = scope.node.lineno if hasattr(scope.node, "lineno") else 0, getattr(scope.node, "end_lineno", 10 ** 9)
    inside = [s for s in setups if s.node is not None and lo <= s.node.lineno <= hi]
    if inside:
        return inside[0]
    return setups[0] if len(setups) == 1 or len({s.precision for s in setups}) == 1 else None


def framework_keys(m) -> set[str]:
    """Every name a framework object of this file goes by (`accelerator`, `fabric`, `single`)."""
    return set().union(*(s.keys for s in frameworks.setups(m))) if frameworks.setups(m) else set()


def is_framework_call(m, e: Event) -> bool:
    """A framework's own clip/unscale: recognised by name (FW_CLIP) or, for a framework object with
    another name (`acc = Accelerator()`; `acc.clip_grad_norm_`), by the object."""
    return e.kind == FW_CLIP or (e.kind == CLIP and e.recv is not None and e.recv in framework_keys(m))


def fused_optimizers(m) -> list[ast.Call]:
    """Optimizer constructors with `fused=True` (a literal, or a variable whose value or default is
    True): torch's fused Adam/AdamW/SGD unscale inside their own `step()` (`_step_supports_amp_scaling`),
    so GradScaler calls that step even on a skipped one."""
    def compute():
        found = [c for cs in m.optimizer_ctor.values() for c in cs if _fused(m, c)]
        return found + [c for c in m.calls_named("AdamW", "Adam", "SGD") if _fused(m, c) and c not in found]
    return m.memo.get(("fused_optimizers",), compute)


def _fused(m, call: ast.Call) -> bool:
    kw = kwarg(call, "fused")
    if kw is None:
        return False
    v = resolve(m, kw)
    return v.known and True in v.options
