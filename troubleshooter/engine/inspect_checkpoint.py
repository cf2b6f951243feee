"""Look inside a training checkpoint without running anything from it.

Loaded with `torch.load(weights_only=True)` (memory-mapped where the format allows), so a file
that needs code unpickled is refused rather than executed. Answers what a person resuming or
converting a run needs to know: which dtypes the tensors are, whether the model weights are
half-precision only (no float32 master copy: AMP124), whether the GradScaler, optimizer and
scheduler state are there for a faithful resume (AMP110 scaler, AMP211 scheduler), and whether the saved loss scale says
the model overflows float16 (AMP202).
"""
from __future__ import annotations

import math
import os
import pickle
import re
import zipfile
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from ..errors import UserError
from ..findings import Finding, Location, Severity
from ..units import format_bytes

HALF = (torch.float16, torch.bfloat16)
MODEL_KEYS = ("model", "state_dict", "model_state_dict", "model_state", "net", "network", "module",
              "weights", "params")
SCALER_KEYS = ("scaler", "grad_scaler", "scaler_state_dict", "amp_scaler", "loss_scaler", "amp")
STEP_KEYS = ("step", "global_step", "iter_num", "iteration", "iter", "epoch", "num_updates")
FLAG_KEYS = ("amp", "use_amp", "fp16", "use_fp16", "half", "bf16", "use_bf16", "mixed_precision",
             "precision", "dtype", "amp_dtype")
MAX_DEPTH = 4


@dataclass
class InspectReport:
    path: str
    facts: dict[str, Any]
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, **self.facts, "notes": list(self.notes),
                "findings": [f.to_dict() for f in self.findings]}

    def to_text(self) -> str:
        f = self.facts
        lines = [f"{self.path}: {f['layout'].replace('_', ' ')} ({format_bytes(f['size_bytes'])})"]
        if f.get("top_level_keys"):
            lines.append(f"  keys: {', '.join(f['top_level_keys'])}")
        for m in f["models"]:
            lines.append(f"  model weights at {m['key'] or '<top level>'}: {m['tensors']} tensors, "
                         f"{m['elements']:,} elements, {_dtypes_text(m['dtypes'])}"
                         + (" — half precision only" if m["half_only"] else ""))
        opt = f["optimizer"]
        lines.append("  optimizer state: " + (f"yes at {opt['key'] or '<top level>'} ({opt['param_groups']} param group(s), "
                                                 f"{_dtypes_text(opt['dtypes']) or 'no tensors'})"
                                                 if opt["present"] else "no"))
        sc = f["scaler"]
        if sc["present"]:
            lines.append(f"  GradScaler state: yes at {sc['key'] or '<top level>'}" + _scaler_text(sc))
        else:
            lines.append("  GradScaler state: no")
        sch = f["scheduler"]
        lines.append("  LR scheduler state: " + (f"yes at {sch['key'] or '<top level>'} (last_epoch {sch.get('last_epoch')})"
                                                 if sch["present"] else "no"))
        if f["step"]:
            lines.append(f"  step: {f['step']['key']} = {f['step']['value']}")
        if f["precision_flags"]:
            lines.append("  precision settings: " + ", ".join(f"{k}={v!r}" for k, v in f["precision_flags"].items()))
        lines.append(f"  all tensors: {_dtypes_text(f['dtypes']) or 'none'}")
        for note in self.notes:
            lines.append(f"  note: {note}")
        for finding in self.findings:
            lines.append(f"  {finding.text_line()}")
        return "\n".join(lines) + "\n"


def _scaler_text(sc: dict) -> str:
    if sc.get("scale") is None:
        return " (empty: the scaler was disabled)"
    if sc.get("format") == "apex":
        return f" (apex.amp's loss scaler: scale {sc['scale']:g})"
    if sc.get("format") == "scale only":
        return (f" (the scale only: {sc['scale']:g}; without the growth tracker a resumed run restarts its "
                "growth count, which is harmless)")
    tracker = sc.get("growth_tracker")
    return f" (scale {sc['scale']:g}, growth tracker {int(tracker) if tracker is not None else None})"


def _dtypes_text(d: dict) -> str:
    return ", ".join(f"{k} x{v['tensors']}" for k, v in d.items())


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


# --- loading ----------------------------------------------------------------------------------

