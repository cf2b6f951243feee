"""Headroom: how close an fp32 training step comes to float16's limits, measured not guessed.

One fp32 reference step with forward hooks gives the largest |activation| of every module
against float16's maximum (65504), in bits of headroom (AMP202 fp16-overflow when negative);
its parameter gradients, histogrammed by binary exponent, give the share that float16 would
flush to zero (< 2**-24) or hold only as subnormals (< 2**-14) without loss scaling, and the
loss-scale window that keeps them (AMP203 fp16-gradient-underflow); forward passes of the same
weights under fp16 and bf16 autocast give their relative error against fp32 (AMP210
bf16-precision-loss). All reductions stay on the device; the host syncs once at the end.
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..findings import Finding, Location, Severity
from ..workload import Workload
from . import precision as prec
from . import scaled_grads
from .budget import expected_step_s, fits
from .training_step import build
from .module_kind import overflow_fix
from .results import FP16_MAX, HeadroomResult  # noqa: F401 - the class crosses to the app torch-free

FLUSH_EXP = -24  # |g| < 2**-24: below float16's smallest subnormal -> 0
SUBNORMAL_EXP = -14  # |g| < 2**-14: float16 subnormal, precision lost
_LO, _HI = -150, 130  # binary exponents of float32 (subnormals included) .. beyond its max
_BINS = _HI - _LO
SCALE_COVERS = 0.999  # the loss scale keeps this share of nonzero gradients from flushing to zero
FLUSH_WARN = 0.05  # a module losing >= 5% of its gradient elements to zero is broken in fp16
SUBNORMAL_INFO = 0.25
NEAR_OVERFLOW_BITS = 1.0
BF16_WARN, BF16_INFO = 0.10, 0.02  # relative error of the loss (or output) against fp32
DEFAULT_SCALE = scaled_grads.DEFAULT_SCALE  # GradScaler's init_scale
LOST_WARN = 0.01  # the default scaler zeroes >= 1% of the model's nonzero gradient elements: AMP203 warning
MODULE_LOST_WARN = 0.05  # ... or >= 5% of one module's
LOST_OK = 0.001  # a suggested scale must keep all but 0.1% (the default loses ~0.01% on harmless models)
SCALE_TRIES = 3
ERROR_WARN = 0.02  # relative gradient error the default scale adds over a larger scale's
_CHUNK = 1 << 24


# ---------------------------------------------------------------- device-side reductions


def _tensors(obj: Any):
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point():
            yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


def _absmax(obj: Any) -> torch.Tensor | None:
    """Largest |x| over every floating tensor in obj, as a 0-d float32 device tensor (no sync)."""
    vals = [t.detach().abs().amax().float() for t in _tensors(obj) if t.numel()]
    if not vals:
        return None
    return torch.stack(vals).amax() if len(vals) > 1 else vals[0]


def exponent_histogram(grads: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """int64 counts of floor(log2|g|) over [-150, 130) for nonzero finite g, plus two extra
    slots: [_BINS] = exact zeros, [_BINS + 1] = non-finite. Exact counts, no sync."""
    hist = torch.zeros(_BINS + 2, dtype=torch.int64, device=device)
    chunks = (c for g in grads for c in g.detach().flatten().split(_CHUNK))
    for c in chunks:  # bounded temporaries (int64 indices) even for an embedding's gradient
        a = c.abs().float()
        finite = torch.isfinite(a)
        nonzero = a > 0
        exp = torch.floor(torch.log2(torch.where(nonzero & finite, a, torch.ones_like(a))))
        idx = (exp.clamp(_LO, _HI - 1) - _LO).long()
        idx = torch.where(finite, torch.where(nonzero, idx, torch.full_like(idx, _BINS)),
                          torch.full_like(idx, _BINS + 1))
        hist += torch.bincount(idx, minlength=_BINS + 2)
    return hist


def _share_below(hist: list[int], exp: int) -> tuple[int, int]:
    """(nonzero finite count, count with |g| < 2**exp) from an exponent histogram."""
    counts = hist[:_BINS]
    return sum(counts), sum(counts[: exp - _LO])


def _scale_window(hist: list[int], max_abs: float) -> dict[str, Any]:
    """Smallest power-of-two loss scale that lifts SCALE_COVERS of the nonzero gradients to
    >= 2**-24 (below it float16 flushes them to zero; subnormals only lose digits), and the
    largest that keeps the biggest gradient below 65504."""
    counts = hist[:_BINS]
    total = sum(counts)
    if total == 0:
        return {"min_loss_scale": None, "max_loss_scale": None, "fits": None}
    allowed_below = total * (1 - SCALE_COVERS)
    acc, low_exp = 0, _LO
    for i, c in enumerate(counts):
        if acc + c > allowed_below:
            low_exp = _LO + i  # the covered gradients are all >= 2**low_exp
            break
        acc += c
    min_scale = 2.0 ** max(0, FLUSH_EXP - low_exp)
    max_scale = 2.0 ** math.floor(math.log2(FP16_MAX / max_abs)) if max_abs > 0 and math.isfinite(max_abs) else None
    fits = None if max_scale is None else min_scale <= max_scale
    return {"min_loss_scale": min_scale, "max_loss_scale": max_scale, "fits": fits,
            "scale_covers": SCALE_COVERS}


def _rel_error(value: torch.Tensor | None, ref: torch.Tensor | None) -> torch.Tensor | None:
    if value is None or ref is None or value.shape != ref.shape:
        return None
    ref = ref.detach().float()
    diff = (value.detach().float() - ref).norm()
    return diff / ref.norm().clamp_min(torch.finfo(torch.float32).tiny)


# ---------------------------------------------------------------- the reference step


def _first_output(obj: Any) -> torch.Tensor | None:
    return next(iter(_tensors(obj)), None)


def _seeded_forward(workload: Workload, model: nn.Module, batch, seed: int):
    torch.manual_seed(seed)  # same dropout masks in every precision
    inputs, target = batch
    out = model(*inputs)
    return out, workload.loss_fn(out, target) * workload.loss_weight


def measure(workload: Workload, device: torch.device, seed: int = 0, deadline: float | None = None,
            progress=None) -> dict[str, Any]:
    """Raw measurements (host values) of the reference step and the half-precision forwards."""
    def say(fraction: float, message: str) -> None:
        if progress is not None:
            progress(fraction, f"headroom: {message}")

    say(0.0, "fp32 reference step with hooks")
    model, _ = build(workload, device, seed)
    batch = workload.batch(device, seed=seed)
    names = {m: n for n, m in model.named_modules()}
    leaves = {n: not any(True for _ in m.children()) for n, m in model.named_modules()}
    act: dict[str, list[torch.Tensor]] = {}
    act_in: dict[str, list[torch.Tensor]] = {}
    order: list[str] = []
    classes: dict[str, str] = {}
    zero = torch.zeros((), device=device)

    def hook(mod, args, out):
        name = names[mod]
        m = _absmax(out)
        if m is None:
            return
        if name not in act:
            act[name], act_in[name] = [], []
            order.append(name)
            classes[name] = type(mod).__name__
        act[name].append(m)
        m_in = _absmax(args)
        act_in[name].append(zero if m_in is None else m_in)

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    try:
        out32, loss32 = _seeded_forward(workload, model, batch, seed)
    finally:
        for h in handles:
            h.remove()
    loss32.backward()
    owners = [(n, m) for n, m in model.named_modules() if any(True for _ in m.parameters(recurse=False))]
    ref_grads = scaled_grads.reference_grads(owners)
    grad_hists, grad_max = [], []
    zero = torch.zeros((), device=device)
    for n, m in owners:
        grads = [p.grad for p in m.parameters(recurse=False) if p.grad is not None]
        grad_hists.append(exponent_histogram(grads, device))
        finite_max = [torch.where(torch.isfinite(g), g.detach().abs(), 0).amax().float() for g in grads if g.numel()]
        grad_max.append(torch.stack(finite_max).amax() if finite_max else zero)
    device_vals: dict[str, Any] = {
        "act": [torch.stack(act[n]).amax() for n in order],
        "act_in": [torch.stack(act_in[n]).amax() for n in order],
        "grad_hist": torch.stack(grad_hists) if grad_hists else torch.zeros(0, _BINS + 2, device=device),
        "grad_max": torch.stack(grad_max) if grad_max else torch.zeros(0, device=device),
        "loss32": loss32.detach().float(),
        "input_max": _absmax(batch[0]),
    }
    errors: dict[str, str] = {}
    rel: dict[str, dict[str, torch.Tensor | None]] = {}
    half_out: dict[str, bool] = {}  # module -> its output is float16 under fp16 autocast

    def dtype_hook(mod, args, out):
        t = _first_output(out)
        if t is not None:
            half_out.setdefault(names[mod], t.dtype == torch.float16)

    with torch.no_grad():
        for i, p in enumerate(("fp16", "bf16")):
            say(0.3 + 0.1 * i, f"{p} forward")
            handles = [m.register_forward_hook(dtype_hook) for m in model.modules()] if p == "fp16" else []
            try:
                with prec.autocast(p, device):
                    out_p, loss_p = _seeded_forward(workload, model, batch, seed)
                rel[p] = {"output": _rel_error(_first_output(out_p), _first_output(out32)),
                          "loss": _rel_error(loss_p.reshape(()), loss32.reshape(())),
                          "loss_value": loss_p.detach().float()}
            except Exception as exc:  # noqa: BLE001 - an op without a half kernel on this device
                errors[p] = f"{type(exc).__name__}: {exc}"
            finally:
                for h in handles:
                    h.remove()
    device_vals["rel"] = rel
    host = _to_host(device_vals)  # the one host sync of the reference measurements
    host["scaled"] = (None if not fits(deadline, expected_step_s("fp16")) else
                      _scaled_steps(workload, model, batch, seed, owners, ref_grads, device, host, deadline,
                                    on_step=lambda n, scale: say(min(0.95, 0.5 + 0.1 * n), f"fp16 GradScaler step "
                                                                 f"{n + 1} at scale {scale:g}")))
    say(1.0, "done")
    del model, out32, loss32, batch, ref_grads
    host.update(order=order, classes=classes, leaves=leaves, owners=[(n, type(m).__name__) for n, m in owners],
                param_counts=[sum(p.numel() for p in m.parameters(recurse=False)) for _, m in owners],
                errors=errors, half_out=half_out if "fp16" not in errors else None)
    return host


def _scaled_steps(workload: Workload, model: nn.Module, batch, seed: int, owners, ref_grads,
                  device: torch.device, host: dict[str, Any], deadline: float | None = None,
                  on_step=None) -> dict[str, Any]:
    """Real fp16 steps: at GradScaler's default scale; at the scale the fp32 gradients call for
    when that is larger (to tell lost digits from fp16's own rounding); and, when the default
    loses gradients, at larger scales (x16, up to SCALE_TRIES) until one keeps them."""
    taken = [0]

    def step_at(scale):
        if on_step is not None:
            on_step(taken[0], scale)
        taken[0] += 1
        return scaled_grads.scaled_fp16_step(model, owners, ref_grads, loss_of, device, scale)

    def loss_of():
        return _seeded_forward(workload, model, batch, seed)[1]

    default = step_at(DEFAULT_SCALE)
    out: dict[str, Any] = {"default": _step_dict(default)}
    if default.scale is None:
        return out
    total_hist = [sum(col) for col in zip(*host["grad_hist"])]
    candidate = max(default.scale * 2, _flush_floor(total_hist))
    if not fits(deadline, expected_step_s("fp16")):
        out["default"]["cut_by_budget"] = True
        return out
    higher = step_at(candidate) if _flush_floor(total_hist) > default.scale else None
    why = []
    if _loses(default.lost, default.nonzero):
        why.append("lost")
    if higher is not None and higher.scale is not None and not higher.backoffs and \
            _degraded(default.relative_error, higher.relative_error):
        why.append("gradient_error")
    out["default"]["loses_gradients"] = bool(why)
    out["default"]["why"] = why
    if higher is not None:
        out["default"]["compared_with"] = {"scale": candidate, **higher.to_dict()}
    if not why:
        return out
    step = higher
    for _ in range(SCALE_TRIES):
        if step is None and not fits(deadline, expected_step_s("fp16")):
            break
        step = step if step is not None else step_at(candidate)
        if step.scale is None or step.backoffs:  # the larger scale overflows: no single scale works
            out["suggested"] = {**_step_dict(step), "tried_scale": candidate, "fits": False}
            break
        out["suggested"] = {**_step_dict(step), "tried_scale": candidate, "fits": True}
        if not _loses(step.lost, step.nonzero, LOST_OK):
            break
        candidate *= 16
        step = None
    return out


def _degraded(err_default: float | None, err_higher: float | None) -> bool:
    """The default scale's gradients are measurably worse than a larger scale's: more than twice
    the error and ERROR_WARN worse (fp16's own rounding is the same at both)."""
    if err_default is None or err_higher is None:
        return False
    return err_default > 2 * err_higher and err_default - err_higher > ERROR_WARN


def _step_dict(step: "scaled_grads.ScaledStep") -> dict[str, Any]:
    return {**step.to_dict(), "per_module_lost": step.lost, "per_module_nonzero": step.nonzero,
            "per_module_error": step.per_module_error}


def _loses(lost: list[int], nonzero: list[int], share: float | None = None) -> bool:
    """The model loses gradients: LOST_WARN of all its nonzero elements, or MODULE_LOST_WARN of
    one module's (`share` replaces both when given)."""
    total = sum(nonzero)
    if not total:
        return False
    if share is not None:
        return sum(lost) / total >= share
    return sum(lost) / total >= LOST_WARN or any(
        n and l / n >= MODULE_LOST_WARN for l, n in zip(lost, nonzero))


def _flush_floor(hist: list[int]) -> float:
    """Smallest power-of-two scale lifting all but LOST_OK of the nonzero fp32 gradients to
    float16's smallest subnormal (2**-24): what it takes for them not to flush to zero."""
    counts = hist[:_BINS]
    total = sum(counts)
    acc, low_exp = 0, _LO
    for i, c in enumerate(counts):
        if acc + c > total * LOST_OK:
            low_exp = _LO + i
            break
        acc += c
    return 2.0 ** max(0, FLUSH_EXP - low_exp)


def _to_host(tree: Any) -> Any:
    """Move a nest of device tensors to Python values with a single transfer."""
    flat: list[torch.Tensor] = []

    def collect(x):
        if isinstance(x, torch.Tensor):
            flat.append(x.reshape(-1).double())
        elif isinstance(x, dict):
            for v in x.values():
                collect(v)
        elif isinstance(x, list):
            for v in x:
                collect(v)

    collect(tree)
    values = torch.cat(flat).tolist() if flat else []
    pos = 0

    def rebuild(x):
        nonlocal pos
        if isinstance(x, torch.Tensor):
            n = x.numel()
            chunk = values[pos:pos + n]
            pos += n
            if x.dim() == 0:
                return chunk[0]
            if x.dim() == 2:
                cols = x.shape[1]
                return [[int(v) for v in chunk[r * cols:(r + 1) * cols]] for r in range(x.shape[0])]
            return chunk
        if isinstance(x, dict):
            return {k: rebuild(v) for k, v in x.items()}
        if isinstance(x, list):
            return [rebuild(v) for v in x]
        return x

    return rebuild(tree)


# ---------------------------------------------------------------- interpretation


def _bits(max_abs: float) -> float | None:
    if not math.isfinite(max_abs):
        return None
    return math.log2(FP16_MAX / max_abs) if max_abs > 0 else None


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def interpret(raw: dict[str, Any], device: str = "cpu", seed: int = 0) -> HeadroomResult:
    activations = []
    half_out = raw.get("half_out")
    leaves = raw.get("leaves") or {}
    for name, m, m_in in zip(raw["order"], raw["act"], raw.get("act_in", raw["act"])):
        # Under fp16 autocast a module overflows when it computes in float16 and its result
        # (or the fp32 input it casts down) is past 65504; modules autocast keeps in fp32
        # (norms, softmax, embeddings) hand their large values on to the next one.
        in_half = True if half_out is None else half_out.get(name, False)
        # Only a leaf casts its own input down: a container (the model itself) just hands the
        # batch on, and its first layer (a LayerNorm in fp32, say) may well tame it.
        casts_input = leaves.get(name, name != "")
        too_big = (math.isfinite(m) and m > FP16_MAX) or (casts_input and math.isfinite(m_in) and m_in > FP16_MAX)
        activations.append({"module": name, "class": raw["classes"][name], "max_abs": m,
                            "input_max_abs": m_in, "headroom_bits": _bits(m), "finite": math.isfinite(m),
                            "fp16_output": in_half, "overflows_fp16": bool(in_half and too_big)})
    first = next((a for a in activations if a["overflows_fp16"]), None)
    nonfinite = next((a["module"] for a in activations if not a["finite"]), None)
    gradients = []
    total_hist = [0] * (_BINS + 2)
    default = (raw.get("scaled") or {}).get("default") or {}
    lost = default.get("per_module_lost") if default.get("scale") is not None else None
    for i, ((name, cls), hist, gmax, count) in enumerate(zip(raw["owners"], raw["grad_hist"], raw["grad_max"],
                                                             raw["param_counts"])):
        total_hist = [a + b for a, b in zip(total_hist, hist)]
        nz, flush = _share_below(hist, FLUSH_EXP)
        _, sub = _share_below(hist, SUBNORMAL_EXP)
        gradients.append({"module": name, "class": cls, "elements": count, "nonzero": nz,
                          "zeros": hist[_BINS], "nonfinite": hist[_BINS + 1], "max_abs": gmax,
                          "flush_to_zero_share": flush / nz if nz else 0.0,
                          "subnormal_share": sub / nz if nz else 0.0,
                          "lost_with_default_scaler": lost[i] if lost else (0 if lost is not None else None),
                          **_scale_window(hist, gmax)})
    nz, flush = _share_below(total_hist, FLUSH_EXP)
    _, sub = _share_below(total_hist, SUBNORMAL_EXP)
    gmax = max((g["max_abs"] for g in gradients), default=0.0)
    summary = {"nonzero": nz, "flush_to_zero_share": flush / nz if nz else 0.0,
               "subnormal_share": sub / nz if nz else 0.0, "max_abs": gmax,
               "nonfinite": total_hist[_BINS + 1], **_scale_window(total_hist, gmax),
               "exponent_histogram": {str(_LO + i): c for i, c in enumerate(total_hist[:_BINS]) if c},
               **_scaler_summary(raw.get("scaled", {}))}
    summary["window_text"] = window_text(summary)
    rel = {}
    for p in ("fp16", "bf16"):
        if p in raw["rel"]:
            r = raw["rel"][p]
            rel[p] = {"output": r["output"], "loss": r["loss"], "loss_value": r["loss_value"]}
        else:
            rel[p] = {"error": raw["errors"].get(p, "not measured")}
    result = HeadroomResult(activations, gradients, summary, rel, raw["loss32"], raw.get("input_max"),
                            first["module"] if first else None, first_nonfinite=nonfinite,
                            device=device, seed=seed)
    result.findings = _overflow_findings(result, first) + _underflow_findings(result) + _bf16_findings(result)
    return result


def _maker(r: HeadroomResult, first: dict) -> dict | None:
    """The module whose own forward() code made the too-large input of `first` (a `silu(gate) *
    up` in MLP.forward feeding its down projection): no module before `first` output values that
    large, and the batch is not that large either. None when a module's output was (that module's
    fp32 output is what `first` computes on) or the input came in so large."""
    if first["max_abs"] > FP16_MAX or not math.isfinite(first["input_max_abs"]):
        return None
    big = first["input_max_abs"]
    if r.input_max_abs is not None and r.input_max_abs >= big:
        return None
    index = next(i for i, a in enumerate(r.activations) if a is first)
    if any(a["max_abs"] >= big for a in r.activations[:index]):
        return None
    parent = first["module"].rsplit(".", 1)[0] if "." in first["module"] else ""
    return next((a for a in r.activations if a["module"] == parent), {"module": parent, "class": None})


def _overflow_findings(r: HeadroomResult, first: dict | None) -> list[Finding]:
    data = {"check": "headroom"}
    maker = _maker(r, first) if first is not None else None
    if maker is not None:
        name, cls = maker["module"], maker.get("class")
        msg = (f"code in the forward() of '{name or '<root>'}'" + (f" ({cls})" if cls else "")
               + f" makes |x| up to {first['input_max_abs']:.3g} in the fp32 reference step (first at the input of "
               f"{first['class']} '{first['module']}', which computes in float16), beyond float16's 65504: under "
               "fp16 autocast it overflows to inf")
        return [Finding("AMP202", "fp16-overflow", Severity.ERROR, msg, overflow_fix(name, cls),
                        Location(module=name), precision="fp16",
                        data={**data, "input_max_abs": first["input_max_abs"], "made_by": name,
                              "first_overflowing_input": first["module"]})]
    if first is not None:
        others = [a["module"] for a in r.activations if a["overflows_fp16"] and a is not first]
        if first["max_abs"] > FP16_MAX:
            what = (f"outputs |x| up to {first['max_abs']:.3g} in the fp32 reference step, beyond "
                    f"float16's 65504 ({first['headroom_bits']:.1f} bits of headroom)")
        else:
            what = (f"receives |x| up to {first['input_max_abs']:.3g} (beyond float16's 65504) and "
                    "computes in float16")
        msg = f"{first['class']} '{first['module']}' {what}: under fp16 autocast it overflows to inf"
        if r.input_max_abs is not None and r.input_max_abs > FP16_MAX:
            msg += f" (the input itself reaches {r.input_max_abs:.3g})"
        if others:
            msg += f"; {len(others)} later module(s) overflow too"
        return [Finding("AMP202", "fp16-overflow", Severity.ERROR, msg, overflow_fix(first["module"], first["class"]),
                        Location(module=first["module"]), precision="fp16",
                        data={**data, "max_abs": first["max_abs"], "input_max_abs": first["input_max_abs"],
                              "headroom_bits": first["headroom_bits"], "also_overflowing": others})]
    near = next((a for a in r.activations if a["headroom_bits"] is not None
                 and a["headroom_bits"] < NEAR_OVERFLOW_BITS), None)
    if near is None:
        return []
    msg = (f"{near['class']} '{near['module']}' reaches |x| = {near['max_abs']:.3g}, within "
           f"{near['headroom_bits']:.2f} bits of float16's maximum: a slightly larger input or a few "
           "training steps can overflow it")
    return [Finding("AMP202", "fp16-overflow", Severity.INFO, msg,
                    "Prefer bf16, or keep this layer's scale in check (normalisation, smaller init).",
                    Location(module=near["module"]), precision="fp16",
                    data={**data, "max_abs": near["max_abs"], "headroom_bits": near["headroom_bits"]})]


def _pow2(x: float) -> str:
    e = math.log2(x)
    return f"2**{int(e)} = {x:.0f}" if e == int(e) and x >= 1 else f"{x:g}"


def window_text(s: dict[str, Any]) -> str:
    """The loss-scale window in words: never 'between 1 and 0.25' when no scale fits."""
    lo, hi = s.get("min_loss_scale"), s.get("max_loss_scale")
    if lo is None:
        return "no nonzero gradient to scale"
    if s.get("fits") is False:
        return (f"no single loss scale fits: keeping the small gradients from flushing to zero needs at "
                f"least {_pow2(lo)}, but the largest gradient overflows float16 above {_pow2(hi)}")
    return f"a loss scale from {_pow2(lo)}" + (f" to {_pow2(hi)}" if hi is not None else " up") + \
        " keeps the gradients from flushing to zero without overflowing"


def _scaler_summary(scaled: dict[str, Any] | None) -> dict[str, Any]:
    """The measured GradScaler figures for gradient_summary (per-module lists stay in gradients)."""
    if not scaled:
        return {"default_scaler_not_measured": "budget"} if scaled is None else {}
    strip = ("per_module_lost", "per_module_nonzero", "per_module_error")
    out = {"default_scaler": {k: v for k, v in scaled["default"].items() if k not in strip}}
    if "suggested" in scaled:
        out["suggested_scaler"] = {k: v for k, v in scaled["suggested"].items() if k not in strip}
    return out


def _lost_modules(r: HeadroomResult) -> list[dict[str, Any]]:
    return [g for g in r.gradients if g.get("lost_with_default_scaler")]


def _underflow_findings(r: HeadroomResult) -> list[Finding]:
    """One AMP203 per model, from real fp16 steps with GradScaler: a warning only when the
    default scaler loses gradients; an info when fp16 without a scaler would."""
    s = r.gradient_summary
    d = s.get("default_scaler")
    data = {"check": "headroom", **{k: v for k, v in s.items() if k != "exponent_histogram"}}
    if not d or d.get("lost_share") is None:
        return _unscaled_info(r, data, measured=False)
    lost = _lost_modules(r)
    if not d.get("loses_gradients") or not lost:
        return _unscaled_info(r, data, measured=True)
    worst = max(lost, key=lambda g: (g["lost_with_default_scaler"] / max(g["nonzero"], 1), g["lost_with_default_scaler"]))
    data["modules"] = [{"module": g["module"], "class": g["class"], "lost": g["lost_with_default_scaler"],
                        "nonzero": g["nonzero"], "lost_share": g["lost_with_default_scaler"] / max(g["nonzero"], 1)}
                       for g in lost]
    names = ", ".join(f"'{g['module']}'" for g in lost[:6]) + (f" and {len(lost) - 6} more" if len(lost) > 6 else "")
    msg = (f"a real fp16 step with GradScaler at scale {d['scale']:g}"
           + (f" (backed off {d['backoffs']} time(s) from 65536 on overflow)" if d.get("backoffs") else
              " (its default)")
           + f" loses {d['lost_share']:.2%} of the nonzero gradient elements to zero (|g x scale| < 6e-8) "
           f"in {len(lost)} module(s): {names}; the gradient's relative error against fp32 is "
           f"{_fmt(d.get('gradient_relative_error'))}")
    higher = d.get("compared_with")
    if higher and higher.get("gradient_relative_error") is not None:
        msg += f" ({_fmt(higher['gradient_relative_error'])} at scale {_pow2(higher['scale'])})"
    return [Finding("AMP203", "fp16-gradient-underflow", Severity.WARNING, msg, _measured_suggestion(s, r.device),
                    Location(module=worst["module"]), precision="fp16", data=data)]


def _measured_suggestion(s: dict[str, Any], device: str = "cpu") -> str:
    """The fix, naming the device the check ran on: torch.amp.GradScaler() without one makes a
    CUDA scaler, wrong advice on a CPU."""
    d, sug = s["default_scaler"], s.get("suggested_scaler")
    bf16 = "Or train in bf16, which needs no loss scaling."
    if d.get("backoffs") or sug is None or not sug.get("fits"):
        return ("No single loss scale keeps these gradients: the scale that lifts the small ones makes the large "
                "ones overflow float16. Train in bf16, or scale the loss up in the code (a loss weight "
                "this small underflows) and keep GradScaler.")
    tried = sug["tried_scale"]
    keeps = (f"; measured: at {_pow2(tried)} {sug['lost_share']:.2%} are lost and the gradient error is "
             f"{_fmt(sug.get('gradient_relative_error'))} (default: {_fmt(d.get('gradient_relative_error'))})")
    kind = str(device).split(":")[0]
    return (f"Start GradScaler higher: torch.amp.GradScaler('{kind}', init_scale={tried:.0f}) (it grows by itself only "
            f"every 2000 steps){keeps}. {bf16}")


def _unscaled_info(r: HeadroomResult, data: dict[str, Any], measured: bool) -> list[Finding]:
    """No loss from the default scaler; one info when running fp16 without any scaler would lose
    FLUSH_WARN of the gradients (so GradScaler must stay)."""
    s = r.gradient_summary
    if not s["nonzero"] or s["flush_to_zero_share"] < FLUSH_WARN:
        return []
    how = ("a real fp16 step with GradScaler's default scale keeps them" if measured else
           "GradScaler's default scale (65536) should keep them (estimated from the fp32 gradients; "
           "the fp16 step could not be measured)")
    if not measured and s.get("min_loss_scale") and s["min_loss_scale"] > DEFAULT_SCALE:
        how = (f"GradScaler's default scale 65536 is below the {_pow2(s['min_loss_scale'])} the fp32 gradients "
               "call for (estimated: the fp16 step could not be measured)")
    msg = (f"without loss scaling {s['flush_to_zero_share']:.1%} of the nonzero gradient elements would flush "
           f"to zero in float16 (|g| < 6e-8); {how}")
    return [Finding("AMP203", "fp16-gradient-underflow", Severity.INFO, msg,
                    "Keep torch.amp.GradScaler in the fp16 loop (or train in bf16, which needs no loss scaling).",
                    Location(), precision="fp16", data=data)]


def _bf16_findings(r: HeadroomResult) -> list[Finding]:
    e = r.relative_error.get("bf16", {})
    loss_err, out_err = e.get("loss"), e.get("output")
    if loss_err is None or not math.isfinite(loss_err):
        return []  # non-finite bf16 results are the nan check's business
    worst = max(loss_err, out_err if out_err is not None and math.isfinite(out_err) else 0.0)
    if worst < BF16_INFO:
        return []
    severity = Severity.WARNING if loss_err >= BF16_WARN else Severity.INFO
    msg = (f"under bf16 autocast the loss is off by {loss_err:.1%} and the model output by "
           f"{_fmt(out_err)} (relative) against fp32: bfloat16's 8-bit mantissa loses this model's precision")
    return [Finding("AMP210", "bf16-precision-loss", severity, msg,
                    "Keep the precision-sensitive part in fp32 (compute the loss and final layers outside "
                    "autocast, e.g. on outputs .float()), rescale targets/outputs to O(1), or use fp16 "
                    "with GradScaler if the range allows.",
                    Location(), precision="bf16",
                    data={"check": "headroom", "loss_relative_error": loss_err,
                          "output_relative_error": out_err})]


def check_headroom(workload: Workload, device: torch.device | str = "cpu", seed: int = 0,
                   deadline: float | None = None, progress=None) -> HeadroomResult:
    """`progress(fraction, message)` moves per step: the fp32 reference, each half-precision
    forward, each real fp16 GradScaler step (one of them can take seconds on a CPU)."""
    device = torch.device(device)
    with prec.precision_mode("fp32", device):
        raw = measure(workload, device, seed, deadline, progress)
    return interpret(raw, str(device), seed)
