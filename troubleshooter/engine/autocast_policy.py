"""CUDA autocast's dtype policy on a CPU host, so a check or trace run on a CPU answers for the
user's GPU.

Why: autocast decides per op which dtype it runs in, and CPU and CUDA keep different lists. On a
CPU, float16 autocast leaves `exp`, `pow`, `sum`, `softmax`, `layer_norm`, the losses... in
float16, where CUDA autocast runs them in float32. A check on a CPU host then reports overflows
(a softmax sum past 65504, a `x ** 2` of an activation of 300) that the user's GPU never has,
and misses what only CUDA's lists do (`einsum`, `addmv` in float16).

How: CUDA's policy is installed as kernels of PyTorch's own `AutocastCPU` dispatch key
(`torch.library`), the layer where CPU autocast itself casts: above autograd, so every cast is
recorded like CUDA autocast's, and below the C++ decompositions, so `F.normalize`, `softmin` or
`cross_entropy` reach the listed ops inside them as on a GPU. Per op, as ATen's
`autocast_mode.h` wrappers do for CUDA:
- lower_precision_fp: eligible inputs (floating, not float64, on the CPU) cast to the autocast
  dtype;
- fp32: eligible inputs cast to float32;
- fp32_set_opt_dtype (`sum`, `softmax`, `cumsum`...): `dtype=float32` when none was given and
  the first input is eligible;
- fp32_append_dtype (`norm`): the overload with `dtype=float32`;
- promote: every eligible input cast to the widest of them (float32 if any is);
- banned (`binary_cross_entropy`, which raises under CUDA autocast): recorded for the report and
  run in float32 as CPU autocast does, so the run goes on and the report says it;
- every other op CPU autocast has a kernel for runs in its inputs' dtype, as on CUDA; where the
  CPU has no half-precision kernel for it (3-D pools, reflection pads, FFTs, linear algebra: why
  CPU autocast lists them in float32), it is computed in float32 and rounded to that dtype.
Removing the library restores CPU's own kernels.

Where the lists come from: torch itself, the `AT_FORALL_*` lists of the `ATen/autocast_mode.h`
installed with it (the lists `aten/src/ATen/autocast_mode.cpp` registers for CUDA, plus the
cuDNN convolutions and the banned op that file adds). When the header is not installed, the
table below, copied from torch 2.13.0's header, stands in and the report says so.
tests/test_autocast_policy.py compares the table with the header and the emulated dtypes with
the lists of PyTorch's documentation (docs/source/amp.md, "CUDA Op-Specific Behavior").
"""
from __future__ import annotations

import contextlib
import os
import re
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from .check_options import POLICIES, check_policy  # noqa: F401 (torch-free: the app's server checks them)
from .unsafe_op_findings import banned_findings  # noqa: F401 (torch-free: the trace parent writes it)

LABELS = {"cuda": "CUDA autocast policy emulated on CPU", "host": "host CPU policy"}
TABLE_TORCH = "2.13.0"
# torch 2.13.0, include/ATen/autocast_mode.h (AT_FORALL_* lists; BSD-3-Clause, (c) PyTorch
# contributors) and aten/src/ATen/autocast_mode.cpp (the cuDNN convolutions and the banned op)
_TABLE = {
    "lower_precision_fp": (
        "_convolution.deprecated", "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d",
        "conv_transpose2d.input", "conv_transpose3d.input", "convolution", "prelu", "addmm", "addmv", "addr",
        "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul",
        "linalg_multi_dot", "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell",
        "rnn_tanh_cell", "rnn_relu_cell", "_scaled_dot_product_flash_attention", "scaled_dot_product_attention"),
    "fp32": (
        "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
        "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus", "layer_norm",
        "native_layer_norm", "rms_norm", "group_norm", "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim",
        "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
        "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
        "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
        "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
        "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d", "_upsample_nearest_exact2d",
        "upsample_nearest3d", "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
        "_upsample_bilinear2d_aa", "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa"),
    "fp32_set_opt_dtype": (
        "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum", "linalg_vector_norm",
        "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum", "sum.dim_IntList"),
    "fp32_append_dtype": ("norm.Scalar", "norm.ScalarOpt_dim"),
    "promote": ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "index_put",
                "tensordot", "scatter_add"),
}
# registered for CUDA in autocast_mode.cpp itself, not through the header's lists
_CPP_LOWER = ("cudnn_convolution", "cudnn_convolution_transpose")
BANNED = ("binary_cross_entropy",)
_MACROS = {"lower_precision_fp": "AT_FORALL_LOWER_PRECISION_FP", "fp32": "AT_FORALL_FP32",
           "fp32_set_opt_dtype": "AT_FORALL_FP32_SET_OPT_DTYPE",
           "fp32_append_dtype": "AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE", "promote": "AT_FORALL_PROMOTE"}
