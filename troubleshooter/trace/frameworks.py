"""Framework-managed mixed precision at run time, inside the traced child.

Most scripts do not build their own GradScaler: Accelerate, Lightning/Fabric and the Hugging Face
Trainer do, and FSDP casts parameters itself. This module watches those frameworks where they
decide (patched when, and only if, the script imports them) and records what they were asked for
and what they really did on this host:

- accelerate 1.15 `Accelerator.__init__`: `mixed_precision="fp16"` on a CPU makes no GradScaler and no
  autocast, silently (float32). Emulated here: a `torch.amp.GradScaler("cpu")` and float16 CPU
  autocast, the path accelerate takes on a GPU, so the scale, the skipped steps, the clipping order
  and the scheduler can be observed (the report says so: `emulated`).
- Lightning 2.6.6 / Fabric: "16-mixed" on a CPU is replaced by "bf16-mixed" with a warning.
  Emulated the same way: `MixedPrecision("16-mixed", "cpu")` (Lightning's own plugin with a CPU
  GradScaler). Lightning's scheduler steps (`LightningModule.lr_scheduler_step`) are marked, so a
  step on a skipped update is reported as Lightning's, not the user's.
- transformers' `Trainer` builds an Accelerator (covered above) from `TrainingArguments.fp16/bf16`.
- FSDP1 `FullyShardedDataParallel(mixed_precision=MixedPrecision(param_dtype=...))` and FSDP2
  `fully_shard(mp_policy=MixedPrecisionPolicy(param_dtype=...))`: the optimizer holds float32
  sharded parameters, so the parameter dtype alone read "float32"; the policy is recorded.

Patches are installed through an import hook (`install`); nothing is imported that the script does
not import itself. `TROUBLESHOOTER_TRACE_EMULATE=0` turns the emulation off.
"""
from __future__ import annotations

import functools
import importlib.abc
import os
import sys
from typing import Any, Callable

from .locate import _cache as _user_files
from .locate import is_user_file

LOG: dict[str, Any] = {"frameworks": [], "fsdp": [], "lightning_scheduler_steps": [], "framework_scalers": 0}
_rec = None
_emulate = True


def result() -> dict:
    """What the frameworks were asked for and did (the child's "framework" payload)."""
    return {k: (list(v) if isinstance(v, list) else v) for k, v in LOG.items()}


def _note(entry: dict) -> None:
    if len(LOG["frameworks"]) < 8:
        LOG["frameworks"].append(entry)


def _where() -> dict:
    frame = sys._getframe(2)
    while frame is not None:
        if is_user_file(frame.f_code.co_filename):
            return {"path": frame.f_code.co_filename, "line": frame.f_lineno}
        frame = frame.f_back
    return {"path": None, "line": None}


def entered_by_framework(depth: int = 2) -> bool:
    """An autocast region opened by framework code on the user's behalf (Lightning's around
    `training_step`, accelerate's around a prepared model's forward) rather than by a `with` the
    user wrote. Counts the non-user frames between `__enter__`'s caller and the first user frame:
    one is the context manager itself (`accelerator.autocast()`, torch's decorator), more is a
    framework calling the user's code from inside the region. contextlib frames do not count."""
    frame = sys._getframe(depth)
    outside = 0
    while frame is not None:
        name = frame.f_code.co_filename
        known = _user_files.get(name)  # is_user_file's cache, read here: it runs per autocast entered
        if known or (known is None and is_user_file(name)):
            return outside > 1
        if not name.endswith("contextlib.py"):
            outside += 1
        frame = frame.f_back
    return False


def _wrap_once(owner, name: str, make: Callable) -> None:
    """owner.name = make(original), once (a module imported twice under two names is patched once)."""
    original = getattr(owner, name, None) if owner is not None else None
    if original is None or getattr(original, "_trace_framework", False):
        return
    wrapped = functools.wraps(original)(make(original))
    wrapped._trace_framework = True
    setattr(owner, name, wrapped)


def _observe(after: Callable | None = None, before: Callable | None = None) -> Callable:
    """A `make` for `_wrap_once`: call `before(*args, **kwargs)`, the original, `after(result, *args,
    **kwargs)`; an observer that fails is ignored (observing must never break the script)."""
    def make(original):
        def wrapper(*args, **kwargs):
            if before is not None:
                _quietly(before, *args, **kwargs)
            out = original(*args, **kwargs)
            if after is not None:
                _quietly(after, out, *args, **kwargs)
            return out
        return wrapper
    return make


