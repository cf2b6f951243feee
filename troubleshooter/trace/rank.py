"""One rank of `trace --nproc`: what torch.distributed does to this rank's mixed precision.

The launcher (`torchrun.run_ranks`) starts `python -m troubleshooter.trace.child CONFIG` once per
rank under torch's own launcher; `child.py` installs the single-process observers as always and,
because CONFIG says `distributed`, these as well (`install_rank`). They record, in this process:

- `init_process_group`: where, the backend asked for and the one in effect. A script written for
  GPUs asks for nccl; on a host without CUDA gloo runs instead, and the report says so.
- DDP: where the model was wrapped, its communication hook (`fp16_compress_hook` all-reduces in
  float16), the dtype its reducer all-reduces in (the buckets' dtype, the parameters' dtype: the
  C++ reducer itself is not visible from Python), and for every training forward whether its
  backward will all-reduce (`require_backward_grad_sync`, which `no_sync()` turns off).
- FSDP1 (`FullyShardedDataParallel`) and FSDP2 (`fully_shard`): where each module was wrapped, its
  mixed precision policy as given and as in effect after FSDP's own resolution (a `reduce_dtype`
  left None reduces in `param_dtype`), per module, and whether gradient sync is on for each
  forward (`no_sync()`, `set_requires_gradient_sync`).
- The dtype of every reduction run from Python (`all_reduce`, `reduce_scatter_single`,
  `reduce_scatter_tensor`): FSDP's gradient reduce-scatter, a DDP hook's all-reduce,
  ShardedGradScaler's all-reduce of found_inf, the script's own calls; who made it and where.
- A hello file (pid, main thread) so the launcher can find, inspect and stop this rank, and a
  faulthandler dump of the Python stack on SIGUSR1, which works while the rank is blocked inside a
  collective (a Python signal handler would not run until the collective returns).

Everything records and then calls the original: the script's behaviour is unchanged, apart from
the nccl -> gloo substitution on a host without CUDA, without which it could not start.
"""
from __future__ import annotations

import functools
import os
import sys
import time
from typing import Any

import torch

from ..rank_files import RankFiles
from .locate import is_user_file, user_frame
from .frameworks import also_after_import as after_import

MAX_FORWARDS = 4000  # training forwards of wrapped models recorded per rank
MAX_STEPS_LISTED = 50
FSDP1 = "torch.distributed.fsdp.fully_sharded_data_parallel"
FSDP2 = "torch.distributed.fsdp._fully_shard._fully_shard"
# who ran a collective: the first torch path (relative to torch/) that matches, innermost first
_CALLERS = (("distributed/fsdp/sharded_grad_scaler.py", "ShardedGradScaler"),
            ("distributed/fsdp/_fully_shard/", "FSDP2"),
            ("distributed/fsdp/", "FSDP1"),
            ("distributed/algorithms/ddp_comm_hooks/", "DDP comm hook"),
            ("distributed/algorithms/_comm_hooks/", "FSDP1"),
            ("nn/parallel/distributed.py", "DDP"),
            ("distributed/tensor/", "DTensor"))
_GRADIENT_REDUCERS = {"FSDP1", "FSDP2", "DDP comm hook", "DDP"}
_TORCH_DIR = os.path.dirname(os.path.realpath(torch.__file__)) + os.sep


class RerunRefused(RuntimeError):
    """Raised into the tracer's own re-run of a step (trace/numerics.py: localising a non-finite
    value) when it would call a DDP/FSDP model: on one rank its all-gathers and reductions would
    wait forever for ranks that are not re-running. The re-run gives up (its error is reported);
    the passive hooks of `--nan` need no re-run and still localise."""


def _dtype(value) -> str | None:
    return str(value).replace("torch.", "") if value is not None else None


def _where(depth: int = 3) -> dict:
    path, line, function = user_frame(depth)
    return {"path": path, "line": line, "function": function}


def _wrap(owner, name: str, make) -> None:
    original = getattr(owner, name, None)
    if original is None or getattr(original, "_trace_rank", False):
        return
    wrapped = functools.wraps(original)(make(original))
    wrapped._trace_rank = True
    setattr(owner, name, wrapped)


