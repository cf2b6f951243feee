"""AMP201 dimension-not-aligned: sizes that keep float16/bfloat16 GEMMs off their fast path.

Tensor cores want every GEMM dimension a multiple of 8 half-precision elements (16 bytes), and
the vocabulary projection of a language model a multiple of 64. A misaligned size costs speed,
not correctness, so findings are ranked by how much of the model's work they touch: each
layer's share of forward FLOPs is measured with `torch.utils.flop_counter` on a meta-device
copy of the model (no memory, no compute), falling back to a real CPU forward when a model
cannot run on the meta device.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from ..findings import Finding, Location, Severity
from ..hardware import HALF_MULTIPLE, VOCAB_MULTIPLE, padded_size  # noqa: F401 - tests import padded_size here
from ..workload import Workload
from .results import WARN_SHARE, AlignmentRow  # noqa: F401 - the class crosses to the app torch-free

RULE, NAME = "AMP201", "dimension-not-aligned"
SMALL_HEAD = 64  # a classifier head with fewer outputs is set by the task; padding it gains ~nothing
GROUP_AFTER = 12  # more findings than this: one per distinct pattern, listing its modules
_ATTENTION_OPS = ("bmm", "baddbmm", "scaled_dot_product")  # the seq x seq GEMMs of attention


@dataclass
class AlignmentResult:
    rows: list[AlignmentRow]
    findings: list[Finding]
    summary: dict[str, Any]

    def to_list(self) -> list[dict[str, Any]]:
        """The `alignment` section of the check JSON: one row per checked size."""
        return [r.to_dict() for r in self.rows]


# ---------------------------------------------------------------- measuring FLOPs


@dataclass
class _Trace:
    flops: dict[str, int]  # module name -> forward FLOPs, children included
    total: int
    attention_flops: int
    linear_rows: dict[str, int]  # Linear name -> GEMM rows (batch x tokens) seen in the forward
    head: str | None  # the last Linear whose output is the model's output
    method: str
    gemm_embeddings: frozenset = frozenset()  # Embeddings whose weight is a GEMM operand (a tied head)
    data_layers: frozenset = frozenset()  # Linear/Conv layers fed by the batch (or the first to run)


def _first_tensor(obj: Any) -> torch.Tensor | None:
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        for item in obj:
            t = _first_tensor(item)
            if t is not None:
                return t
    return None


def _to(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to(o, device) for o in obj)
    if isinstance(obj, dict):
        return {k: _to(v, device) for k, v in obj.items()}
    return obj


def _traced_forward(model: nn.Module, inputs: tuple, method: str) -> _Trace:
    linear_rows: dict[str, int] = {}
    order: list[tuple[str, tuple]] = []
    handles = []
    batch_ids = {id(t) for t in inputs if isinstance(t, torch.Tensor)}
    fed: list[str] = []  # Linear/Conv layers in the order they ran; data layers below
    data_layers: set[str] = set()

    def feeds(m, args, name):
        x = _first_tensor(args)
        if not fed or (x is not None and id(x) in batch_ids):
            data_layers.add(name)
        fed.append(name)

    for name, mod in model.named_modules():
        if isinstance(mod, (nn.Linear, nn.modules.conv._ConvNd)):
            handles.append(mod.register_forward_pre_hook(lambda m, args, name=name: feeds(m, args, name)))
        if isinstance(mod, nn.Linear):
            def hook(m, args, out, name=name):
                x = _first_tensor(args)
                if x is not None and m.in_features:
                    linear_rows[name] = x.numel() // m.in_features
                t = _first_tensor(out)
                order.append((name, tuple(t.shape) if t is not None else ()))
            handles.append(mod.register_forward_hook(hook))
    counter = FlopCounterMode(display=False)
    operands = _GemmOperands()
    try:
        with torch.no_grad(), counter, operands:
            out = model(*inputs)
    finally:
        for h in handles:
            h.remove()
    gemm_embeddings = frozenset(name for name, mod in model.named_modules()
                                if isinstance(mod, (nn.Embedding, nn.EmbeddingBag)) and id(mod.weight) in operands.seen)
    prefix = type(model).__name__
    counts = {k: sum(v.values()) for k, v in counter.get_flop_counts().items()}
    flops = {name: counts.get(prefix if not name else f"{prefix}.{name}", 0) for name, _ in model.named_modules()}
    glob = counter.get_flop_counts().get("Global", {})
    attention = sum(v for op, v in glob.items() if any(a in str(op) for a in _ATTENTION_OPS))
    out_t = _first_tensor(out)
    head = None
    if out_t is not None and order and order[-1][1] == tuple(out_t.shape):
        head = order[-1][0]
    return _Trace(flops, counter.get_total_flops(), attention, linear_rows, head, method, gemm_embeddings,
                  frozenset(data_layers))


_GEMMS = {torch.nn.functional.linear, torch.matmul, torch.mm, torch.bmm, torch.addmm, torch.einsum,
          torch.Tensor.matmul, torch.Tensor.__matmul__, torch.Tensor.__rmatmul__, torch.Tensor.mm}


class _GemmOperands(torch.overrides.TorchFunctionMode):
    """Records which tensors (or the tensors they are views of, e.g. `emb.weight.T`) enter a
    GEMM: an embedding table counts as a GEMM size only when its weight does (a tied output
    projection), never for its lookups."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[int] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _GEMMS:
            for a in (*args, *(kwargs or {}).values()):
                if isinstance(a, torch.Tensor):
                    self.seen.add(id(a))
                    if a._base is not None:
                        self.seen.add(id(a._base))
        return func(*args, **(kwargs or {}))