def _load(path: str) -> tuple[Any, str]:
    if not os.path.exists(path):
        raise UserError(f"checkpoint not found: {path}")
    if os.path.isdir(path):
        raise UserError(f"{path} is a directory; give a checkpoint file (e.g. ckpt.pt). Sharded/distributed "
                        "checkpoint folders are not supported")
    with open(path, "rb") as fh:
        head = fh.read(9)
    if _looks_like_safetensors(head):
        return _read_safetensors(path), "safetensors"
    if head[:2] == b"PK" and zipfile.is_zipfile(path):
        fmt = "zip"
    elif head[:1] == b"\x80":
        fmt = "legacy"
    else:
        raise UserError(f"{path} is not a PyTorch checkpoint (neither a torch.save file nor safetensors)")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=(fmt == "zip"))
    except pickle.UnpicklingError as exc:
        text = str(exc)
        m = re.search(r"GLOBAL ([\w.]+)", text) or re.search(r"Unsupported global: ([\w.]+)", text)
        what = f" (it references {m.group(1)})" if m else ""
        raise UserError(
            f"refused: {path} needs code to be unpickled{what}; this tool only loads checkpoints with "
            "torch.load(weights_only=True) and never runs code from a file. Re-save it with plain "
            "state_dict()s: torch.save({'model': model.state_dict(), 'optimizer': optimizer.state_dict(), "
            "'scaler': scaler.state_dict()}, path)") from None
    except Exception as exc:  # noqa: BLE001 - corrupt or foreign file
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(f"{path} could not be read as a PyTorch checkpoint: {first}") from None
    return obj, fmt


_ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
              "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
              "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}


def _looks_like_safetensors(head: bytes) -> bool:
    """safetensors: an 8-byte little-endian header length, then a JSON header starting with '{'."""
    return len(head) == 9 and head[8:9] == b"{" and 2 <= int.from_bytes(head[:8], "little") < 100_000_000


def _read_safetensors(path: str) -> dict:
    """The tensors as empty `meta` tensors of the right dtype and shape: the header is all we need,
    and reading it runs nothing. The header is checked against the file (each tensor's byte range
    must lie in it and match its shape and dtype), so a header claiming 10^10 elements in a file
    of a few bytes is refused instead of reported."""
    from ..bounded import InputRefused, load_json

    file_size = os.path.getsize(path)
    with open(path, "rb") as fh:
        size = int.from_bytes(fh.read(8), "little")
        if 8 + size > file_size:
            raise UserError(f"{path}: the safetensors header claims {size:,} bytes, more than the file holds")
        try:
            header = load_json(fh.read(size).decode("utf-8"), "the safetensors header")
        except (ValueError, UnicodeDecodeError):
            raise UserError(f"{path}: the safetensors header is not valid JSON") from None
        except InputRefused as exc:
            raise UserError(f"{path}: {exc}") from None
    if not isinstance(header, dict):
        raise UserError(f"{path}: the safetensors header is not a JSON object")
    data_size = file_size - 8 - size
    out = {}
    for name, info in header.items():
        if name == "__metadata__" or not isinstance(info, dict):
            continue
        dtype = _ST_DTYPES.get(str(info.get("dtype")))
        if dtype is None:
            raise UserError(f"{path}: tensor {name} has an unknown safetensors dtype {info.get('dtype')!r}")
        shape = info.get("shape") if info.get("shape") is not None else []
        offsets = info.get("data_offsets")
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                  for d in shape):
            raise UserError(f"{path}: tensor {name} has a malformed shape in the safetensors header")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)
                and 0 <= offsets[0] <= offsets[1] <= data_size):
            raise UserError(f"{path}: tensor {name}'s data_offsets {offsets!r} do not lie within the file's "
                            f"{data_size:,} bytes of tensor data: the header does not describe this file")
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        if nbytes != offsets[1] - offsets[0]:
            raise UserError(f"{path}: tensor {name} claims shape {shape} ({math.prod(shape):,} elements, "
                            f"{nbytes:,} bytes) but its data in the file is {offsets[1] - offsets[0]:,} bytes: "
                            "the header does not describe this file")
        out[name] = torch.empty(tuple(shape), dtype=dtype, device="meta")
    return out


# --- walking the structure ----------------------------------------------------------------------

def _is_tensor_map(d: Any) -> bool:
    return isinstance(d, dict) and len(d) > 0 and all(isinstance(v, torch.Tensor) for v in d.values())


def _is_optimizer(d: Any) -> bool:
    return isinstance(d, dict) and "state" in d and "param_groups" in d


