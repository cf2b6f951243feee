"""Turn a `SpecSource` into a `Workload`, refusing bad or oversized specs before allocating.

YAML stacks and presets are built here in-process (no user code runs). A Python file is user
code: it is only imported when execution is allowed, and `run_with_workload` does that in a
child process with a time limit.
"""
from __future__ import annotations

import os
from functools import partial
from typing import Any, Callable

import torch
from torch import nn

from ..errors import SpecError
from ..workload import Workload
from . import batches, estimate, yamlspec
from .optim import OptimizerConfig
from .quick_check import check_preset, problem_error
from .presets import get_preset, parse_preset_string
from .source import SpecSource

DEFAULT_TIMEOUT_S = 600.0
_EXEC_HINT = ("running a Python model file executes its code; enable it with --allow-exec on the "
              "command line (or the app's execution flag) if you trust the file")


# --- module-level builders, so a Workload's callables pickle -----------------------------------

def _build_stack(layer_specs: tuple) -> nn.Module:
    """nn.Sequential from resolved (class name, args, kwargs); module paths are '0', '1', ..."""
    return nn.Sequential(*[getattr(nn, name)(*args, **kwargs) for name, args, kwargs in layer_specs])


def _build_with_weights(build: Callable[[], nn.Module], state_dict: dict | None) -> nn.Module:
    model = build()
    if state_dict is not None:
        model.load_state_dict(state_dict)  # copies into the float32 parameters whatever the file's dtype
    return model.float()


def _yaml_batch(rest_shape: tuple, dtype: str, scale: float, high: int | None, target_kind: str,
                target_rest: tuple, num_classes: int | None, batch_size: int, device, gen):
    shape = (batch_size, *rest_shape)
    if dtype == "int64":
        x = batches.int_input(shape, high, device, gen)
    else:
        x = batches.float_input(shape, device, gen, scale)
    tshape = (batch_size, *target_rest)
    if target_kind == "classes":
        target = batches.int_input(tshape, num_classes, device, gen)
    elif target_kind == "regression":
        target = batches.float_input(tshape, device, gen)
    else:
        target = None
    return (x,), target


_LOSSES = {
    ("classes", "cross_entropy"): batches.cross_entropy_last_dim,
    ("regression", "mse"): batches.mse,
    ("none", "mse"): batches.mse_to_zero,
    ("none", None): batches.mean_output,
}


# --- shared finishing: dry run, limits, weights -------------------------------------------------

def _load_state_dict(path: str) -> tuple[dict | None, str | None]:
    if not os.path.isfile(path):
        return None, f"weights file not found: {path}"
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the spec's problem
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return None, (f"weights file {path} cannot be loaded with torch.load(weights_only=True) "
                      f"(it must be a state_dict of tensors, not pickled code): {first}")
    for key in ("model", "state_dict", "model_state_dict"):  # a checkpoint: take its model part
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
            break
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        return None, f"weights file {path} is not a state_dict (a mapping of names to tensors)"
    return obj, None


def _strip_wrapper_prefix(model: nn.Module, state_dict: dict) -> dict:
    """Weights saved from DataParallel/DDP ('module.') or torch.compile ('_orig_mod.') fit the bare model."""
    expected = model.state_dict()
    for prefix in ("module.", "_orig_mod."):
        if state_dict and all(k.startswith(prefix) for k in state_dict) and \
                not any(k.startswith(prefix) for k in expected):
            state_dict = {k[len(prefix):]: v for k, v in state_dict.items()}
    return state_dict


def _compare_state_dict(model: nn.Module, state_dict: dict, path: str) -> list[str]:
    expected = model.state_dict()
    problems = []
    missing = [k for k in expected if k not in state_dict]
    unexpected = [k for k in state_dict if k not in expected]

    def listing(keys):
        return ", ".join(keys[:6]) + (f" and {len(keys) - 6} more" if len(keys) > 6 else "")

    if missing:
        problems.append(f"weights file {path} lacks {len(missing)} key(s) the model has: {listing(missing)}")
    if unexpected:
        problems.append(f"weights file {path} has {len(unexpected)} key(s) the model lacks: {listing(unexpected)}")
    for key, tensor in expected.items():
        if key in state_dict and tuple(state_dict[key].shape) != tuple(tensor.shape):
            problems.append(f"weights file {path}: {key} has shape {list(state_dict[key].shape)}, "
                            f"the model expects {list(tensor.shape)}")
    return problems