class RankObserver:
    """This rank's distributed facts; `result()` is the child's "distributed" section."""

    def __init__(self, rec, folder: str):
        self.rec = rec
        self.files = RankFiles(folder)
        self.rank, self.local_rank, self.world_size = self.files.rank, self.files.local_rank, self.files.world_size
        self.backend: dict[str, Any] = {}
        self.ddp: dict[int, dict] = {}  # id(DDP module) -> where, hook, dtypes
        self.wrapped: dict[int, dict] = {}  # id(FSDP module) -> version, where, policy given
        self.policies: list[dict] = []  # per FSDP module, in effect (read after FSDP's lazy init)
        self.policy_roots: set[int] = set()
        self.reductions: dict[tuple, dict] = {}
        self.forwards: list[dict] = []  # per training forward of a DDP/FSDP root: step, sync
        self.sync_off_where: dict | None = None
        self.policy_sites: list[tuple] = []  # (MixedPrecision / MixedPrecisionPolicy object, where it was made)
        self._kinds: dict[type, str | None] = {}

    # -- the observers -----------------------------------------------------------------------
    def install(self) -> None:
        import torch.distributed as dist

        self.files.start()
        if dist.is_available():
            import torch.distributed.distributed_c10d as c10d

            for owner in (dist, c10d):
                _wrap(owner, "init_process_group", self._make_init_process_group)
                for op in ("all_reduce", "reduce_scatter_single", "reduce_scatter_tensor"):
                    _wrap(owner, op, functools.partial(self._make_collective, op))
        ddp = torch.nn.parallel.DistributedDataParallel
        _wrap(ddp, "__init__", self._make_ddp_init)
        _wrap(ddp, "register_comm_hook", self._make_comm_hook)
        _wrap(ddp, "_register_builtin_comm_hook", self._make_builtin_hook)
        _wrap(ddp, "no_sync", self._make_sync_off("no_sync"))
        after_import(FSDP1, self._patch_fsdp1)
        after_import(FSDP2, self._patch_fsdp2)
        torch.nn.modules.module.register_module_forward_pre_hook(self._pre_forward)
        torch.nn.modules.module.register_module_forward_hook(self._post_forward)

    def _make_init_process_group(self, original):
        def init_process_group(*args, **kwargs):
            backend = kwargs.get("backend", args[0] if args else None)
            self.backend.update(asked=str(backend) if backend is not None else None, **_where())
            if isinstance(backend, str) and backend.lower() == "nccl" and not torch.cuda.is_available():
                if "backend" in kwargs:
                    kwargs["backend"] = "gloo"
                else:
                    args = ("gloo", *args[1:])
                self.backend["substituted"] = ("nccl needs CUDA, which this host does not have: gloo ran instead "
                                               "(the collectives are the same; their speed is not)")
            out = original(*args, **kwargs)
            try:
                import torch.distributed as dist
                self.backend["used"] = str(dist.get_backend())
            except Exception:  # noqa: BLE001
                pass
            return out
        return init_process_group

    def _make_collective(self, op: str, original):
        def collective(*args, **kwargs):
            try:
                self._on_collective(op, args, kwargs)
            except Exception:  # noqa: BLE001 - observing must never break the script
                pass
            return original(*args, **kwargs)
        return collective

    def _on_collective(self, op: str, args: tuple, kwargs: dict) -> None:
        if op == "all_reduce":
            tensor = kwargs.get("tensor", args[0] if args else None)
        else:
            tensor = kwargs.get("input", args[1] if len(args) > 1 else None)
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
            return
        by, where = self._caller(sys._getframe(2))
        key = (op, _dtype(tensor.dtype), by)
        entry = self.reductions.get(key)
        if entry is None:
            entry = self.reductions[key] = {"op": op, "dtype": key[1], "by": by, "gradients": by in _GRADIENT_REDUCERS,
                                            "count": 0, "steps": [], "max_numel": 0, **where}
        entry["count"] += 1
        entry["max_numel"] = max(entry["max_numel"], tensor.numel())
        step = self.rec.steps
        if step not in entry["steps"] and len(entry["steps"]) < MAX_STEPS_LISTED:
            entry["steps"].append(step)

    @staticmethod
    def _caller(frame) -> tuple[str, dict]:
        """(who ran the collective, the innermost user frame that led to it)."""
        by = None
        while frame is not None:
            name = frame.f_code.co_filename
            if is_user_file(name):
                return by or "script", {"path": name, "line": frame.f_lineno, "function": frame.f_code.co_name}
            if by is None and name.startswith(_TORCH_DIR):
                rel = name[len(_TORCH_DIR):].replace(os.sep, "/")
                by = next((who for marker, who in _CALLERS if rel.startswith(marker)), None)
            frame = frame.f_back
        return by or "script", {"path": None, "line": None, "function": None}

    def _make_ddp_init(self, original):
        def __init__(ddp, *args, **kwargs):
            out = original(ddp, *args, **kwargs)
            try:
                module = getattr(ddp, "module", None)
                param = next(iter(module.parameters()), None) if module is not None else None
                mp = getattr(ddp, "mixed_precision", None)
                self.ddp[id(ddp)] = {
                    **_where(), "module": type(module).__name__ if module is not None else None,
                    "param_dtype": _dtype(param.dtype) if param is not None else None, "comm_hook": None,
                    "mixed_precision": None if mp is None else {
                        "param_dtype": _dtype(getattr(mp, "param_dtype", None)),
                        "reduce_dtype": _dtype(getattr(mp, "reduce_dtype", None))}}
            except Exception:  # noqa: BLE001
                pass
            return out
        return __init__

    def _note_hook(self, ddp, name: str) -> None:
        entry = self.ddp.setdefault(id(ddp), {"path": None, "line": None, "function": None, "module": None,
                                              "param_dtype": None, "mixed_precision": None})
        low = name.lower()
        dtype = "float16" if "fp16" in low else "bfloat16" if "bf16" in low else None
        entry["comm_hook"] = {"name": name, "compress_dtype": dtype, **_where(4)}

    def _make_comm_hook(self, original):
        def register_comm_hook(ddp, state, hook):
            fn = hook.func if isinstance(hook, functools.partial) else hook
            self._note_hook(ddp, getattr(fn, "__qualname__", None) or type(fn).__name__)
            return original(ddp, state, hook)
        return register_comm_hook

    def _make_builtin_hook(self, original):
        def _register_builtin_comm_hook(ddp, comm_hook_type):
            self._note_hook(ddp, str(comm_hook_type))
            return original(ddp, comm_hook_type)
        return _register_builtin_comm_hook

    def _make_sync_off(self, name: str):
        """Where the script turned gradient sync off last (`no_sync()`, `set_requires_gradient_sync(False)`):
        a step on gradients that were never reduced points there."""
        def make(original):
            def sync_off(module, *args, **kwargs):
                on = args[0] if args else kwargs.get("requires_gradient_sync", True)
                if name == "no_sync" or not on:
                    self.sync_off_where = {"call": name, **_where()}
                return original(module, *args, **kwargs)
            return sync_off
        return make

    def _make_policy_init(self, original):
        """Where a policy was written (its dtypes are a fault's right line, not the wrap that applies it)."""
        def __init__(policy, *args, **kwargs):
            original(policy, *args, **kwargs)
            if len(self.policy_sites) < 1000:
                self.policy_sites.append((policy, _where()))
        return __init__

    def _policy_at(self, policy) -> dict | None:
        return next(({"path": w["path"], "line": w["line"]} for p, w in self.policy_sites if p is policy), None)

    def _patch_fsdp1(self, module) -> None:
        def make(original):
            def __init__(fsdp, *args, **kwargs):
                out = original(fsdp, *args, **kwargs)
                self.wrapped.setdefault(id(fsdp), {"version": 1, **_where(),
                                                   "policy_at": self._policy_at(kwargs.get("mixed_precision"))})
                return out
            return __init__
        _wrap(module.MixedPrecision, "__init__", self._make_policy_init)
        _wrap(module.FullyShardedDataParallel, "__init__", make)
        _wrap(module.FullyShardedDataParallel, "no_sync", self._make_sync_off("no_sync"))

    def _patch_fsdp2(self, module) -> None:
        def make(original):
            def fully_shard(target, *args, **kwargs):
                out = original(target, *args, **kwargs)
                policy = kwargs.get("mp_policy")
                targets = target if isinstance(target, (list, tuple)) else [target]
                for t in targets:
                    self.wrapped.setdefault(id(t), {"version": 2, **_where(), "given": _fields(policy),
                                                    "policy_at": self._policy_at(policy)})
                return out
            return fully_shard
        _wrap(module.MixedPrecisionPolicy, "__init__", self._make_policy_init)
        _wrap(module, "fully_shard", make)
        _wrap(module.FSDPModule, "set_requires_gradient_sync", self._make_sync_off("set_requires_gradient_sync"))
        for name in ("torch.distributed.fsdp", "torch.distributed.fsdp._fully_shard",
                     "torch.distributed._composable.fsdp", "torch.distributed._composable.fsdp.fully_shard"):
            package = sys.modules.get(name)
            if package is not None and getattr(package, "fully_shard", None) is not None:
                package.fully_shard = module.fully_shard  # the names a script imports it by

    # -- per forward -------------------------------------------------------------------------
    def _kind(self, cls: type) -> str | None:
        kind = self._kinds.get(cls, "?")
        if kind != "?":
            return kind
        kind = None
        if issubclass(cls, torch.nn.parallel.DistributedDataParallel):
            kind = "DDP"
        elif FSDP1 in sys.modules and issubclass(cls, sys.modules[FSDP1].FullyShardedDataParallel):
            kind = "FSDP1"
        elif FSDP2 in sys.modules and issubclass(cls, sys.modules[FSDP2].FSDPModule):
            kind = "FSDP2"
        self._kinds[cls] = kind
        return kind

    def _pre_forward(self, module, args) -> None:
        kind = self._kind(type(module))
        if kind is None:
            return
        if self.rec.muted:  # the tracer re-runs a step on this rank alone (numerics): refused, see RerunRefused
            raise RerunRefused(f"a {kind} model is not re-run on one rank: its collectives would wait for the "
                               "other ranks, which do not re-run it")
        if not torch.is_grad_enabled() or len(self.forwards) >= MAX_FORWARDS:
            return
        try:
            if not _is_root(module, kind):
                return
            sync = _syncs(module, kind)
            entry = {"step": self.rec.steps, "kind": kind, "sync": sync, **_where()}
            if not sync and self.sync_off_where is not None:
                entry["sync_off"] = self.sync_off_where
            self.forwards.append(entry)
        except Exception:  # noqa: BLE001
            pass

    def _post_forward(self, module, args, output) -> None:
        kind = self._kind(type(module))
        if kind not in ("FSDP1", "FSDP2") or id(module) in self.policy_roots:
            return
        try:
            if not _is_root(module, kind):
                return
            self.policy_roots.add(id(module))
            self.policies += self._policies_under(module)
        except Exception:  # noqa: BLE001
            pass

    def _policies_under(self, root) -> list[dict]:
        """Each FSDP module's policy in effect, read once FSDP's lazy init (at the first forward) ran."""
        out = []
        for name, m in root.named_modules():
            kind = self._kind(type(m))
            if kind not in ("FSDP1", "FSDP2"):
                continue
            entry = {"module": _clean_name(name), "class": _wrapped_class(m, kind), "version": int(kind[-1]),
                     **{k: v for k, v in self.wrapped.get(id(m), {}).items() if k in ("path", "line", "given", "policy_at")}}
            entry.update(_fsdp1_policy(m) if kind == "FSDP1" else _fsdp2_policy(m))
            out.append(entry)
        return out

    def result(self) -> dict:
        return {"rank": self.rank, "local_rank": self.local_rank, "world_size": self.world_size, "pid": os.getpid(),
                "time": time.time(), "backend": self.backend, "ddp": list(self.ddp.values()),
                "fsdp": self.policies, "reductions": list(self.reductions.values()), "forwards": self.forwards}