def _is_scaler(d: Any) -> bool:
    return isinstance(d, dict) and "scale" in d and ("growth_factor" in d or "_growth_tracker" in d)


def _scalar(v: Any) -> float | None:
    if isinstance(v, torch.Tensor):
        return float(v) if v.numel() == 1 and v.is_floating_point() else None
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _scaler_format(path: tuple, d: Any) -> str | None:
    """How a loss scaler's state was saved, or None when `d` is not one: 'torch'
    (GradScaler.state_dict()), 'apex' (apex.amp.state_dict(): {'loss_scaler0': {'loss_scale',
    'unskipped'}}), or 'scale only' (a scaler key holding just the scale, as hand-written
    checkpoints do)."""
    if _is_scaler(d):
        return "torch"
    if not isinstance(d, dict) or not d:
        return None
    if all(re.fullmatch(r"loss_scaler\d+", str(k)) and isinstance(v, dict) and _scalar(v.get("loss_scale")) is not None
           for k, v in d.items()):
        return "apex"
    scale = d.get("scale", d.get("loss_scale"))
    if (path and path[-1].lower() in SCALER_KEYS and _scalar(scale) is not None
            and set(d) <= {"scale", "loss_scale", "_growth_tracker", "growth_tracker"}):
        return "scale only"
    return None


def _saved_scale(fmt: str, d: dict) -> float | None:
    if fmt == "apex":
        return _scalar(d[sorted(d)[0]].get("loss_scale"))
    return _scalar(d.get("scale", d.get("loss_scale")))


def _is_scheduler(d: Any) -> bool:
    return isinstance(d, dict) and "last_epoch" in d and any(k in d for k in ("base_lrs", "_step_count", "_last_lr"))


def _walk(obj: Any, path: tuple = (), depth: int = 0) -> Iterator[tuple[tuple, Any]]:
    yield path, obj
    if (depth >= MAX_DEPTH or _is_tensor_map(obj) or _is_optimizer(obj) or _scaler_format(path, obj)
            or _is_scheduler(obj)):
        return
    if isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(v, (dict, list, tuple)):
                yield from _walk(v, path + (str(k),), depth + 1)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj[:32]):
            if isinstance(v, (dict, list, tuple)):
                yield from _walk(v, path + (str(i),), depth + 1)


def _tensors(obj: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth < 8 and isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v, depth + 1)
    elif depth < 8 and isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v, depth + 1)


def _dtype_counts(tensors) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for t in tensors:
        entry = out.setdefault(_dtype_name(t.dtype), {"tensors": 0, "elements": 0})
        entry["tensors"] += 1
        entry["elements"] += t.numel()
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["elements"]))


def _flags(obj: Any, depth: int = 0, out: dict | None = None) -> dict[str, Any]:
    """Scalar settings that say which precision the run used (amp, fp16, dtype, ...)."""
    out = {} if out is None else out
    if depth > MAX_DEPTH or not isinstance(obj, dict) or _is_tensor_map(obj) or _is_optimizer(obj):
        return out
    for k, v in obj.items():
        key = str(k)
        if key.lower() in FLAG_KEYS and isinstance(v, (bool, str, int)) and key not in out:
            out[key] = v
        elif isinstance(v, dict):
            _flags(v, depth + 1, out)
    return out


def _precision_evidence(flags: dict) -> str | None:
    """'fp16', 'bf16', 'amp' (enabled, dtype unknown) or None, from the run's saved settings."""
    evidence = None
    for key, value in flags.items():
        key = key.lower()
        text = str(value).lower()
        if key in ("bf16", "use_bf16") and value is True or "bf16" in text or "bfloat16" in text:
            return "bf16"
        if key in ("fp16", "use_fp16", "half") and value is True:
            evidence = "fp16"
        elif key in ("dtype", "precision", "mixed_precision", "amp_dtype") and (
                "float16" in text or "fp16" in text or text in ("16", "16-mixed", "half")):
            evidence = "fp16"
        elif key in ("amp", "use_amp") and value is True and evidence is None:
            evidence = "amp"
    return evidence


def _label(path: tuple) -> str:
    return ".".join(path)


# --- the report ------------------------------------------------------------------------------

def _finding(rule, name, severity, message, suggestion, path, **data) -> Finding:
    return Finding(rule, name, severity, message, suggestion, Location(path=path), data=data)