# fp32_append_dtype: the overload called instead, and its arguments after `self` with the
# defaults of the overload it stands in for
_APPEND = {"norm.Scalar": ("norm", "ScalarOpt_dtype", (("p", 2),)),
           "norm.ScalarOpt_dim": ("norm", "ScalarOpt_dim_dtype", (("p", None), ("dim", None), ("keepdim", False)))}
BANNED_MESSAGE = ("torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast: "
                  "CUDA autocast raises a RuntimeError here")


# ---------------------------------------------------------------- the op lists


@dataclass(frozen=True)
class OpLists:
    """CUDA autocast's op lists (`name` or `name.overload`) and where they were read."""

    lists: dict[str, tuple[str, ...]]
    source: str
    from_torch: bool

    def policy_of(self, op: str) -> str | None:
        for policy, names in self.lists.items():
            if op in names:
                return policy
        return "banned" if op in BANNED else None


def header_path() -> str:
    return os.path.join(os.path.dirname(torch.__file__), "include", "ATen", "autocast_mode.h")


def parse_header(text: str) -> dict[str, tuple[str, ...]] | None:
    """The `AT_FORALL_*` lists of ATen's autocast_mode.h; None when one is missing."""
    out: dict[str, tuple[str, ...]] = {}
    for policy, macro in _MACROS.items():
        m = re.search(r"#define\s+" + macro + r"\(_\)(.*?)(?=\n\s*\n|\n\s*#)", text, re.S)
        if m is None:
            return None
        body = m.group(1)
        if policy == "fp32_append_dtype":
            names = re.findall(r'"([\w.]+)"', body)
        else:
            names = [n + ("." + o if o else "") for n, o in re.findall(r"_\(\s*(\w+)\s*(?:,\s*(\w+)\s*)?\)", body)]
        if not names:
            return None
        out[policy] = tuple(names)
    out["lower_precision_fp"] += tuple(n for n in _CPP_LOWER if n not in out["lower_precision_fp"])
    return out


_LISTS: OpLists | None = None


def cuda_op_lists() -> OpLists:
    """The lists of the torch in use, read from its header once; the 2.13.0 table without it."""
    global _LISTS
    if _LISTS is None:
        parsed = None
        try:
            with open(header_path(), encoding="utf-8") as fh:
                parsed = parse_header(fh.read())
        except OSError:
            parsed = None
        if parsed is not None:
            _LISTS = OpLists(parsed, f"torch {torch.__version__}'s own ATen/autocast_mode.h", True)
        else:
            table = dict(_TABLE)
            table["lower_precision_fp"] = table["lower_precision_fp"] + _CPP_LOWER
            _LISTS = OpLists(table, f"the table of torch {TABLE_TORCH}'s ATen/autocast_mode.h (this torch "
                                    f"{torch.__version__} has no header installed)", False)
    return _LISTS


# ---------------------------------------------------------------- the kernels


def _eligible(x: Any) -> bool:
    return (isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype is not torch.float64
            and x.device.type == "cpu")


def _cast(x: Any, dtype: torch.dtype) -> Any:
    if isinstance(x, torch.Tensor):
        return x.to(dtype) if _eligible(x) and x.dtype is not dtype else x
    if isinstance(x, (list, tuple)) and x and any(isinstance(i, torch.Tensor) for i in x):
        return type(x)(_cast(i, dtype) for i in x)
    return x


def _widest(args: tuple, kwargs: dict) -> torch.dtype:
    lower = torch.get_autocast_dtype("cpu")
    if any(_eligible(t) and t.dtype is torch.float32 for t in _flat(args, kwargs)):
        return torch.float32
    return lower