# -- FSDP readings (torch 2.13 attribute names; an unknown version gives less, never an error) ------
def _fields(policy) -> dict | None:
    if policy is None:
        return None
    out = {}
    for name in ("param_dtype", "reduce_dtype", "output_dtype", "buffer_dtype"):
        if hasattr(policy, name):
            out[name] = _dtype(getattr(policy, name))
    for name in ("cast_forward_inputs", "cast_root_forward_inputs", "keep_low_precision_grads"):
        if hasattr(policy, name):
            out[name] = bool(getattr(policy, name))
    return out


def _is_root(module, kind: str) -> bool:
    """The outermost wrapper (FSDP sets `_is_root` at its lazy init; None before the first forward)."""
    if kind == "DDP":
        return True
    if kind == "FSDP1":
        return getattr(module, "_is_root", None) is not False
    return getattr(module._get_fsdp_state(), "_is_root", None) is not False


def _syncs(module, kind: str) -> bool:
    """Will this forward's backward reduce gradients across ranks?"""
    if kind == "DDP":
        return bool(getattr(module, "require_backward_grad_sync", True))
    if kind == "FSDP1":
        return bool(getattr(module, "_sync_gradients", True))
    for m in module.modules():
        state = m._get_fsdp_state() if hasattr(m, "_get_fsdp_state") else None
        group = getattr(state, "_fsdp_param_group", None) if state is not None else None
        if group is not None:
            return bool(getattr(group, "reduce_grads", True))
    return True