def inspect_checkpoint(path: str | os.PathLike) -> InspectReport:
    path = os.fspath(path)
    obj, fmt = _load(path)
    if isinstance(obj, torch.Tensor):
        raise UserError(f"{path} holds a single tensor, not a checkpoint (expected a state_dict or a dict "
                        "with model/optimizer state)")
    all_tensors = list(_tensors(obj))
    nodes = list(_walk(obj))
    scalers = [(p, d, kind) for p, d in nodes if (kind := _scaler_format(p, d))]
    if not all_tensors and not (scalers or any(_is_scheduler(d) or _is_optimizer(d) for _, d in nodes)):
        raise UserError(f"{path} contains no tensors: it is not a model checkpoint")

    scaler_ids = {id(d) for _, d, _ in scalers}
    maps = [(p, d) for p, d in nodes if _is_tensor_map(d) and id(d) not in scaler_ids]
    optimizers = [(p, d) for p, d in nodes if _is_optimizer(d)]
    disabled_scalers = [(p, d) for p, d in nodes
                        if isinstance(d, dict) and not d and p and p[-1].lower() in SCALER_KEYS]
    schedulers = [(p, d) for p, d in nodes if _is_scheduler(d)]

    def is_model_key(p):
        return bool(p) and p[-1].lower() in MODEL_KEYS

    maps.sort(key=lambda pd: (not is_model_key(pd[0]), -sum(t.numel() for t in pd[1].values())))
    models = []
    for p, d in maps:
        floats = [t for t in d.values() if t.is_floating_point()]
        models.append({
            "key": _label(p) or None, "tensors": len(d), "elements": sum(t.numel() for t in d.values()),
            "dtypes": _dtype_counts(d.values()),
            "half_only": bool(floats) and all(t.dtype in HALF for t in floats),
            "half_dtype": _dtype_name(floats[0].dtype) if floats and floats[0].dtype in HALF else None,
        })
    optimizer = {"present": bool(optimizers)}
    if optimizers:
        p, d = optimizers[0]
        groups = d.get("param_groups") or []
        state = d.get("state") or {}
        keys = sorted({k for s in state.values() if isinstance(s, dict) for k in s})
        optimizer.update({"key": _label(p) or None, "count": len(optimizers), "param_groups": len(groups),
                          "lr": [g.get("lr") for g in groups if isinstance(g, dict)][:4],
                          "state_keys": keys, "dtypes": _dtype_counts(_tensors(state)),
                          "empty_state": not state})
    scaler: dict[str, Any] = {"present": bool(scalers or disabled_scalers)}
    if scalers:
        p, d, kind = scalers[0]
        tracker = d.get("_growth_tracker", d.get("growth_tracker"))
        scaler.update({"key": _label(p), "format": kind, "scale": _saved_scale(kind, d),
                       "growth_tracker": tracker if tracker is None or isinstance(tracker, int) else _scalar(tracker),
                       "growth_factor": d.get("growth_factor"),
                       "backoff_factor": d.get("backoff_factor"), "growth_interval": d.get("growth_interval")})
    elif disabled_scalers:
        scaler.update({"key": _label(disabled_scalers[0][0]), "scale": None, "enabled": False})
    scheduler: dict[str, Any] = {"present": bool(schedulers)}
    if schedulers:
        p, d = schedulers[0]
        scheduler.update({"key": _label(p), "last_epoch": d.get("last_epoch"), "last_lr": d.get("_last_lr")})
    step = None
    if isinstance(obj, dict):
        for key in obj:
            if str(key).lower() in STEP_KEYS and isinstance(obj[key], (int, float)) and not isinstance(obj[key], bool):
                step = {"key": str(key), "value": obj[key]}
                break
    flags = _flags(obj)
    evidence = _precision_evidence(flags)
    layout = ("state_dict" if _is_tensor_map(obj) else
              "training_checkpoint" if optimizers and models else
              "weights_checkpoint" if models else
              "optimizer_state" if optimizers else
              "scaler_state" if scalers else
              "scheduler_state" if schedulers else "other")
    facts = {
        "size_bytes": os.path.getsize(path), "format": fmt, "layout": layout,
        "top_level_keys": [str(k) for k in obj][:40] if isinstance(obj, dict) and layout != "state_dict" else [],
        "models": models, "optimizer": optimizer, "scaler": scaler, "scheduler": scheduler, "step": step,
        "precision_flags": flags, "precision_evidence": evidence, "dtypes": _dtype_counts(all_tensors),
    }
    report = InspectReport(path, facts)
    _judge(report, models, optimizer, scaler, scheduler, step, evidence)
    return report


