"""A user's Python model file: `build_model()`, `make_batch(batch_size)`, optional `loss_fn`.

This imports (executes) the file, so it is only reached with execution allowed and, through
`run_with_workload`, only inside a child process. Optional module-level names: `BATCH_SIZE`
(default 16), `SEQ_LEN` (tokens per sample, for language models), `LOSS_WEIGHT`,
`make_optimizer(params)` (default AdamW, lr 1e-3).
"""
from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

import torch
from torch import nn

from ..errors import SpecError
from ..workload import Workload
from . import batches, estimate
from .optim import OptimizerConfig

DEFAULT_BATCH_SIZE = 16


def _import(path: str):
    if not os.path.isfile(path):
        raise SpecError(f"Python model file not found: {path}")
    name = "_troubleshooter_user_model"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SpecError(f"{path} is not a Python file that can be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    folder = os.path.dirname(path)
    if folder not in sys.path:
        sys.path.insert(0, folder)  # so the file can import its neighbours
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise SpecError(f"{path}: syntax error at line {exc.lineno}: {exc.msg}") from None
    except Exception as exc:  # noqa: BLE001 - the user's code failed while being imported
        raise SpecError(f"{path}: importing the file failed: {type(exc).__name__}: {exc}") from None
    return module


def _to_device(obj: Any, device) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, tuple):
        return tuple(_to_device(o, device) for o in obj)
    if isinstance(obj, list):
        return [_to_device(o, device) for o in obj]
    if isinstance(obj, dict):
        return {k: _to_device(v, device) for k, v in obj.items()}
    return obj