def _fsdp1_policy(m) -> dict:
    handle = getattr(m, "_handle", None)
    flat = getattr(handle, "flat_param", None) if handle is not None else None
    orig = _dtype(getattr(handle, "_orig_param_dtype", None)) if handle is not None else None
    return {"given": _fields(getattr(m, "mixed_precision", None)), "params_dtype": orig,
            "compute_dtype": _dtype(getattr(handle, "_fwd_bwd_param_dtype", None)) if handle is not None else None,
            "reduce_dtype": _dtype(getattr(handle, "_reduce_dtype", None)) if handle is not None else None,
            "keep_low_precision_grads": bool(getattr(handle, "_keep_low_precision_grads", False)) if handle else None,
            "sharded_numel": int(flat.numel()) if flat is not None else 0}


def _fsdp2_policy(m) -> dict:
    state = m._get_fsdp_state()
    group = getattr(state, "_fsdp_param_group", None)
    params = list(getattr(group, "fsdp_params", []) or []) if group is not None else []
    first = params[0] if params else None
    orig = _dtype(getattr(first, "orig_dtype", None)) if first is not None else None
    compute = _dtype(getattr(first, "param_dtype", None)) or orig if first is not None else None
    reduce = _dtype(getattr(first, "reduce_dtype", None)) or compute if first is not None else None
    policy = getattr(group, "mp_policy", None) if group is not None else getattr(state, "_mp_policy", None)
    return {"params_dtype": orig, "compute_dtype": compute, "reduce_dtype": reduce,
            "output_dtype": _dtype(getattr(policy, "output_dtype", None)),
            "cast_forward_inputs": getattr(policy, "cast_forward_inputs", None), "params": len(params)}