def _weights_path(weights: str | None, base_dir: str | None) -> str | None:
    if weights is None:
        return None
    path = os.path.expanduser(weights)
    if not os.path.isabs(path):
        path = os.path.join(base_dir or os.getcwd(), path)
    return os.path.normpath(path)


def _finish(*, name: str, label: str, build: Callable[[], nn.Module], make_batch: Callable,
            loss_fn: Callable, batch_size: int, optimizer: OptimizerConfig, loss_weight: float,
            seq_len: int | None, flops_fn: Callable[[int], float] | None, summary: dict,
            meta_model: nn.Module, run: estimate.DryRun, weights: str | None,
            problems: list[str], limits: estimate.Limits) -> Workload:
    """Size limits, weights and the Workload; raise one SpecError with every problem."""
    problems = list(problems)
    limit_problems = estimate.check_limits(run, optimizer.state_floats_per_param(), limits)
    problems += limit_problems
    state_dict = None
    if weights is not None:
        if limit_problems:  # never load the weights of a model we refuse to build
            if not os.path.isfile(weights):
                problems.append(f"weights file not found: {weights}")
        else:
            state_dict, problem = _load_state_dict(weights)
            if problem:
                problems.append(problem)
            else:
                state_dict = _strip_wrapper_prefix(meta_model, state_dict)
                problems += _compare_state_dict(meta_model, state_dict, weights)
    if problems:
        raise problem_error(label, problems)
    flops = flops_fn(run.params) if flops_fn is not None else run.flops_per_step
    summary = {**summary, "batch_size": batch_size, "seq_len": seq_len,
               **run.to_dict(optimizer.state_floats_per_param()), "flops_per_step": flops,
               "loss_weight": loss_weight, "optimizer": optimizer.to_dict(), "weights": weights}
    return Workload(
        name=name,
        build_model=partial(_build_with_weights, build, state_dict),
        make_batch=make_batch,
        loss_fn=loss_fn,
        make_optimizer=optimizer,
        batch_size=batch_size,
        loss_weight=loss_weight,
        seq_len=seq_len,
        flops_per_step=flops,
        summary=summary,
    )


# --- presets -------------------------------------------------------------------------------------

def _load_preset(name: str, overrides: dict[str, Any], limits: estimate.Limits, *, label: str,
                 optimizer: OptimizerConfig | None = None, loss_weight: float = 1.0,
                 weights: str | None = None, spec_name: str | None = None,
                 problems: list[str] | None = None, only_check: bool = False) -> Workload | None:
    cfg, problems = check_preset(name, overrides, limits, label=label, optimizer=optimizer, problems=problems)
    preset = get_preset(name)
    optimizer = optimizer or OptimizerConfig()
    if only_check:
        return None
    build = partial(preset.build, cfg)
    make_batch = partial(preset.make_batch, cfg)
    batch_size = cfg["batch_size"]
    meta_model = estimate.build_on_meta(build)
    inputs, target = make_batch(batch_size, torch.device("meta"), None)
    run = estimate.dry_run(meta_model, inputs, preset.loss_fn, target,
                           count_flops=preset.flops_per_step is None)
    if run.problem:
        problems.append(run.problem)
    flops_fn = partial(preset.flops_per_step, cfg) if preset.flops_per_step else None
    summary = {"name": spec_name or name, "source": "preset", "preset": preset.name, "config": cfg,
               "description": preset.description}
    return _finish(name=spec_name or f"{preset.name}", label=label, build=build, make_batch=make_batch,
                   loss_fn=preset.loss_fn, batch_size=batch_size,
                   optimizer=optimizer, loss_weight=loss_weight,
                   seq_len=preset.seq_len(cfg), flops_fn=flops_fn, summary=summary,
                   meta_model=meta_model, run=run, weights=weights, problems=problems, limits=limits)


# --- YAML ----------------------------------------------------------------------------------------

