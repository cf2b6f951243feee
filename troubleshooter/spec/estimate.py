"""Look at a model before it exists: a dry run on the `meta` device.

Building the model and pushing one batch through it on `meta` costs no memory and no compute,
yet gives the parameter count, the output shape, the activations a training step keeps, the
FLOPs, and the first module whose input does not fit. That is how a bad or oversized spec is
refused before anything is allocated.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from .limits import (  # noqa: F401 - the torch-free part, kept importable from here
    DEFAULT_MAX_MEMORY_GB, DEFAULT_MAX_PARAMS, ENV_MAX_MEMORY_GB, ENV_MAX_PARAMS, GiB, MAX_MODULES, Limits,
    check_size, default_memory_gb, host_memory_gb, human_count,
)


@dataclass
class DryRun:
    params: int = 0
    output_shape: tuple[int, ...] | None = None
    activation_bytes: int = 0  # float32 outputs of every leaf module: what backward keeps, roughly
    input_bytes: int = 0
    flops_per_step: float | None = None  # forward + backward, from torch's FLOP counter
    problem: str | None = None  # the first module that failed, in words
    loss_problem: bool = False  # the forward ran; the loss could not be computed from its output
    failed_module: str | None = None  # its name in model.named_modules()

    def training_bytes(self, optimizer_floats_per_param: int) -> int:
        """fp32 weights + gradients + optimizer state + activations + the batch."""
        return (self.params * 4 * (2 + optimizer_floats_per_param)
                + self.activation_bytes + self.input_bytes)

    def to_dict(self, optimizer_floats_per_param: int = 2) -> dict[str, Any]:
        return {
            "params": self.params,
            "output_shape": list(self.output_shape) if self.output_shape is not None else None,
            "activation_bytes": self.activation_bytes,
            "estimated_training_bytes": self.training_bytes(optimizer_floats_per_param),
        }


def _shape(x: Any) -> list | None:
    if isinstance(x, torch.Tensor):
        return list(x.shape)
    if isinstance(x, (tuple, list)):
        return [_shape(v) for v in x]
    return None


def _nbytes(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * 4  # counted as float32 whatever the meta dtype
    if isinstance(x, (tuple, list)):
        return sum(_nbytes(v) for v in x)
    if isinstance(x, dict):
        return sum(_nbytes(v) for v in x.values())
    return 0


def describe_output(x: Any) -> str:
    """'a tensor [16, 10]', 'a dict with keys logits, hidden': what a model returned, in words."""
    if isinstance(x, torch.Tensor):
        return f"a tensor {list(x.shape)}"
    if isinstance(x, dict) or hasattr(x, "keys") and callable(x.keys):
        keys = [str(k) for k in list(x.keys())[:8]]
        return f"a {type(x).__name__} with keys {', '.join(keys) or '(none)'}"
    if isinstance(x, (tuple, list)):
        return f"a {type(x).__name__} of {len(x)}"
    return f"a {type(x).__name__}"


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def build_on_meta(build_model: Callable[[], nn.Module]) -> nn.Module:
    with torch.device("meta"):
        return build_model()


def count_params(model: nn.Module) -> int:
    """Distinct parameters (tied weights once), as `sum(p.numel() for p in model.parameters())`."""
    return sum(p.numel() for p in model.parameters())


def dry_run(model: nn.Module, inputs: tuple, loss_fn: Callable | None = None,
            target: Any = None, count_flops: bool = True) -> DryRun:
    """Forward (and, when a loss is given, backward) one meta batch through `model`."""
    result = DryRun(params=count_params(model), input_bytes=_nbytes(inputs))
    running: list[tuple[str, nn.Module, Any]] = []
    handles = []

    def pre_hook(name):
        def hook(module, args):
            running.append((name, module, args))
        return hook

    def post_hook(module, args, output):
        if running:
            running.pop()
        result.activation_bytes += _nbytes(output)

    for name, module in model.named_modules():
        if not list(module.children()):
            handles.append(module.register_forward_pre_hook(pre_hook(name)))
            handles.append(module.register_forward_hook(post_hook))
    counter = None
    try:
        if count_flops:
            from torch.utils.flop_counter import FlopCounterMode

            counter = FlopCounterMode(display=False)
            counter.__enter__()
        try:
            model.train()
            output = model(*inputs)
        except Exception as exc:  # noqa: BLE001 - any failure is the spec's shape problem
            if running:
                name, module, args = running[-1]
                result.failed_module = name
                shape = _shape(args[0] if len(args) == 1 else args)
                result.problem = (f"module '{name}' ({type(module).__name__}) cannot take an input of "
                                  f"shape {shape}: {first_line(exc)}")
            else:
                result.problem = f"the model's forward failed: {first_line(exc)}"
            return result
        result.output_shape = tuple(output.shape) if isinstance(output, torch.Tensor) else None
        if loss_fn is not None:
            try:
                loss = loss_fn(output, target)
                if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                    raise TypeError(f"the loss must be a one-element tensor, got {describe_output(loss)}")
                if loss.requires_grad:
                    loss.backward()
            except Exception as exc:  # noqa: BLE001
                result.problem = (f"the loss cannot be computed on the model's output "
                                  f"({describe_output(output)}): {first_line(exc)}")
                result.loss_problem = True
                return result
    finally:
        for h in handles:
            h.remove()
        if counter is not None:
            counter.__exit__(None, None, None)
            total = counter.get_total_flops()
            result.flops_per_step = float(total) if total else None
    return result


def check_limits(run: DryRun, optimizer_floats_per_param: int, limits: Limits) -> list[str]:
    """Reasons to refuse the spec before allocating it (empty when it fits)."""
    problems = []
    if run.params > limits.max_params:
        problems.append(
            f"the model has {run.params:,} parameters, over the limit of {int(limits.max_params):,} "
            f"(raise it with {ENV_MAX_PARAMS} or max_params=...)")
    need = run.training_bytes(optimizer_floats_per_param)
    if need > limits.max_memory_gb * GiB:
        problems.append(
            f"a training step would need about {need / GiB:.1f} GiB (weights, gradients, optimizer "
            f"state and {run.activation_bytes / GiB:.1f} GiB of activations), over the limit of "
            f"{limits.max_memory_gb:g} GiB (shrink the batch or raise {ENV_MAX_MEMORY_GB})")
    return problems