def _clean_name(name: str) -> str:
    """A module path without FSDP1's wrapper segments (`_fsdp_wrapped_module`)."""
    parts = [p for p in name.split(".") if p not in ("_fsdp_wrapped_module", "_checkpoint_wrapped_module",
                                                      "_orig_mod")]
    return ".".join(parts) or "<root>"


def _wrapped_class(m, kind: str) -> str:
    if kind == "FSDP1":
        inner = getattr(m, "_fsdp_wrapped_module", None)
        return type(inner).__name__ if inner is not None else type(m).__name__
    mro = [c for c in type(m).__mro__[1:] if c.__name__ != "FSDPModule"]
    return mro[0].__name__ if mro else type(m).__name__


_observer: RankObserver | None = None


def install_rank(rec, cfg: dict, writer) -> RankObserver:
    """Observe this rank; its result file and the writer's "distributed" section follow RANK."""
    global _observer
    _observer = RankObserver(rec, cfg["dir"])
    writer.path = writer.path.replace("{rank}", str(_observer.rank))
    writer.sections["distributed"] = _observer.result
    write = writer._write

    def _write(exit_info):
        write(exit_info)
        _observer.files.state(rec.steps, (exit_info or {}).get("status") if exit_info is not None else None)
    writer._write = _write  # the launcher polls the small state file, not the whole result
    _observer.install()
    return _observer