def _to_meta(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return torch.empty_like(obj, device="meta")
    if isinstance(obj, (tuple, list)):
        return type(obj)(_to_meta(o) for o in obj)
    return obj


class _UserBatches:
    """Adapts `make_batch(batch_size)` to the Workload's (batch_size, device, generator): the user's
    function draws from torch's global RNG, seeded from the generator so batches are reproducible."""

    def __init__(self, module, has_loss_fn: bool):
        self.module = module
        self.has_loss_fn = has_loss_fn

    def raw(self, batch_size: int, gen: torch.Generator | None) -> Any:
        seed = int(torch.randint(0, 2 ** 31 - 1, (1,), generator=gen)) if gen is not None else 0
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return self.module.make_batch(batch_size)

    def split(self, raw: Any) -> tuple[tuple, Any]:
        if isinstance(raw, torch.Tensor):
            inputs, target = (raw,), None
        elif isinstance(raw, (tuple, list)) and len(raw) == 2:
            x, target = raw
            inputs = tuple(x) if isinstance(x, (tuple, list)) else (x,)
        else:
            raise SpecError("make_batch(batch_size) must return a tensor (the input) or a pair "
                            f"(input or tuple of inputs, target); got {type(raw).__name__}")
        if self.has_loss_fn:
            target = raw  # the user's loss_fn(output, batch) gets the whole batch
        return inputs, target

    def __call__(self, batch_size: int, device, gen):
        return self.split(_to_device(self.raw(batch_size, gen), device))


def _own_loss(output: Any) -> torch.Tensor | None:
    """The loss a model computed itself: a dict / HF ModelOutput with a one-element 'loss' tensor."""
    if isinstance(output, torch.Tensor) or not hasattr(output, "keys") or "loss" not in output.keys():
        return None
    loss = output["loss"]
    return loss.float().reshape(()) if isinstance(loss, torch.Tensor) and loss.numel() == 1 else None


def _default_loss(output: Any, target: Any) -> torch.Tensor:
    """No loss_fn: a scalar output (or a dict's 'loss', HF style) is the loss; else cross-entropy
    for int targets, mse for float. Any other output needs the file's own loss_fn."""
    own = _own_loss(output)
    if own is not None:
        return own
    if not isinstance(output, torch.Tensor):
        raise TypeError(f"the model returns {estimate.describe_output(output)}, not a tensor, so there "
                        "is no default loss for it")
    if target is None:
        if isinstance(output, torch.Tensor) and output.numel() == 1:
            return output.float().reshape(())
        return batches.mean_output(output)
    if not target.is_floating_point():
        return batches.cross_entropy_last_dim(output, target)
    return batches.mse(output, target)


class _Build:
    def __init__(self, module):
        self.module = module

    def __call__(self) -> nn.Module:
        model = self.module.build_model()
        if not isinstance(model, nn.Module):
            raise SpecError(f"build_model() must return a torch.nn.Module, got {type(model).__name__}")
        return model.float()


def _check_loss_for_real(path: str, model: nn.Module, make_batch: "_UserBatches", the_loss, batch_size: int,
                         has_loss_fn: bool) -> None:
    """When the meta dry run could not show a loss, one real forward (no gradients) must: a check
    whose every step fails on the loss would otherwise only say 'did not run' after minutes."""
    try:
        inputs, target = make_batch(batch_size, torch.device("cpu"), torch.Generator().manual_seed(0))
        with torch.no_grad():
            output = model(*inputs)
    except Exception:  # noqa: BLE001 - the checks report a failing forward, with its module
        return
    try:
        loss = the_loss(output, target)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise TypeError(f"it returned {estimate.describe_output(loss)}, not a one-element tensor")
    except Exception as exc:  # noqa: BLE001
        raise SpecError(f"{path}: refused", [_loss_hint(output, has_loss_fn, estimate.first_line(exc))]) from None


def _loss_hint(output: Any, has_loss_fn: bool, why: str) -> str:
    got = estimate.describe_output(output)
    if has_loss_fn:
        return f"loss_fn(output, batch) fails on the model's output ({got}): {why}"
    example = ("return torch.nn.functional.cross_entropy(output['logits'], batch[1])"
               if hasattr(output, "keys") else "return <a scalar tensor computed from output and batch>")
    if isinstance(output, torch.Tensor):
        return f"the default loss fails on the model's output ({got}): {why}; define loss_fn(output, batch)"
    return (f"the model returns {got} and the file defines no loss_fn, so no loss can be computed: add `def loss_fn(output, batch):` returning a scalar tensor, e.g. `{example}`, "
            "or return a 'loss' entry from the model")


def load_python_workload(path: str, limits: estimate.Limits) -> Workload:
    module = _import(path)
    problems = []
    for fn in ("build_model", "make_batch"):
        if not callable(getattr(module, fn, None)):
            problems.append(f"the file defines no function {fn}()")
    loss_fn = getattr(module, "loss_fn", None)
    if loss_fn is not None and not callable(loss_fn):
        problems.append("loss_fn is defined but is not a function")
    batch_size = getattr(module, "BATCH_SIZE", DEFAULT_BATCH_SIZE)
    if not isinstance(batch_size, int) or batch_size < 1:
        problems.append(f"BATCH_SIZE must be a positive integer, got {batch_size!r}")
    loss_weight = getattr(module, "LOSS_WEIGHT", 1.0)
    if isinstance(loss_weight, bool) or not isinstance(loss_weight, (int, float)) or not loss_weight > 0:
        problems.append(f"LOSS_WEIGHT must be a positive number, got {loss_weight!r}")
    seq_len = getattr(module, "SEQ_LEN", None)
    if seq_len is not None and (not isinstance(seq_len, int) or seq_len < 1):
        problems.append(f"SEQ_LEN must be a positive integer or None, got {seq_len!r}")
    make_opt = getattr(module, "make_optimizer", None)
    if make_opt is not None and not callable(make_opt):
        problems.append("make_optimizer is defined but is not a function")
    if problems:
        raise SpecError(f"{path}: {len(problems)} problem{'s' if len(problems) > 1 else ''}", problems)
    build = _Build(module)
    make_batch = _UserBatches(module, has_loss_fn=loss_fn is not None)
    the_loss = loss_fn or _default_loss
    optimizer = make_opt or OptimizerConfig()
    floats = optimizer.state_floats_per_param() if isinstance(optimizer, OptimizerConfig) else 2
    run = None
    try:  # look before allocating when the user's code allows building on meta
        meta_model = estimate.build_on_meta(build)
        xs, target = make_batch.split(_to_meta(make_batch.raw(batch_size, None)))
        run = estimate.dry_run(meta_model, xs, the_loss, target, count_flops=True)
        if run.problem:
            run = None  # e.g. data-dependent code that meta cannot trace: measure for real instead
    except Exception:  # noqa: BLE001
        run = None
    if run is None:
        model = build()
        run = estimate.DryRun(params=estimate.count_params(model))
        _check_loss_for_real(path, model, make_batch, the_loss, batch_size, has_loss_fn=loss_fn is not None)
        del model
    refusals = estimate.check_limits(run, floats, limits)
    if refusals:
        raise SpecError(f"{path}: refused", refusals)
    name = getattr(module, "NAME", None) or os.path.splitext(os.path.basename(path))[0]
    summary = {"name": name, "source": "python", "origin": path, "batch_size": batch_size,
               "seq_len": seq_len, **run.to_dict(floats), "flops_per_step": run.flops_per_step,
               "loss": getattr(loss_fn, "__name__", "default")}
    return Workload(name=name, build_model=build, make_batch=make_batch, loss_fn=the_loss,
                    make_optimizer=optimizer, batch_size=batch_size,
                    loss_weight=float(loss_weight), seq_len=seq_len,
                    flops_per_step=run.flops_per_step, summary=summary)
