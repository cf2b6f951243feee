"""Hugging Face Accelerate: `Accelerator(mixed_precision=...)`.

Checked in accelerate 1.15.0 (accelerate/accelerator.py, optimizer.py, scheduler.py, utils/modeling.py):

- `Accelerator.__init__`: with `mixed_precision == "fp16"` on a device other than the CPU (and not
  under DeepSpeed or Megatron) it sets `native_amp` and makes `self.scaler` (`torch.amp.GradScaler`;
  `ShardedGradScaler` under FSDP1, a plain GradScaler under FSDP2). On the CPU it makes no scaler
  and no autocast: fp16 runs as float32, without a warning. With no `mixed_precision` argument the
  value comes from `accelerate launch --mixed_precision` / the accelerate config YAML
  (`mixed_precision: fp16`) through the environment. The `fp16=True` argument of the 0.x series is
  gone (not in 1.15's signature).
- `backward(loss)`: divides by `gradient_accumulation_steps`, then `self.scaler.scale(loss).backward()`
  when there is a scaler: after it the gradients are multiplied by the loss scale.
- `unscale_gradients()`: `self.scaler.unscale_(opt)` for every prepared optimizer (fp16 only);
  `clip_grad_norm_` / `clip_grad_value_` call it first, then clip. Called on every micro-batch of
  `with accelerator.accumulate(model):` (where `AcceleratedOptimizer.step` skips `scaler.step/update`
  while `sync_gradients` is False) the second call raises torch's "unscale_() has already been
  called on this optimizer since the last update()" (accelerate issue #641; diffusers PR #721 put
  the clip under `if accelerator.sync_gradients:`).
- `AcceleratedOptimizer.step`: `scaler.step(optimizer)` + `scaler.update()` and records whether the
  step was skipped (`step_was_skipped`; `Accelerator.optimizer_step_was_skipped`) by whether
  GradScaler called the optimizer's `step()`. GradScaler calls a fused optimizer's `step()` every
  time (the kernel skips the update), so with `fused=True` the flag stays False on skipped steps
  (huggingface/accelerate#4242, open; AMP145). A raw optimizer that never went through `prepare`
  steps on scaled gradients and ignores inf/NaN.
- `AcceleratedScheduler.step`: returns without stepping when an optimizer step was skipped or
  gradients are still accumulating; a scheduler that was not prepared steps anyway.
- `save_state` / `load_state` write and read the GradScaler state (scaler.pt) with the rest.
"""
from __future__ import annotations

import ast

from ..analysis import func_tail, kwarg, receiver, tail
from . import BF16, FP8, FP16, FP32, Setup, by_keys, imports, of, prepared_entries
from .configs import configs_of
from .values import CONFIG, NOTHING, Value, resolve, resolve_kw

NAME = "accelerate"
_PRECISION = {"fp16": FP16, "bf16": BF16, "no": FP32, "fp8": FP8, "FP16": FP16, "BF16": BF16, "NO": FP32}
PREPARE = {"prepare", "prepare_model", "prepare_optimizer", "prepare_scheduler"}
UNSCALES = {"clip_grad_norm_", "clip_grad_value_", "unscale_gradients"}  # these unscale first


def _is_accelerator_ctor(m, call: ast.Call) -> bool:
    if func_tail(call) != "Accelerator":
        return False
    q = m.names.qual(call.func) or ""
    return q.startswith("accelerate") or imports(m, "accelerate")