@dataclass
class PolicyRun:
    """What the emulation did while it was installed: calls per policy and per op."""

    lists: OpLists
    policy: str = "cuda"
    calls: dict[str, int] = field(default_factory=dict)  # policy -> calls
    ops: dict[str, int] = field(default_factory=dict)  # op -> calls
    banned: dict[str, int] = field(default_factory=dict)
    banned_at: dict[str, dict] = field(default_factory=dict)  # op -> the user's line that called it
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def note_banned(self, op: str) -> None:
        """An op CUDA autocast refuses ran under autocast: counted, with the user's first line."""
        from ..trace.outside import _user_frame  # the innermost line of the user's own files

        with self._lock:
            self.banned[op] = self.banned.get(op, 0) + 1
            if op not in self.banned_at:
                path, line, function = _user_frame(4)
                self.banned_at[op] = {"path": path, "line": line, "function": function}

    def count(self, policy: str, op: str) -> None:
        with self._lock:
            self.calls[policy] = self.calls.get(policy, 0) + 1
            if op in self.ops or len(self.ops) < 200:
                self.ops[op] = self.ops.get(op, 0) + 1


_KEY = torch._C.DispatchKey.AutocastCPU
_EXCLUDE = torch._C.DispatchKeySet(_KEY)


def _kernel(run: PolicyRun, policy: str, name: str, op) -> Any:
    """The AutocastCPU kernel of one op under CUDA's `policy` (the wrappers of autocast_mode.h)."""
    dtype_at = next((i for i, a in enumerate(op._schema.arguments) if a.name == "dtype"), None)
    dtype_kw_only = dtype_at is not None and op._schema.arguments[dtype_at].kwarg_only
    redirect = None
    if policy == "fp32_append_dtype" and name in _APPEND:
        base, overload, defaults = _APPEND[name]
        redirect = (getattr(getattr(torch.ops.aten, base), overload), defaults)

    def kernel(*args, **kwargs):
        run.count(policy, name)
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            if policy == "lower_precision_fp":
                dtype = torch.get_autocast_dtype("cpu")
                return op(*[_cast(a, dtype) for a in args], **{k: _cast(v, dtype) for k, v in kwargs.items()})
            if policy in ("fp32", "banned"):
                if policy == "banned":
                    run.note_banned(name)
                return op(*[_cast(a, torch.float32) for a in args],
                          **{k: _cast(v, torch.float32) for k, v in kwargs.items()})
            if policy == "promote":
                dtype = _widest(args, kwargs)
                return op(*[_cast(a, dtype) for a in args], **{k: _cast(v, dtype) for k, v in kwargs.items()})
            if not (args and _eligible(args[0])):  # not eligible: the op as called
                return op(*args, **kwargs)
            if policy == "fp32_set_opt_dtype":
                if dtype_at is not None and not dtype_kw_only and dtype_at < len(args):
                    if args[dtype_at] is None:
                        args = (*args[:dtype_at], torch.float32, *args[dtype_at + 1:])
                elif kwargs.get("dtype") is None:
                    kwargs = {**kwargs, "dtype": torch.float32}
                return op(*args, **kwargs)
            if redirect is not None:  # fp32_append_dtype: norm -> norm(..., dtype=float32)
                target, params = redirect
                named = {name: value for (name, value) in params}
                named.update(zip((name for name, _ in params), args[1:]))
                return target(args[0], **{**named, **kwargs, "dtype": torch.float32})
            return op(*[_cast(a, torch.float32) for a in args],
                      **{k: _cast(v, torch.float32) for k, v in kwargs.items()})

    return kernel


def _as_called(run: PolicyRun, name: str, op) -> Any:
    """An op CUDA autocast leaves alone: run in its inputs' dtype, with autocast still on for
    the ops a composite one decomposes into (`cross_entropy_loss` into `log_softmax` and
    `nll_loss`), as a fallthrough would. CPU autocast lists some of these in float32 because the
    CPU has no half kernel for them; those are computed in float32 and their result rounded to
    the half dtype the GPU would have returned."""
    no_half: set[torch.dtype] = set()

    def kernel(keyset, *args, **kwargs):
        below = keyset.remove(_KEY)
        half = next((t.dtype for t in _flat(args, kwargs) if _eligible(t) and t.dtype is not torch.float32), None)
        if half is None:
            return op.redispatch(below, *args, **kwargs)
        if half not in no_half:
            try:
                return op.redispatch(below, *args, **kwargs)
            except (NotImplementedError, RuntimeError) as exc:
                if "not implemented for" not in str(exc):
                    raise
                no_half.add(half)
        run.count("half_in_float32", name)
        out = op.redispatch(below, *[_cast(a, torch.float32) for a in args],
                            **{k: _cast(v, torch.float32) for k, v in kwargs.items()})
        return _round(out, half)

    return kernel


