"""PyTorch Lightning: `Trainer(precision=...)` and `LightningModule` hooks.

Checked in lightning 2.6.6 (lightning/pytorch/plugins/precision/amp.py and precision.py,
lightning/pytorch/core/module.py, lightning/fabric/plugins/precision/precision.py, connectors):

- `precision`: "16-mixed" makes a `MixedPrecision` plugin with a `torch.amp.GradScaler`;
  "bf16-mixed" none; "16-true"/"bf16-true" cast the weights (no float32 master copy). The 1.x
  spellings 16, "16" and "bf16" still work but warn "`precision=16` is supported for historical
  reasons but its usage is discouraged. Please set your precision to 16-mixed instead!"
  (`_convert_precision_to_unified_args`). `amp_backend` / `amp_level` are not Trainer arguments in
  2.x (apex support went in 2.0). With no precision the Trainer trains in "32-true". On a CPU,
  "16-mixed" is replaced by "bf16-mixed" with a warning.
- Automatic optimization: `MixedPrecision.optimizer_step` runs the closure (training_step,
  backward, `on_after_backward`), then `scaler.unscale_(optimizer)`, then `on_before_optimizer_step`
  and the Trainer's clipping (`configure_gradient_clipping`). Gradients are still scaled in
  `on_after_backward` (Lightning issue #4151) and unscaled in `on_before_optimizer_step`.
- Manual optimization (`self.automatic_optimization = False`): `self.manual_backward(loss)` scales
  the loss (`pre_backward` -> `scaler.scale`); the unscale happens only inside `opt.step()`. So
  `self.clip_gradients(opt, ...)` (and torch's clip) between `manual_backward` and `opt.step()`
  clips scaled gradients under "16-mixed" (issue #18089, open; fix PR #19536 not merged in 2.6.6).
  Clipping in `on_before_optimizer_step` runs after the unscale.
- The precision plugin's scaler state is part of the Trainer's checkpoint.
"""
from __future__ import annotations

import ast

from ..analysis import kwarg, text
from . import BF16, BF16_TRUE, FP8, FP16, FP16_TRUE, FP32, Setup, of, derives, imports
from .configs import configs_of
from .values import CONFIG, LITERAL, NOTHING, Value, resolve_kw

NAME = "lightning"
PACKAGES = ("lightning", "pytorch_lightning", "lightning_fabric")
PRECISION = {16: FP16, "16": FP16, "16-mixed": FP16, "bf16": BF16, "bf16-mixed": BF16, "16-true": FP16_TRUE,
             "bf16-true": BF16_TRUE, 32: FP32, "32": FP32, "32-true": FP32, 64: FP32, "64": FP32, "64-true": FP32,
             "transformer-engine": FP8, "transformer-engine-float16": FP8}
LEGACY_ALIASES = {16: "16-mixed", "16": "16-mixed", "bf16": "bf16-mixed"}  # warned about in 2.6.6
REMOVED_TRAINER_ARGS = {"amp_backend", "amp_level"}
MODULE_BASES = {"LightningModule"}
CALLBACK_BASES = {"Callback"}


def normalise(value) -> str:
    return PRECISION.get(value, str(value)) if value is not None else FP32


def _from_lightning(m, call: ast.Call) -> bool:
    q = m.names.qual(call.func) or ""
    return q.startswith(PACKAGES) or (q.split(".")[0] in {"L", "pl"} and imports(m, *PACKAGES))


def trainer_calls(m) -> list[ast.Call]:
    return [c for c in m.calls_named("Trainer") if _from_lightning(m, c)]


def precision_of(m, call: ast.Call | None, what: str = "Trainer") -> Value:
    """The precision a Trainer(...)/Fabric(...) asks for; with none, "32-true" as a default."""
    if call is None:
        return _from_cli_config(m)
    kw = kwarg(call, "precision")
    if kw is not None:
        return resolve_kw(m, call, "precision").mapped(normalise)
    if any(k.arg is None for k in call.keywords):  # Trainer(**cfg): not visible here
        return _from_cli_config(m)
    return Value((FP32,), LITERAL, f"{what}(...) without precision (line {call.lineno}): 32-true", call.lineno)


def _from_cli_config(m) -> Value:
    for cfg in configs_of(m).of_kind("lightning"):
        p = cfg.get("trainer", "precision")
        if p is not None:
            return Value((normalise(p),), CONFIG, f"{cfg.where('trainer', 'precision')}: trainer.precision: {p}")
    return NOTHING


def module_classes(m) -> set[str]:
    return m.memo.get(("lightning_modules",), lambda: derives(m, MODULE_BASES, PACKAGES))


def callback_classes(m) -> set[str]:
    return m.memo.get(("lightning_callbacks",), lambda: derives(m, CALLBACK_BASES, PACKAGES))


def manual_optimization(m, cls: str | None) -> bool:
    """`self.automatic_optimization = False` in the class (or a local base)."""
    node = m.classes.get(cls or "")
    if node is None:
        return False
    for n in m.walk(node):
        if isinstance(n, ast.Assign) and any(text(t) == "self.automatic_optimization" for t in n.targets) \
                and isinstance(n.value, ast.Constant) and n.value.value is False:
            return True
    return False


def setups(m) -> list[Setup]:
    """This framework's setups in the file (computed once, by `find`)."""
    return of(m, NAME)


def find(m) -> list[Setup]:
    calls = trainer_calls(m)
    mods = module_classes(m)
    if not calls and not mods:
        return []
    out = []
    for c in calls or [None]:
        p = precision_of(m, c)
        out.append(Setup(NAME, c, p, frozenset(), f"Trainer(...) (line {c.lineno})" if c is not None else
                         "the Lightning Trainer", {"unknown_because": "set on the Trainer in another file"}))
    return out


def owner(m, recv: str | None, scope) -> Setup | None:
    if recv != "self" or scope is None or scope.cls not in module_classes(m):
        return None
    return setups(m)[0] if setups(m) else None