def _quietly(fn: Callable, *args, **kwargs) -> None:
    try:
        fn(*args, **kwargs)
    except Exception:  # noqa: BLE001 - a framework version we do not know: observe less, never fail
        pass


# -- accelerate ------------------------------------------------------------------------------
def _patch_accelerate(module) -> None:
    _wrap_once(getattr(module, "Accelerator", None), "__init__",
               _observe(after=lambda out, acc, *args, **kwargs: _after_accelerator(acc, kwargs)))


def _after_accelerator(acc, kwargs: dict) -> None:
    import torch

    state_mp = str(getattr(acc.state, "mixed_precision", None))
    device = getattr(getattr(acc, "device", None), "type", None)
    dist = str(getattr(acc, "distributed_type", ""))
    entry = {"framework": "accelerate", "version": _version("accelerate"), "asked": state_mp,
             "asked_from": "argument" if "mixed_precision" in kwargs else "environment/config",
             "device": device, "distributed": dist.rsplit(".", 1)[-1], "native_amp": bool(acc.native_amp),
             "scaler": type(acc.scaler).__name__ if acc.scaler is not None else None, "emulated": False, **_where()}
    if state_mp == "fp16" and device == "cpu" and acc.scaler is None and "DEEPSPEED" not in dist and "MEGATRON" not in dist:
        entry["refused"] = ("runs mixed_precision='fp16' as float32, without a warning: it makes no GradScaler and no "
                            "autocast when the device is the CPU")
        if _emulate:
            handler = getattr(acc, "scaler_handler", None)
            scaler_kwargs = handler.to_kwargs() if handler is not None else {}
            acc.scaler = torch.amp.GradScaler("cpu", **scaler_kwargs)
            acc.native_amp = True
            entry.update(emulated=True, native_amp=True, scaler="GradScaler",
                         emulation="torch.amp.GradScaler('cpu') and float16 CPU autocast around prepared models, "
                                   "the path accelerate takes with mixed_precision='fp16' on a GPU")
    if acc.scaler is not None:
        LOG["framework_scalers"] += 1
    _note(entry)


def _count(key: str) -> Callable:
    def before(*args, **kwargs):
        LOG[key] = LOG.get(key, 0) + 1
    return before


def _patch_accelerate_scheduler(module) -> None:
    """AcceleratedScheduler.step steps the wrapped scheduler only when no optimizer step was skipped."""
    _wrap_once(getattr(module, "AcceleratedScheduler", None), "step", _observe(before=_count("framework_schedulers")))


# -- Lightning / Fabric ----------------------------------------------------------------------------
def _patch_lightning_connector(module, cls_name: str, flag: str, kind: str, plugins: str) -> None:
    def make(original):
        def _check_and_init_precision(self):
            asked = getattr(self, flag, None)
            accel = getattr(self, "_accelerator_flag", None)
            plugin = None
            if _emulate and asked == "16-mixed" and accel == "cpu" and _plain_strategy(self):
                try:
                    if kind == "lightning" and hasattr(self, "_validate_precision_choice"):
                        self._validate_precision_choice()
                    plugin = importlib.import_module(plugins).MixedPrecision("16-mixed", "cpu")
                except Exception:  # noqa: BLE001 - fall back to what Lightning does itself
                    plugin = None
            emulated = plugin is not None
            if plugin is None:
                plugin = original(self)
            _quietly(_after_precision_plugin, plugin, kind, asked, accel, emulated)
            return plugin
        return _check_and_init_precision
    _wrap_once(getattr(module, cls_name, None), "_check_and_init_precision", make)