def _judge(report: InspectReport, models, optimizer, scaler, scheduler, step, evidence) -> None:
    path = report.path
    half_models = [m for m in models if m["half_only"]]
    training = optimizer["present"] and bool(models)
    if not models:
        report.notes.append("no model weights in this file: it holds only training state (like the separate "
                            "optimizer.pt / scaler.pt / scheduler.pt files some trainers write)")
    if half_models:
        where = ", ".join(m["key"] or "<top level>" for m in half_models)
        dtype = half_models[0]["half_dtype"]
        if training:
            report.findings.append(_finding(
                "AMP124", "half-checkpoint", Severity.WARNING,
                f"the model weights ({where}) are {dtype} only, with no float32 master copy, in a training "
                "checkpoint: resuming trains half-precision weights, whose small updates round away",
                "keep the model in float32 and use torch.autocast for mixed precision; to rescue this run, "
                "load the weights into a float32 model (model.float()) before resuming",
                path, models=[m["key"] for m in half_models], dtype=dtype))
        else:
            report.findings.append(_finding(
                "AMP124", "half-checkpoint", Severity.INFO,
                f"the model weights ({where}) are {dtype} only: fine for inference, but training from them "
                "has no float32 master weights",
                "load into a float32 model (model.float()) before fine-tuning", path,
                models=[m["key"] for m in half_models], dtype=dtype))
    if scaler.get("scale") is not None:
        scale = scaler["scale"]
        if not scale == scale or scale in (float("inf"), float("-inf")) or scale <= 0:
            report.findings.append(_finding(
                "AMP202", "fp16-overflow", Severity.ERROR,
                f"the saved GradScaler scale is {scale}: the scaler state is corrupt",
                "discard the scaler state on resume (a fresh GradScaler) and look for the non-finite values "
                "with `python -m troubleshooter check`", path, scale=scale))
        elif scale < 1.0:
            report.findings.append(_finding(
                "AMP202", "fp16-overflow", Severity.WARNING,
                f"the saved GradScaler scale is {scale:g} (< 1): gradients overflow float16 even without "
                "scaling, so most fp16 steps were being skipped",
                "train in bf16 if the GPU supports it; otherwise find the overflowing layer with "
                "`python -m troubleshooter check` (nan/headroom) and keep it in float32", path, scale=scale))
    if training and not scaler["present"]:
        fp16_run = bool(half_models) and half_models[0]["half_dtype"] == "float16" or evidence in ("fp16", "amp")
        if evidence == "bf16":
            pass  # bf16 needs no GradScaler
        elif fp16_run:
            why = (f"the run's settings say {evidence}" if evidence in ("fp16", "amp") else "the weights are float16")
            report.findings.append(_finding(
                "AMP110", "checkpoint-missing-scaler-state", Severity.WARNING,
                f"a training checkpoint (model + optimizer state) without GradScaler state although {why}: "
                "a resumed run restarts the loss scale at its initial value and skips steps recalibrating",
                "save scaler.state_dict() with the checkpoint and restore it with scaler.load_state_dict()",
                path, evidence=evidence))
        else:
            report.findings.append(_finding(
                "AMP110", "checkpoint-missing-scaler-state", Severity.INFO,
                "no GradScaler state in this training checkpoint: if the run used fp16 with a GradScaler, "
                "its loss scale is lost on resume (fp32 and bf16 runs need none)",
                "save scaler.state_dict() beside the optimizer state when training in fp16", path,
                evidence=evidence))
    if training and not scheduler["present"]:
        report.findings.append(_finding(
            "AMP211", "checkpoint-missing-scheduler-state", Severity.INFO,
            "no LR scheduler state: if the run used a scheduler, a resumed run restarts its schedule",
            "save scheduler.state_dict() too (or derive the LR from the saved step)", path))
    if training and optimizer.get("empty_state"):
        report.notes.append("the optimizer state is empty (saved before the first step): moments start from zero")
    if not training and models:
        report.notes.append("weights only: no optimizer state, so training cannot be resumed exactly "
                            "(fine for inference or fine-tuning)")
    if training and step is None:
        report.notes.append("no step/iteration counter found at the top level")
    opt_half = [k for k in optimizer.get("dtypes", {}) if k in ("float16", "bfloat16")]
    if opt_half:
        report.notes.append(f"optimizer state holds {', '.join(opt_half)} tensors: moments in half precision "
                            "lose small updates")