def _resolve_target(spec, output_shape: tuple | None, batch_size: int, where) -> tuple[Any, list[str]]:
    """(kind, loss, num_classes, target_rest_shape), checked against the model's output shape."""
    target = spec.target
    loss = spec.loss
    kind = target.kind if target else ("regression" if loss == "mse" else "classes")
    if loss is None:
        loss = {"classes": "cross_entropy", "regression": "mse", "none": None}[kind]
    problems = []
    if kind == "classes" and loss != "cross_entropy":
        problems.append(f"{where('loss')}: loss {loss} does not fit target kind 'classes' (use cross_entropy)")
    if kind == "regression" and loss != "mse":
        problems.append(f"{where('loss')}: loss {loss} does not fit target kind 'regression' (use mse)")
    if kind == "none" and loss == "cross_entropy":
        problems.append(f"{where('loss')}: cross_entropy needs class targets (target kind 'none' has none)")
    num_classes = target.num_classes if target else None
    rest: tuple = ()
    if output_shape is not None:
        if len(output_shape) == 0 or output_shape[0] != batch_size:
            problems.append(f"the model's output has shape {list(output_shape)}: its first dimension "
                            f"must be the batch size {batch_size}")
        elif kind == "classes":
            if len(output_shape) < 2:
                problems.append(f"{where('target')}: class targets need an output of shape [batch, ..., "
                                f"classes], the model gives {list(output_shape)}")
            elif num_classes is not None and output_shape[-1] != num_classes:
                problems.append(f"{where('target')}: num_classes is {num_classes} but the model's output "
                                f"{list(output_shape)} has {output_shape[-1]} on its last dimension")
            else:
                num_classes = output_shape[-1]
                rest = tuple(output_shape[1:-1])
        elif kind == "regression":
            rest = tuple(output_shape[1:])
    return (kind, loss, num_classes, rest), problems


def _partial_spec(data: dict) -> Any:
    """When only optional sections are wrong, a spec without them, so the model is still checked."""
    from pydantic import ValidationError

    from .schema import Spec

    try:
        Spec.model_validate(data)
    except ValidationError as err:
        bad = {e["loc"][0] for e in err.errors() if e["loc"]}
        if not bad or bad & {"model", "input"} or any(not e["loc"] for e in err.errors()):
            return None
        try:
            return Spec.model_validate({k: v for k, v in data.items() if k not in bad})
        except ValidationError:
            return None
    return None


def _token_seq_len(inp) -> int | None:
    """Token-id input of shape [batch, seq_len] is a sequence model: report tokens/s and check seq_len."""
    return inp.shape[1] if inp.dtype == "int64" and len(inp.shape) == 2 else None