def _after_precision_plugin(plugin, kind: str, asked, accel, emulated: bool) -> None:
    entry = {"framework": kind, "version": _version("lightning") or _version("pytorch_lightning"), "asked": asked,
             "accelerator": accel, "ran": getattr(plugin, "precision", type(plugin).__name__),
             "plugin": type(plugin).__name__,
             "scaler": type(plugin.scaler).__name__ if getattr(plugin, "scaler", None) is not None else None,
             "emulated": emulated, **_where()}
    if asked == "16-mixed" and accel == "cpu":
        entry["refused"] = ("replaces '16-mixed' by 'bf16-mixed', with a warning (\"AMP with fp16 is not "
                            "supported on CPU. Using `precision='bf16-mixed'` instead.\"): no GradScaler runs")
        if emulated:
            entry["emulation"] = ("Lightning's MixedPrecision('16-mixed', 'cpu') plugin: float16 CPU autocast and "
                                  "a torch.amp.GradScaler('cpu'), the plugin it uses with '16-mixed' on a GPU")
    if getattr(plugin, "scaler", None) is not None:
        LOG["framework_scalers"] += 1
    _note(entry)


def _plain_strategy(connector) -> bool:
    """Single-process strategies only: DeepSpeed, FSDP and XLA choose their own precision plugins."""
    strategy = getattr(connector, "strategy", None) or getattr(connector, "_strategy_flag", None)
    name = type(strategy).__name__ if strategy is not None and not isinstance(strategy, str) else str(strategy or "")
    return not any(w in name for w in ("DeepSpeed", "FSDP", "XLA", "ModelParallel"))


def _lightning_scheduler_step(*args, **kwargs) -> None:
    if _rec is not None and len(LOG["lightning_scheduler_steps"]) < 500:
        LOG["lightning_scheduler_steps"].append(_rec.steps - 1)  # the step Lightning's loop just finished


def _patch_lightning_module(module) -> None:
    _wrap_once(getattr(module, "LightningModule", None), "lr_scheduler_step", _observe(before=_lightning_scheduler_step))


# -- Hugging Face Trainer ----------------------------------------------------------------------
def _after_hf_trainer(out, trainer, *args, **kwargs) -> None:
    targs = getattr(trainer, "args", None)
    _note({"framework": "hf_trainer", "version": _version("transformers"),
           "asked": "fp16" if getattr(targs, "fp16", False) else "bf16" if getattr(targs, "bf16", False) else "no",
           "max_grad_norm": getattr(targs, "max_grad_norm", None), **_where()})


def _patch_hf_training_args(module) -> None:
    """transformers 5.24 refuses `bf16=True` without a GPU ("Your setup doesn't support bf16/gpu. You need to
    assign use_cpu if you want to train the model on CPU."): emulated by letting the check pass on a host
    with no CUDA at all; accelerate then trains in bfloat16 CPU autocast, as the GPU run would in bf16."""
    def make(original):
        def is_torch_bf16_gpu_available(*args, **kwargs):
            real = original(*args, **kwargs)
            if real or not _emulate:
                return real
            import torch
            if torch.cuda.is_available():
                return real  # a GPU without bf16: the user's error is real
            if not any(e.get("framework") == "hf_trainer" and e.get("emulated") for e in LOG["frameworks"]):
                _note({"framework": "hf_trainer", "version": _version("transformers"), "asked": "bf16",
                       "refused": "refuses bf16=True without a GPU (\"Your setup doesn't support bf16/gpu. You need to "
                                  "assign use_cpu if you want to train the model on CPU.\")",
                       "emulated": True, "emulation": "the check let through; accelerate trains in bfloat16 CPU "
                                                      "autocast, as the GPU run does in bfloat16", **_where()})
            return True
        return is_torch_bf16_gpu_available
    _wrap_once(module, "is_torch_bf16_gpu_available", make)


def _patch_hf_trainer(module) -> None:
    _wrap_once(getattr(module, "Trainer", None), "__init__", _observe(after=_after_hf_trainer))


# -- FSDP ------------------------------------------------------------------------------------
def _dtype_name(value) -> str | None:
    return str(value).replace("torch.", "") if value is not None else None


def _record_fsdp(version: int, policy) -> None:
    if not any(f["version"] == version for f in LOG["fsdp"]):
        LOG["fsdp"].append({"version": version, "param_dtype": _dtype_name(getattr(policy, "param_dtype", None)),
                            "reduce_dtype": _dtype_name(getattr(policy, "reduce_dtype", None)), **_where()})


def _patch_fsdp1(module) -> None:
    _wrap_once(getattr(module, "FullyShardedDataParallel", None), "__init__",
               _observe(after=lambda out, *args, **kwargs: _record_fsdp(1, kwargs.get("mixed_precision"))))


