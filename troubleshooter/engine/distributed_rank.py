"""One rank of `check --nproc N`: the skip-rate and NaN checks on the model wrapped as it will train.

    python -m torch.distributed.run ... -m troubleshooter.engine.distributed_rank CONFIG.json

(started by `engine.distributed_check` through `torchrun.run_ranks`). Every rank builds the spec's
model with the same seed, wraps it (DDP, or FSDP2 `fully_shard` on each child with parameters and
on the root, with `MixedPrecisionPolicy(param_dtype, reduce_dtype)`), and trains it for N steps
on its own synthetic batches (seeded by step and rank, as a DistributedSampler would split them),
with a GradScaler when it computes in float16. Per step it records the loss, the loss scale
before and after, whether GradScaler skipped, and whether this rank's own gradients (its shard,
for FSDP2) were finite before any cross-rank agreement.

What the reduction does to the gradients is measured where it happens, on the tensors about to be
reduced: for DDP inside the communication hook (the bucket, divided by the world size, cast to
the reduce dtype as fp16/bf16_compress_hook do), for FSDP2 at its reduce-scatter copy-in (each
unsharded gradient cast to the reduce dtype and pre-divided as `foreach_reduce` does, torch
2.13's _fsdp_collectives.py). Counted: non-zero elements that become zero (underflow) and finite
ones that become inf (overflow).
"""
from __future__ import annotations

import json
import math
import os
import sys

DTYPES = ("float16", "bfloat16", "float32")


class ReductionMeter:
    """Non-zero gradient elements the cast to the reduce dtype zeroes, finite ones it makes inf."""

    def __init__(self):
        self.step = 0
        self.per_step: dict[int, dict] = {}

    def measure(self, values, reduce_dtype, divide: float | None = None) -> None:
        import torch

        x = values.detach().float()
        if divide:
            x = x / divide
        low = values.detach().to(reduce_dtype)
        if divide:
            low = low / divide  # in the reduce dtype, as FSDP2 pre-divides
        nonzero = x != 0
        finite = torch.isfinite(x)
        entry = self.per_step.setdefault(self.step, {"step": self.step, "elements": 0, "nonzero": 0,
                                                     "flushed": 0, "finite": 0, "overflowed": 0})
        entry["elements"] += x.numel()
        entry["nonzero"] += int(nonzero.sum())
        entry["flushed"] += int((nonzero & (low == 0)).sum())
        entry["finite"] += int(finite.sum())
        entry["overflowed"] += int((finite & ~torch.isfinite(low)).sum())

    def result(self) -> list[dict]:
        return [self.per_step[k] for k in sorted(self.per_step)]