def _load_yaml(source: SpecSource, limits: estimate.Limits, only_check: bool = False) -> Workload | None:
    text = source.read_text()
    label = source.describe()
    data, lines = yamlspec.parse_yaml(text)
    spec, problems = yamlspec.validate_schema(data, lines)
    where = lambda *path: yamlspec._where(path, lines)  # noqa: E731
    raw_model = data.get("model")
    raw_layers = raw_model.get("layers") if isinstance(raw_model, dict) else None
    resolved: list = []
    layer_problems: list[str] = []
    if isinstance(raw_layers, list):
        resolved, layer_problems = yamlspec.resolve_layers(raw_layers, lines)
        problems += layer_problems
    weights = None
    if isinstance(data.get("weights"), str):
        weights = _weights_path(data["weights"], source.base_dir)
        if not os.path.isfile(weights):
            problems.append(f"{where('weights')}: weights file not found: {weights}")
            weights = None  # reported once; not looked at again
    if spec is None:  # keep checking the model when only optional sections are wrong
        spec = _partial_spec(data)
    if spec is None or layer_problems:
        raise problem_error(label, problems)
    if spec.model.preset is not None:
        return _load_preset(spec.model.preset, spec.model.params, limits, label=label,
                            optimizer=spec.optimizer.config(), loss_weight=spec.loss_weight,
                            weights=weights, spec_name=spec.name, problems=problems, only_check=only_check)
    if only_check:
        return None
    # Build every layer on meta on its own, so a bad value names its layer.
    build_problems = []
    for i, (name, args, kwargs) in enumerate(resolved):
        try:
            with torch.device("meta"):
                getattr(nn, name)(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001
            build_problems.append(f"{yamlspec.layer_line(i, lines)} ({name}): cannot be built: "
                                  f"{estimate.first_line(exc)}")
    if build_problems:
        raise problem_error(label, problems + build_problems)
    build = partial(_build_stack, tuple(resolved))
    meta_model = estimate.build_on_meta(build)
    inp = spec.input
    meta_x = (torch.empty(tuple(inp.shape), dtype=getattr(torch, inp.dtype), device="meta"),)
    first = resolved[0][0]
    if first == "Embedding" and inp.dtype != "int64":
        problems.append(f"{where('input', 'dtype')}: the first layer is an Embedding, which takes int64 "
                        "token ids: set dtype: int64 and high: <vocabulary size>")
    if first == "Embedding" and inp.dtype == "int64":
        num = resolved[0][1][0] if resolved[0][1] else resolved[0][2].get("num_embeddings")
        if isinstance(num, int) and inp.high > num:
            problems.append(f"{where('input', 'high')}: high is {inp.high} but the Embedding has only "
                            f"{num} rows: token ids would be out of range")
    run = estimate.dry_run(meta_model, meta_x, count_flops=False)
    if run.problem:
        # name the spec line of the failing top-level layer
        index = (run.failed_module or "").split(".")[0]
        prefix = f"{yamlspec.layer_line(int(index), lines)}: " if index.isdigit() else ""
        problems.append(prefix + run.problem)
        raise problem_error(label, problems)
    (kind, loss, num_classes, rest), target_problems = _resolve_target(spec, run.output_shape,
                                                                       inp.batch_size, where)
    problems += target_problems
    loss_fn = _LOSSES.get((kind, loss), batches.mean_output)
    make_batch = partial(_yaml_batch, tuple(inp.shape[1:]), inp.dtype, inp.scale, inp.high, kind, rest,
                         num_classes)
    if not problems:  # a full meta training step for the FLOP count and the activations
        meta_model = estimate.build_on_meta(build)
        xs, target = make_batch(inp.batch_size, torch.device("meta"), None)
        run = estimate.dry_run(meta_model, xs, loss_fn, target, count_flops=True)
        if run.problem:
            problems.append(run.problem)
    layer_text = [f"{n}({', '.join([*map(repr, a), *(f'{k}={v!r}' for k, v in kw.items())])})"
                  for n, a, kw in resolved]
    name = spec.name or (os.path.splitext(os.path.basename(source.value))[0] if source.is_path else "spec")
    summary = {"name": name, "source": "yaml", "origin": source.value if source.is_path else None,
               "layers": layer_text,
               "input": {"shape": list(inp.shape), "dtype": inp.dtype, "scale": inp.scale, "high": inp.high},
               "target": {"kind": kind, "num_classes": num_classes}, "loss": loss}
    return _finish(name=name, label=label, build=build, make_batch=make_batch, loss_fn=loss_fn,
                   batch_size=inp.batch_size, optimizer=spec.optimizer.config(),
                   loss_weight=spec.loss_weight, seq_len=_token_seq_len(inp), flops_fn=None, summary=summary,
                   meta_model=meta_model, run=run, weights=weights,
                   problems=problems, limits=limits)


# --- public API ----------------------------------------------------------------------------------

def load_workload(source: SpecSource, allow_exec: bool = False, *, max_params: float | None = None,
                  max_memory_gb: float | None = None) -> Workload:
    """Build the Workload a source describes; SpecError lists every problem at once.

    A Python source is imported in THIS process (only with allow_exec): call it inside a worker,
    as `run_with_workload` does.
    """
    return _load(source, allow_exec, estimate.Limits.resolve(max_params, max_memory_gb))  # messages: errors.clip


def _load(source: SpecSource, allow_exec: bool, limits: estimate.Limits) -> Workload:
    if source.kind == "preset":
        name, overrides = parse_preset_string(source.value)
        return _load_preset(name, overrides, limits, label=source.describe())
    if source.kind == "yaml":
        return _load_yaml(source, limits)
    if not allow_exec:
        raise SpecError(f"{source.describe()}: not run: {_EXEC_HINT}")
    from .pyfile import load_python_workload

    return load_python_workload(source.value, limits)


def _python_job(source: SpecSource, func: Callable, args: tuple, kwargs: dict) -> Any:
    """Runs in the child: import the user's file, then the job on its workload."""
    from ..heap import freeze_imports

    workload = load_workload(source, allow_exec=True)
    freeze_imports()  # the child runs this one job: the user's imports (transformers, ...) stay alive
    return func(workload, *args, **kwargs)


def run_with_workload(source: SpecSource, func: Callable, *args: Any, allow_exec: bool = False,
                      timeout_s: float = DEFAULT_TIMEOUT_S, **kwargs: Any) -> Any:
    """`func(workload, *args, **kwargs)`: in-process for YAML and presets (no user code), in a
    child process with a time limit for a Python file (which must be allowed explicitly)."""
    if source.kind != "python":
        return func(load_workload(source), *args, **kwargs)
    if not allow_exec:
        raise SpecError(f"{source.describe()}: not run: {_EXEC_HINT}")
    from ..worker import run_in_worker

    return run_in_worker(_python_job, source, func, args, kwargs, timeout_s=timeout_s)