def precision_of(m, call: ast.Call | None) -> tuple[Value, str]:
    """The mixed precision an Accelerator(...) call asks for, and why it is unknown when it is."""
    if call is not None:
        kw = kwarg(call, "mixed_precision")
        if kw is not None:
            v = resolve_kw(m, call, "mixed_precision").mapped(lambda o: _PRECISION.get(o, o) if isinstance(o, str) else o)
            if v.known and None not in v.options:
                return v, ""
            if v.known:  # None: left to the launch configuration
                v = Value(tuple(o for o in v.options if o is not None), v.how, v.evidence, v.line)
                from_config = _from_config(m)
                if from_config.known:
                    return Value(tuple(dict.fromkeys(v.options + from_config.options)), from_config.how,
                                 f"{v.evidence}; {from_config.evidence}"), ""
                if v.options:
                    return Value(v.options, "dynamic", v.evidence + "; otherwise the launch configuration", v.line), ""
        legacy = kwarg(call, "fp16")
        if legacy is not None:
            r = resolve_kw(m, call, "fp16")
            if r.known:
                return r.mapped(lambda o: FP16 if o else FP32), ""
    cfg = _from_config(m)
    if cfg.known:
        return cfg, ""
    return NOTHING, ("set at launch: `accelerate launch --mixed_precision` or the accelerate config; "
                     "no accelerate config YAML beside the script says")


def _from_config(m) -> Value:
    for cfg in configs_of(m).of_kind("accelerate"):
        mp = cfg.get("mixed_precision")
        if isinstance(mp, str):
            return Value((_PRECISION.get(mp, mp),), CONFIG, f"{cfg.where('mixed_precision')}: mixed_precision: {mp}")
    return NOTHING


def setups(m) -> list[Setup]:
    """This framework's setups in the file (computed once, by `find`)."""
    return of(m, NAME)


def find(m) -> list[Setup]:
    ctors = [c for c in m.calls_named("Accelerator") if _is_accelerator_ctor(m, c)]
    if not ctors and not imports(m, "accelerate"):
        return []
    own: dict[int, set[str]] = {}  # id(ctor) -> the names it is assigned to
    ctor_ids = {id(c) for c in ctors}  # every call `_is_accelerator_ctor` accepts is among them
    for k, values in (m.assigns.items() if ctors else ()):
        for v in values:
            if id(v) in ctor_ids:
                own.setdefault(id(v), set()).add(k)
    keys = {"accelerator"}.union(*own.values()) if own else {"accelerator"}
    prepared = prepared_keys(m, keys)  # (name, line, attribute)
    save_state = any(tail(receiver(c)) in keys for c in m.calls_named("save_state") if receiver(c) is not None)
    out = []
    for c in ctors or [None]:
        precision, why = precision_of(m, c)
        accum = resolve(m, kwarg(c, "gradient_accumulation_steps")) if c is not None else NOTHING
        if c is not None and kwarg(c, "gradient_accumulation_steps") is None and kwarg(c, "gradient_accumulation_plugin") is None:
            accum = Value((1,), "literal", "no gradient_accumulation_steps (1)", c.lineno)
        mine = own.get(id(c), set()) if c is not None else set()
        if len(ctors) < 2 or not mine:
            mine = keys  # one Accelerator (or one not assigned to a name): every accelerator name is it
        out.append(Setup(NAME, c, precision, frozenset(mine),
                         f"Accelerator(...) (line {c.lineno})" if c is not None else "the Accelerator",
                         {"unknown_because": why, "accum": accum, "prepared": prepared, "save_state": save_state}))
    return out


def prepared_keys(m, keys: set[str]) -> list[tuple[str, int, bool]]:
    """(name, line, is an attribute) for what is handed to or returned by `accelerator.prepare(...)`
    (and prepare_optimizer/scheduler); `frameworks.prepared_in` says which of them a function sees."""
    return prepared_entries(m, keys, PREPARE)


def owner(m, recv: str | None, scope) -> Setup | None:
    found = by_keys(setups(m), recv, scope)
    if found is None and recv and "accelerator" in recv.lower() and setups(m):
        return by_keys(setups(m), next(iter(setups(m)[0].keys)), scope)  # `self.accelerator`, one handed in
    return found


def unscales(call: ast.Call) -> bool:
    """`accelerator.clip_grad_norm_/clip_grad_value_/unscale_gradients` unscale before clipping."""
    return func_tail(call) in UNSCALES