def _trace_once(workload: Workload, method: str, batch_size: int) -> _Trace:
    inputs = workload.batch(torch.device("cpu"), seed=0, batch_size=batch_size)[0]
    if method == "meta":
        with torch.device("meta"):
            model = workload.build_model()
        model, inputs = model.to("meta"), _to(inputs, torch.device("meta"))
    else:
        torch.manual_seed(0)
        model = workload.build_model()
    trace = _traced_forward(model, tuple(inputs), method)
    factor = workload.batch_size / batch_size  # every count here is proportional to the batch
    trace.linear_rows = {n: int(round(r * factor)) for n, r in trace.linear_rows.items()}
    trace.flops = {n: int(round(f * factor)) for n, f in trace.flops.items()}
    trace.total = int(round(trace.total * factor))
    trace.attention_flops = int(round(trace.attention_flops * factor))
    return trace


def _trace(workload: Workload) -> _Trace | None:
    """FLOPs per module from a meta-device forward of a 2-sample batch (scaled to the real
    batch: no memory, no compute); a CPU forward if the model cannot run that way."""
    small = min(2, workload.batch_size)
    attempts = [("meta", small), ("meta", workload.batch_size), ("cpu", small)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for method, batch_size in dict.fromkeys(attempts):
            try:
                return _trace_once(workload, method, batch_size)
            except Exception:  # noqa: BLE001 - ops without meta kernels, batch-size-bound models
                continue
    return None


# ---------------------------------------------------------------- collecting sizes


def _table_in_gemm(name: str, mod: nn.Module, linear_weights: set[int], trace: _Trace | None) -> bool:
    """An embedding's row count shapes a GEMM only when its weight is also an output projection:
    tied to a Linear (which reports it itself: False here) or used in a matmul of the forward.
    Without a trace, only a table of vocabulary size (>= 64 rows) is kept, as a lookup note: a
    2-row token-type table or a 10-row class table never meets a tensor core."""
    if id(mod.weight) in linear_weights:
        return False
    if trace is not None:
        return name in trace.gemm_embeddings
    return mod.num_embeddings >= SMALL_HEAD


def _module_rows(model: nn.Module, trace: _Trace | None = None) -> list[AlignmentRow]:
    vocab = {m.num_embeddings for m in model.modules() if isinstance(m, (nn.Embedding, nn.EmbeddingBag))}
    linear_weights = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    mha = [n for n, m in model.named_modules() if isinstance(m, nn.MultiheadAttention)]
    rows: list[AlignmentRow] = []
    for name, mod in model.named_modules():
        cls = type(mod).__name__
        if any(name.startswith(p + ".") for p in mha):
            continue  # out_proj is reported through its attention module's embed_dim
        if isinstance(mod, nn.Linear):
            rows.append(AlignmentRow(name, cls, "in_features", mod.in_features, HALF_MULTIPLE))
            is_vocab = mod.out_features in vocab and mod.out_features >= SMALL_HEAD
            rows.append(AlignmentRow(name, cls, "out_features (vocab)" if is_vocab else "out_features",
                                     mod.out_features, VOCAB_MULTIPLE if is_vocab else HALF_MULTIPLE))
        elif isinstance(mod, nn.modules.conv._ConvNd):
            if mod.groups > 1 and mod.groups == mod.in_channels:
                continue  # depthwise: no channel GEMM to align
            g = mod.groups
            suffix = "/groups" if g > 1 else ""
            rows.append(AlignmentRow(name, cls, "in_channels" + suffix, mod.in_channels // g, HALF_MULTIPLE))
            rows.append(AlignmentRow(name, cls, "out_channels" + suffix, mod.out_channels // g, HALF_MULTIPLE))
        elif isinstance(mod, (nn.Embedding, nn.EmbeddingBag)):
            if _table_in_gemm(name, mod, linear_weights, trace):
                rows.append(AlignmentRow(name, cls, "num_embeddings (vocab)", mod.num_embeddings, VOCAB_MULTIPLE))
            rows.append(AlignmentRow(name, cls, "embedding_dim", mod.embedding_dim, HALF_MULTIPLE))
        elif isinstance(mod, nn.MultiheadAttention):
            rows.append(AlignmentRow(name, cls, "embed_dim", mod.embed_dim, HALF_MULTIPLE))
            rows.append(AlignmentRow(name, cls, "head_dim", mod.head_dim, HALF_MULTIPLE))
            for dim in ("kdim", "vdim"):
                if getattr(mod, dim) != mod.embed_dim:
                    rows.append(AlignmentRow(name, cls, dim, getattr(mod, dim), HALF_MULTIPLE))
    return rows


def _annotate(rows: list[AlignmentRow], trace: _Trace | None) -> None:
    """FLOP shares, and the notes that make a misaligned size informational only."""
    total = trace.total if trace else 0
    for r in rows:
        if trace is not None and total > 0:
            r.flops_share = trace.flops.get(r.module, 0) / total
        if r.aligned:
            continue
        if r.dimension.startswith(("in_features", "in_channels")) and r.value < HALF_MULTIPLE:
            if trace is None or r.module in trace.data_layers:
                r.note = "few input channels, set by the data; cuDNN pads these itself"
            else:  # a squeeze-excite bottleneck's 4 channels are the model's choice, not the data's
                r.note = (f"a narrow internal layer ({r.value} wide, e.g. a squeeze-excite bottleneck): a sliver "
                          "of the FLOPs, and cuDNN pads it itself")
        elif trace is not None and r.module == trace.head and r.dimension == "out_features" and r.value < SMALL_HEAD:
            r.note = "the model's output size, set by the task; padding it gains little"
        elif r.cls in ("Embedding", "EmbeddingBag") and r.dimension.startswith("num_embeddings") and \
                trace is not None and r.module in trace.gemm_embeddings:
            r.note = "its weight is also the output projection (a GEMM outside any Linear)"
        elif r.cls in ("Embedding", "EmbeddingBag"):
            r.note = "a lookup, not a GEMM"


def _workload_rows(workload: Workload, trace: _Trace | None) -> list[AlignmentRow]:
    rows = []
    total = trace.total if trace else 0
    misaligned_rows = 0
    if trace is not None:
        misaligned_rows = sum(trace.flops.get(n, 0) for n, m in trace.linear_rows.items() if m % HALF_MULTIPLE)
    batch = AlignmentRow("<batch>", "Workload", "batch_size", int(workload.batch_size), HALF_MULTIPLE)
    if trace is not None and total > 0:
        batch.flops_share = misaligned_rows / total if not batch.aligned else 0.0
    if not batch.aligned and trace is not None and trace.linear_rows and not misaligned_rows:
        # batch 4 x 48 tokens = 192 rows: the GEMMs are aligned whatever the batch size
        batch.shapes_gemm = False
        batch.note = (f"every Linear's token dimension (batch x positions, e.g. "
                      f"{next(iter(trace.linear_rows.values()))}) is already a multiple of {HALF_MULTIPLE}")
    rows.append(batch)
    if workload.seq_len:
        seq = AlignmentRow("<batch>", "Workload", "seq_len", int(workload.seq_len), HALF_MULTIPLE)
        if trace is not None and total > 0:
            seq.flops_share = trace.attention_flops / total
        rows.append(seq)
    return rows


# ---------------------------------------------------------------- findings


def _fmt_share(share: float | None) -> str:
    if share is None:
        return "an unknown share of the model's FLOPs"
    return f"{share:.1%} of the model's FLOPs" if share >= 0.001 else "<0.1% of the model's FLOPs"


def _finding(module: str, cls: str, bad: list[AlignmentRow], device: torch.device) -> Finding:
    severity = Severity.WARNING if any(r.significant for r in bad) else Severity.INFO
    share = max((r.flops_share for r in bad if r.flops_share is not None), default=None)
    is_input = module == "<batch>"
    where = "the workload" if is_input else f"{cls} '{module}'"
    sizes = "; ".join(
        f"{r.dimension.split(' ')[0]}={r.value} is not a multiple of {r.multiple} "
        f"(pad to {r.padded}{', ' + r.note if r.note else ''})" for r in bad)
    msg = f"{where}: {sizes}; {'affects' if is_input else 'the layer does'} {_fmt_share(share)}"
    if device.type != "cuda":
        msg += (f"; measured for {device.type.upper()}, where alignment matters less "
                "than on GPU tensor cores")
    if is_input:
        suggestion = ("Use a batch size (and sequence length) that is a multiple of 8 so the "
                      "token dimension of every GEMM fills tensor-core tiles.")
    else:
        suggestion = ("Pad these sizes to the value shown (extra features/channels/vocab rows that "
                      "are never used cost far less than an unaligned GEMM).")
    data = {"check": "alignment", "class": cls, "flops_share": share,
            "dimensions": [r.to_dict() for r in bad]}
    return Finding(RULE, NAME, severity, msg, suggestion,
                   Location(module=None if is_input else module), precision=None, data=data)


def _group(findings: list[Finding]) -> list[Finding]:
    """Many modules with the same misalignment (a repeated block): one finding per pattern."""
    if len(findings) <= GROUP_AFTER:
        return findings
    groups: dict[tuple, list[Finding]] = {}
    for f in findings:
        key = (f.data["class"], tuple((d["dimension"], d["value"]) for d in f.data["dimensions"]))
        groups.setdefault(key, []).append(f)
    out = []
    for fs in groups.values():
        first = fs[0]
        if len(fs) == 1:
            out.append(first)
            continue
        modules = [f.location.module for f in fs]
        severity = max((f.severity for f in fs), key=lambda s: s.rank)
        share = sum(f.data["flops_share"] or 0.0 for f in fs)
        data = dict(first.data, modules=modules, flops_share=share)
        msg = f"{first.message} [and {len(fs) - 1} more module(s) like it: {_fmt_share(share)} in all]"
        out.append(Finding(RULE, NAME, severity, msg, first.suggestion, first.location, None, data))
    return out


def check_alignment(workload: Workload, device: torch.device | str = "cpu",
                    model: nn.Module | None = None) -> AlignmentResult:
    """Every GEMM-shaping size of the model and workload against the tensor-core multiples.

    `model` is only read for its sizes (a fresh one is built when not given).
    """
    device = torch.device(device)
    trace = _trace(workload)
    if model is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                with torch.device("meta"):
                    model = workload.build_model()
            except Exception:  # noqa: BLE001 - fall back to a real (CPU) build
                model = workload.build_model()
    rows = _module_rows(model, trace)
    _annotate(rows, trace)
    rows += _workload_rows(workload, trace)
    by_module: dict[str, list[AlignmentRow]] = {}
    for r in rows:
        if not r.aligned and r.shapes_gemm:
            by_module.setdefault(r.module, []).append(r)
    findings = [_finding(m, bad[0].cls, bad, device) for m, bad in by_module.items()]
    findings = _group(findings)
    significant = {r.module for r in rows if r.significant}
    affected = sum(trace.flops.get(m, 0) for m in significant if m != "<batch>") if trace else 0
    summary = {
        "device": str(device),
        "flops_method": trace.method if trace else None,
        "forward_flops": trace.total if trace else None,
        "misaligned_flops_share": (affected / trace.total) if trace and trace.total else None,
        "checked": len(rows),
        "misaligned": sum(not r.aligned for r in rows),
        "note": None if device.type == "cuda" else
        "measured without a GPU: alignment mostly matters for GPU tensor cores",
    }
    return AlignmentResult(rows, findings, summary)