def _dtype(name: str):
    import torch
    return {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[name]


def _ddp(model, reduce_dtype: str, meter: ReductionMeter):
    """DDP whose gradient reduction is the requested one: float32 as DDP does by default, float16 or
    bfloat16 as fp16/bf16_compress_hook do; each bucket measured before it is reduced."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(model)
    hook = {"float16": default_hooks.fp16_compress_hook, "bfloat16": default_hooks.bf16_compress_hook,
            "float32": default_hooks.allreduce_hook}[reduce_dtype]
    world = dist.get_world_size()

    def measured(state, bucket):
        meter.measure(bucket.buffer(), _dtype(reduce_dtype), divide=world)
        return hook(state, bucket)

    ddp.register_comm_hook(None, measured)
    return ddp


def _fsdp2(model, param_dtype: str, reduce_dtype: str, meter: ReductionMeter):
    """fully_shard on each child with parameters, then the root; FSDP2's copy-in measured."""
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as collectives

    policy = MixedPrecisionPolicy(param_dtype=_dtype(param_dtype), reduce_dtype=_dtype(reduce_dtype))
    for child in model.children():
        if any(True for _ in child.parameters()):
            fully_shard(child, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    original = collectives.foreach_reduce_scatter_copy_in
    device_type = next(model.parameters()).device.type

    def copy_in(unsharded_grads, reduce_scatter_input, world_size):
        try:
            pre = collectives._get_gradient_divide_factors(dist.group.WORLD, None, reduce_scatter_input.dtype,
                                                           device_type)[0]
            for g in unsharded_grads:
                meter.measure(g, reduce_scatter_input.dtype, divide=pre)
        except Exception:  # noqa: BLE001 - a torch whose internals differ: the reduction is not measured
            meter.per_step.setdefault(-1, {"step": -1, "error": "not measured on this torch version"})
        return original(unsharded_grads, reduce_scatter_input, world_size)

    collectives.foreach_reduce_scatter_copy_in = copy_in
    return policy


def _local_finite(model) -> bool:
    """This rank's own gradients (its shard under FSDP2) are all finite: before any agreement."""
    import torch

    grads = []
    for p in model.parameters():
        g = p.grad
        if g is None:
            continue
        grads.append(g.to_local() if hasattr(g, "to_local") else g)
    return all(bool(torch.isfinite(g).all()) for g in grads)


def _finite(x: float) -> float | str:
    return x if math.isfinite(x) else ("nan" if x != x else "inf")


def run(cfg: dict, files) -> dict:
    import torch
    import torch.distributed as dist

    from ..spec import SpecSource, load_workload
    from .training_step import device_batch

    cuda = cfg.get("device", "cpu").startswith("cuda") and torch.cuda.is_available()
    device = torch.device("cuda", files.local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    workload = load_workload(SpecSource(**cfg["source"]), allow_exec=bool(cfg.get("allow_exec")))
    torch.manual_seed(cfg["seed"])
    model = workload.build_model().to(device)
    model.train()
    meter = ReductionMeter()
    param_dtype, reduce_dtype = cfg["param_dtype"], cfg["reduce_dtype"]
    if cfg["wrap"] == "ddp":
        model = _ddp(model, reduce_dtype, meter)
        autocast_dtype = None if param_dtype == "float32" else _dtype(param_dtype)
    else:
        _fsdp2(model, param_dtype, reduce_dtype, meter)
        autocast_dtype = None  # FSDP2 computes in param_dtype itself
    optimizer = workload.make_optimizer(list(model.parameters()))
    scaler = torch.amp.GradScaler(device.type, enabled=param_dtype == "float16")
    series = []
    for i in range(cfg["steps"]):
        meter.step = i
        batch = device_batch(workload, device, cfg["seed"] * 100003 + i * world + rank)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            loss = workload.loss(model, batch)
        scaler.scale(loss).backward()
        local_finite = _local_finite(model)
        before = float(scaler.get_scale()) if scaler.is_enabled() else None
        scaler.step(optimizer)
        scaler.update()
        after = float(scaler.get_scale()) if scaler.is_enabled() else None
        skipped = bool(before is not None and after < before)
        value = float(loss.detach().float())
        series.append({"step": i, "loss": _finite(value), "skipped": skipped, "scale": before, "scale_after": after,
                       "via_scaler": scaler.is_enabled(), "local_grads_finite": local_finite,
                       "stepped_nonfinite": not local_finite and not skipped})
        files.state(i + 1)
    dist.barrier()
    return {"rank": rank, "world_size": world, "device": str(device), "series": series,
            "reduction": meter.result(), "backend": dist.get_backend(),
            "policy": {"wrap": cfg["wrap"], "param_dtype": param_dtype, "reduce_dtype": reduce_dtype}}


def main(config_path: str) -> None:
    from ..rank_files import RankFiles

    with open(config_path) as fh:
        cfg = json.load(fh)
    files = RankFiles(cfg["distributed"]["dir"])
    files.start()
    status, result = "finished", {}
    try:
        result = run(cfg, files)
    except Exception as exc:  # noqa: BLE001 - reported per rank, the others are stopped by the launcher
        import traceback

        status = "raised"
        result = {"rank": files.rank, "error": f"{type(exc).__name__}: {str(exc)[:500]}",
                  "traceback": traceback.format_exc()[-4000:]}
    path = cfg["result"].replace("{rank}", str(files.rank))
    with open(path + ".tmp", "w") as fh:
        json.dump(result, fh)
    os.replace(path + ".tmp", path)
    files.state(len(result.get("series") or []), status)
    sys.stdout.flush()
    os._exit(0)  # no process-group teardown that could wait for a rank that failed


if __name__ == "__main__":
    main(sys.argv[1])
