"""Lightning Fabric: `Fabric(precision=...)`, `fabric.setup(model, optimizer)`, `fabric.backward(loss)`.

Checked in lightning 2.6.6 (lightning/fabric/fabric.py, connector.py, plugins/precision/amp.py,
strategies/strategy.py):

- "16-mixed" makes `MixedPrecision` with a `torch.amp.GradScaler`; `fabric.backward(loss)` is
  `scaler.scale(loss).backward()`. On a CPU it warns "You passed `Fabric(accelerator='cpu',
  precision='16-mixed')` but AMP with fp16 is not supported on CPU. Using `precision='bf16-mixed'`
  instead." and trains in bfloat16. With no precision: "32-true" (unless `fabric run --precision`).
- `fabric.setup(model, optimizer)` / `setup_optimizers` wrap the optimizer: its `step()` is
  `scaler.step(optimizer)` + `scaler.update()` (a skipped step is silent: Fabric keeps no
  "skipped" flag). An optimizer that was not set up steps on scaled gradients.
- `fabric.clip_gradients(model, optimizer, max_norm=...)` calls `precision.unscale_gradients`
  (`scaler.unscale_`) before clipping; torch's `clip_grad_norm_` after `fabric.backward` clips
  scaled gradients. Twice per optimizer step (per micro-batch) it raises torch's "unscale_() has
  already been called on this optimizer since the last update()".
- Fabric does not wrap LR schedulers: one stepped after every `optimizer.step()` also steps when
  the GradScaler skipped it.
- `fabric.save(path, state)` saves what `state` holds; the precision plugin (its GradScaler) is not
  added to it (`Strategy.save_checkpoint`), unlike the Lightning Trainer's checkpoint.
"""
from __future__ import annotations

import ast

from ..analysis import func_tail, kwarg
from . import Setup, by_keys, imports, of, prepared_entries
from .lightning import PACKAGES, precision_of

NAME = "fabric"
SETUP = {"setup", "setup_optimizers", "setup_module"}


def _is_fabric_ctor(m, call: ast.Call) -> bool:
    if func_tail(call) != "Fabric":
        return False
    q = m.names.qual(call.func) or ""
    return q.startswith(PACKAGES) or imports(m, *PACKAGES)


def setups(m) -> list[Setup]:
    """This framework's setups in the file (computed once, by `find`)."""
    return of(m, NAME)


def find(m) -> list[Setup]:
    ctors = [c for c in m.calls_named("Fabric") if _is_fabric_ctor(m, c)]
    if not ctors:
        return []
    keys = {"fabric"}
    for k, values in m.assigns.items():
        if any(isinstance(v, ast.Call) and _is_fabric_ctor(m, v) for v in values):
            keys.add(k)
    prepared = prepared_entries(m, keys, SETUP)
    return [Setup(NAME, c, precision_of(m, c, "Fabric"), frozenset(keys), f"Fabric(...) (line {c.lineno})",
                  {"prepared": prepared, "unknown_because": "chosen at launch"}) for c in ctors]


def owner(m, recv: str | None, scope) -> Setup | None:
    return by_keys(setups(m), recv, scope)


def unscales(call: ast.Call) -> bool:
    return func_tail(call) == "clip_gradients"


def precision_kw(call: ast.Call):
    return kwarg(call, "precision")