def _flat(args: tuple, kwargs: dict) -> Iterator[Any]:
    for x in (*args, *kwargs.values()):
        if isinstance(x, (list, tuple)):
            yield from x
        else:
            yield x


def _round(out: Any, dtype: torch.dtype) -> Any:
    if isinstance(out, torch.Tensor):
        return out.to(dtype) if out.dtype is torch.float32 else out
    if isinstance(out, (list, tuple)):
        return type(out)(_round(o, dtype) for o in out)
    return out


def _overload(name: str):
    base, _, overload = name.partition(".")
    try:
        return getattr(getattr(torch.ops.aten, base), overload or "default")
    except (AttributeError, RuntimeError):
        return None


class _Installed:
    def __init__(self, run: PolicyRun):
        self.run = run
        self.lib = torch.library.Library("aten", "IMPL")
        registered = set()
        lists = run.lists
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Overriding a previously registered kernel": that is the point
            for policy, names in (*lists.lists.items(), ("banned", BANNED)):
                for name in names:
                    op = _overload(name)
                    if op is None or name in registered:
                        continue
                    self.lib.impl(name, _kernel(run, policy, name, op), "AutocastCPU")
                    registered.add(name)
            # what CPU autocast casts and CUDA's lists do not: left alone, as on a GPU
            for qualified in torch._C._dispatch_get_registrations_for_dispatch_key("AutocastCPU"):
                ns, _, name = qualified.partition("::")
                if ns == "aten" and name not in registered and _overload(name) is not None:
                    self.lib.impl(name, _as_called(run, name, _overload(name)), "AutocastCPU", with_keyset=True)
                    registered.add(name)
        self.registered = len(registered)

    def remove(self) -> None:
        self.lib._destroy()


_state = threading.local()
_installed: list[_Installed] = []  # at most one, process-wide (dispatcher kernels are global)


@contextlib.contextmanager
def autocast_policy(device: torch.device | str, policy: str = "cuda") -> Iterator[PolicyRun | None]:
    """CPU autocast follows CUDA's lists while the block runs on a CPU (`policy` 'cuda'); yields
    the run's record, or None when nothing is emulated (a GPU, or the host's own policy)."""
    policy = check_policy(policy)
    if torch.device(device).type != "cpu" or policy == "host":
        yield None
        return
    if _installed:  # nested (a check inside a traced script...): the outer one serves
        yield _installed[0].run
        return
    installed = install(PolicyRun(cuda_op_lists()))
    try:
        yield installed.run
    finally:
        uninstall(installed)


def install(run: PolicyRun) -> _Installed:
    """Install for the rest of the process (the trace child); `uninstall` puts CPU's lists back."""
    installed = _Installed(run)
    _installed.append(installed)
    return installed


def uninstall(installed: _Installed) -> None:
    installed.remove()
    if installed in _installed:
        _installed.remove(installed)


def describe(run: PolicyRun | None, policy: str = "cuda", device: str = "cpu") -> dict[str, Any]:
    """What a report says about the autocast policy that ran (JSON-safe)."""
    if run is None:
        if str(device).startswith("cpu") or policy == "host":
            return {"policy": "host", "label": LABELS["host"],
                    "note": "CPU autocast's own op lists, as asked: numbers for training on this CPU, not on a GPU"}
        return {"policy": "device", "label": f"{device}'s own autocast policy", "note": None}
    top = sorted(run.ops.items(), key=lambda kv: -kv[1])[:8]
    out: dict[str, Any] = {"policy": "cuda", "label": LABELS["cuda"], "source": run.lists.source,
                           "from_torch": run.lists.from_torch, "calls": dict(sorted(run.calls.items())),
                           "ops": dict(top)}
    fp32 = sum(n for p, n in run.calls.items() if p.startswith("fp32") or p == "banned")
    out["note"] = (f"CPU autocast followed CUDA's op lists, read from {run.lists.source}: "
                   + (f"{fp32} calls of ops CUDA keeps in float32 (exp, pow, sum, softmax, norms, losses) ran in "
                      "float32, as on your GPU" if fp32 else "no op CUDA keeps in float32 was called under autocast")
                   + "; for the CPU's own lists instead (training on CPUs): --autocast-policy host")
    if run.banned:
        out["banned"] = dict(run.banned)
        out["banned_at"] = dict(run.banned_at)
    return out