def _patch_fsdp2(module) -> None:
    _wrap_once(module, "fully_shard", _observe(after=lambda out, *args, **kwargs: _record_fsdp(2, kwargs.get("mp_policy"))))


def _patch_sharded_scaler(module) -> None:
    """ShardedGradScaler re-implements scale/unscale_/update without calling GradScaler's (which the
    trace wraps): wrap its own, or a clean FSDP loop read as an unscaled backward and a step without update."""
    cls = getattr(module, "ShardedGradScaler", None)
    if cls is None or _rec is None or getattr(cls.__init__, "_trace_framework", False):
        return
    from .patches import _patch_scaler
    _patch_scaler(_rec, cls, only=tuple(n for n in ("scale", "unscale_", "update") if n in vars(cls)))
    _wrap_once(cls, "__init__", _observe(after=lambda *args, **kwargs: _count("sharded_scalers")()))


# -- the import hook -------------------------------------------------------------------------
PATCHERS: dict[str, Callable] = {
    "accelerate.accelerator": _patch_accelerate,
    "accelerate.scheduler": _patch_accelerate_scheduler,
    "lightning.pytorch.trainer.connectors.accelerator_connector":
        lambda m: _patch_lightning_connector(m, "_AcceleratorConnector", "_precision_flag", "lightning",
                                             "lightning.pytorch.plugins.precision"),
    "pytorch_lightning.trainer.connectors.accelerator_connector":
        lambda m: _patch_lightning_connector(m, "_AcceleratorConnector", "_precision_flag", "lightning",
                                             "pytorch_lightning.plugins.precision"),
    "lightning.fabric.connector": lambda m: _patch_lightning_connector(m, "_Connector", "_precision_input", "fabric",
                                                                       "lightning.fabric.plugins.precision.amp"),
    "lightning_fabric.connector": lambda m: _patch_lightning_connector(m, "_Connector", "_precision_input", "fabric",
                                                                       "lightning_fabric.plugins.precision.amp"),
    "lightning.pytorch.core.module": _patch_lightning_module,
    "pytorch_lightning.core.module": _patch_lightning_module,
    "transformers.trainer": _patch_hf_trainer,
    "transformers.training_args": _patch_hf_training_args,
    "torch.distributed.fsdp.fully_sharded_data_parallel": _patch_fsdp1,
    "torch.distributed.fsdp._fully_shard._fully_shard": _patch_fsdp2,
    "torch.distributed.fsdp.sharded_grad_scaler": _patch_sharded_scaler,
}


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Runs a patcher right after one of PATCHERS' modules executes (the script's own import)."""

    def find_spec(self, name, path, target=None):
        patcher = PATCHERS.get(name)
        if patcher is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original = loader.exec_module

        def exec_module(module):
            original(module)
            try:
                patcher(module)
            except Exception:  # noqa: BLE001 - a framework version we do not know: observe less, never fail
                pass

        loader.exec_module = exec_module
        return spec


def install(rec, emulate: bool | None = None) -> None:
    """Watch the frameworks the script will import (and those already imported)."""
    global _rec, _emulate
    _rec = rec
    _emulate = os.environ.get("TROUBLESHOOTER_TRACE_EMULATE", "1") != "0" if emulate is None else emulate
    for name, patcher in PATCHERS.items():
        if name in sys.modules:
            try:
                patcher(sys.modules[name])
            except Exception:  # noqa: BLE001
                pass
    if not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())


def also_after_import(name: str, patcher: Callable) -> None:
    """One more patcher for a module, run after this layer's own (if any) when the script imports it,
    or now if it already has: `trace --nproc`'s rank observers (trace/rank.py) use this import hook
    rather than a second one (two finders that delegate to each other recurse forever)."""
    first = PATCHERS.get(name)
    if first is None:
        PATCHERS[name] = patcher
    else:
        def both(module, first=first):
            _quietly(first, module)
            patcher(module)
        PATCHERS[name] = both
    if name in sys.modules:
        _quietly(patcher, sys.modules[name])
    if not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())


def _version(dist: str) -> str | None:
    try:
        from importlib.metadata import version
        return version(dist)
    except Exception:  # noqa: BLE001
        return None
