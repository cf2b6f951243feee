"""Find the first module whose output or gradient is NaN/Inf: in a user's loop and as a check.

Two entry points share the hook machinery of `nanhooks`:
- `nanhunt(model)`: a context manager / hook object for a user's own training script; it
  synchronises once per `step()` and reports the first non-finite module on the step it
  happens (log, record, or raise `NonFiniteError`).
- `hunt_nonfinite(workload, device, precisions)`: the engine's `nan` check; one seeded
  training step per precision, turned into AMP205/AMP206/AMP202 findings.
"""
from __future__ import annotations

import logging
import math
import re
from typing import Any, Sequence

import torch
from torch import nn

from ..findings import Finding, Location, Severity
from ..workload import Workload
from . import precision as prec
import time

from .budget import expected_step_s, fits, record_step_s
from .module_kind import overflow_fix
from .nanhooks import HookSet, StepReport, number
from .training_step import build, device_batch

__all__ = ["nanhunt", "NonFiniteError", "hunt_nonfinite", "format_event"]

log = logging.getLogger("troubleshooter.nanhunt")
_MAX_EVENTS = 1000  # events kept in nanhunt.events
_MAX_LOGGED = 5  # non-finite steps logged as warnings before going quiet


class NonFiniteError(FloatingPointError):
    """Raised by `nanhunt(..., raise_on_nonfinite=True)`; `.event` holds the full report."""

    def __init__(self, event: dict):
        self.event = event
        super().__init__(event["message"])


# -- human-readable reports ------------------------------------------------------------
def _where(d: dict, *extra: str) -> str:
    if d.get("module") is None:
        return "the loss"
    name = d["module"] or "<root>"
    inside = ", ".join(x for x in (d.get("class"), *extra) if x)
    return f"module '{name}' ({inside})" if inside else f"module '{name}'"


def _shown(d: dict) -> str:
    """The non-finite value as the user should read it: -inf stays -inf (kind alone says "inf")."""
    return d.get("value") or d["kind"]


def _a(kind: str) -> str:
    return f"an {kind}" if kind[:1] in "aeiou" else f"a {kind}"


def _describe_forward(d: dict) -> str:
    extra = [d.get("dtype") and f"{d['dtype']} output", d.get("autocast") and f"autocast {d['autocast']}"]
    text = f"forward: {_where(d, *extra)} outputs {_shown(d)}"
    if d.get("occurrence", 1) > 1:
        text += f" on call {d['occurrence']} of this module"
    if d.get("created"):
        ins = ", ".join(str(x) for x in d.get("input_max_abs", [])) or "none"
        text += f"; its inputs were finite (max |x| {ins}), so it creates the {_shown(d)}"
    else:
        text += f"; its inputs were already non-finite ({d.get('source', 'made outside any module')})"
    return text


def _describe_backward(d: dict) -> str:
    kind = _shown(d)
    if d.get("grad_of") == "loss":
        return f"backward: the loss's gradient w.r.t. the model output, made by {_where(d)}, is {kind}"
    if d.get("grad_of") == "parameter":
        return f"backward: the gradient of parameter '{d['parameter']}' of {_where(d)} is {kind}"
    outs = d.get("grad_output_max_abs") or []
    came = f"finite output gradients (max |g| {max(outs, key=float)})" if outs else "its output gradient"
    if d.get("grad_of") == "forward code":
        return (f"backward: code in the forward() of {_where(d)} turns {came} into {_a(kind)} gradient "
                f"for submodule '{d.get('grad_input_from')}'")
    return f"backward: {_where(d)} turns {came} into {_a(kind)} gradient w.r.t. its input"


def format_event(event: dict) -> str:
    """One readable paragraph for a step's non-finite report (what `NonFiniteError` says)."""
    parts = [f"nanhunt step {event['step']}:"]
    if event.get("skipped"):
        parts.append("scaled gradients are non-finite, so GradScaler skips this step and lowers its "
                     "scale (normal in fp16 while the scale calibrates; a problem only if it persists) -")
    elif event.get("persistent"):
        parts.append(f"scaled gradients have been non-finite for {event['consecutive']} steps in a row, "
                     "more than GradScaler's calibration explains -")
    if event.get("forward"):
        parts.append(_describe_forward(event["forward"]) + ".")
    if event.get("backward"):
        b = _describe_backward(event["backward"])
        if event.get("forward"):
            b += " (a consequence of the forward non-finite)"
        parts.append(b + ".")
    return " ".join(parts)


# -- the user-facing hook object -------------------------------------------------------
class nanhunt:  # noqa: N801 - used like a function: `with nanhunt(model) as hunt:`
    """Hooks that report the first module whose output or gradient turns NaN/Inf.

    Cost per step: one on-device min/max per tensor a module takes or returns, one per
    gradient, and a single host synchronisation in `step()` (or at the next forward when
    `step()` is never called). Hooks are removed by `detach()` / leaving the `with` block.

    ignore: fnmatch patterns of module names not to hook, e.g. a module that returns an
    attention mask full of -inf on purpose ("encoder.mask*").

    scaler: pass your `GradScaler` in fp16 training. A non-finite *scaled* gradient with a
    finite forward is then a skipped step (GradScaler's normal calibration), recorded in
    `events` with `skipped=True` but not raised, until more than `patience` steps in a row skip.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        forward: bool = True,
        backward: bool = True,
        every: int = 1,
        raise_on_nonfinite: bool = False,
        log: bool = True,
        scaler: Any = None,
        patience: int = 20,
        ignore: Sequence[str] = (),
    ):
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a positive integer, got {every!r}")
        if not (forward or backward):
            raise ValueError("nanhunt with forward=False and backward=False would check nothing")
        self.hooks = HookSet(model, forward=forward, backward=backward, ignore=ignore)
        self.hooks.on_root_call = self._on_root_call
        self.every = every
        self.raise_on_nonfinite = raise_on_nonfinite
        self.log = log
        self.scaler = scaler
        self.patience = patience
        self.steps = 0  # steps finished (checked or not)
        self.events: list[dict] = []  # every step with a non-finite value, skipped ones included
        self.last: StepReport | None = None  # analysis of the last checked step
        self._manual = False  # step() called at least once: no auto-stepping at forward
        self._started = False  # a forward happened in the current (auto) step
        self._consecutive = 0
        self._counts = {"real": 0, "skipped": 0}

    # lifecycle
    def attach(self) -> "nanhunt":
        self.hooks.attach()
        return self

    def detach(self) -> None:
        self.hooks.detach()

    def __enter__(self) -> "nanhunt":
        return self.attach()

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            event = self._end_step(count=False) if self.hooks.pending else None
        finally:
            self.detach()
        if event is not None and exc_type is None:
            self._maybe_raise(event)

    @property
    def report(self) -> dict | None:
        """The first non-finite event that is not a GradScaler skip, or None."""
        return next((e for e in self.events if not e.get("skipped")), None)

    @property
    def skipped_steps(self) -> int:
        """Steps GradScaler skipped (scaled gradients non-finite, forward finite)."""
        return self._counts["skipped"]

    @property
    def nonfinite_steps(self) -> int:
        """Steps with a non-finite value that were not GradScaler skips."""
        return self._counts["real"]

    # stepping
    def step(self) -> dict | None:
        """End a training step: sync once, return its non-finite event (None when all finite)."""
        self._manual = True
        event = self._end_step()
        self._maybe_raise(event)
        return event

    def _on_root_call(self, hooks: HookSet) -> None:
        if self._manual:
            return
        if self._started:  # a new top-level forward ends the previous step
            event = self._end_step()
            self._maybe_raise(event)
        self._started = True

    def _end_step(self, count: bool = True) -> dict | None:
        index = self.steps
        event = None
        if self.hooks.pending:
            self.last = self.hooks.collect()
            event = self._classify(self.last, index)
        if count:
            self.steps += 1
            self.hooks.active = self.steps % self.every == 0
        if event is not None:
            self._record(event)
        return event

    def _record(self, event: dict) -> None:
        """Keep and log an event; bounded, so a model that stays NaN does not flood memory or logs."""
        key = "skipped" if event["skipped"] else "real"
        self._counts[key] += 1
        if len(self.events) < _MAX_EVENTS:
            self.events.append(event)
        if not self.log:
            return
        if event["skipped"]:
            log.info(event["message"])
        elif self._counts["real"] <= _MAX_LOGGED:
            log.warning(event["message"])
            if self._counts["real"] == _MAX_LOGGED:
                log.warning("nanhunt: further non-finite steps are recorded in hunt.events but not logged")

    def _classify(self, rep: StepReport, index: int) -> dict | None:
        if rep.finite:
            self._consecutive = 0
            return None
        event = {"step": index, "forward": rep.forward, "backward": rep.backward,
                 "autocast": rep.autocast, "skipped": False, "persistent": False}
        if rep.forward is None and self.scaler is not None and getattr(self.scaler, "is_enabled", lambda: True)():
            self._consecutive += 1
            event["consecutive"] = self._consecutive
            event["skipped"] = self._consecutive <= self.patience
            event["persistent"] = not event["skipped"]
        else:
            self._consecutive = 0
        event["message"] = format_event(event)
        return event

    def _maybe_raise(self, event: dict | None) -> None:
        if event is not None and self.raise_on_nonfinite and not event["skipped"]:
            raise NonFiniteError(event)


# -- the engine's `nan` check ----------------------------------------------------------
HOOKED_STEP = 1.3  # a hooked step relative to a plain one (bench/nan_overhead.py)


def hunt_nonfinite(
    workload: Workload,
    device: str | torch.device = "auto",
    precisions: Sequence[str] = ("fp32", "fp16", "bf16"),
    seed: int = 0,
    steps: int = 1,
    deadline: float | None = None,
    progress=None,
) -> dict:
    """Run `steps` seeded training steps per precision with the hooks on; report the first
    non-finite module per precision and the findings.

    Returns `{"device": str, "precisions": {p: section}, "findings": [Finding, ...]}`:
    the findings are `Finding` objects (call `.to_dict()` for JSON); everything else is
    JSON-safe (non-finite numbers appear as the strings "inf"/"nan"; `loss` is None when
    the loss itself is not finite). See docs/nanhunt.md for the section's keys.
    """
    device = prec.resolve_device(device)
    names = [prec.check_precision(p) for p in precisions]
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    sections: dict[str, dict] = {}
    traces: dict[str, list[list[dict]]] = {}
    last_s = 0.0
    for i, p in enumerate(names):
        # a precision runs only when its steps are expected to end in time (the cost model knows
        # an emulated fp16 step is several times an fp32 one); unknown cost: the first one runs
        need = expected_step_s(p, HOOKED_STEP * steps) if deadline is not None else None
        if not fits(deadline, need if need is not None else (last_s if i else None)):
            sections[p], traces[p] = _not_run(p), []
            continue
        if progress is not None:
            progress(i / len(names), f"nan: {p} step with hooks")
        started = time.perf_counter()
        sections[p], traces[p] = _hunt_one(workload, device, p, seed, steps)
        last_s = time.perf_counter() - started
        if sections[p].get("steps_run"):  # a plain step's cost, unless one was measured already
            record_step_s(p, last_s / sections[p]["steps_run"] / HOOKED_STEP, keep_measured=True)
    from .collapse import fold_consequences

    findings = fold_consequences(_findings(sections, traces) + _collapses(workload, device, sections, traces, seed))
    return {"device": str(device), "precisions": sections, "findings": findings}


def _collapses(workload: Workload, device: torch.device, sections: dict, traces: dict, seed: int) -> list[Finding]:
    """AMP212: a half-precision run whose first step stayed finite but flattened a module's output
    (all zeros, one value) where fp32's varies; the op that started it from one more forward."""
    from .collapse import collapse_finding, first_collapse, is_collapse_candidate

    ref = traces.get("fp32") or []
    if not ref or not is_collapse_candidate(sections.get("fp32")):
        return []
    out = []
    for p in ("fp16", "bf16"):
        if not traces.get(p) or not is_collapse_candidate(sections.get(p)):
            continue
        found = first_collapse(traces[p][0], ref[0])
        if found is None:
            continue
        sections[p]["collapse"] = found
        what = "all zeros" if found["zero"] else "one constant value"
        sections[p]["summary"] = (f"finite, but module '{found['module'] or '<root>'}' outputs {what} where fp32's "
                                  "varies: a silent collapse (AMP212)")
        op, cls = _collapse_op(workload, device, p, seed, found)
        out.append(collapse_finding(p, found, cls, op))
    return out


def _collapse_op(workload: Workload, device: torch.device, precision: str, seed: int, found: dict):
    """(the op that started the collapse or None, the module's class) from the first step's
    forward, re-run in `precision` and in fp32 with the collapsed module's ops recorded."""
    from .collapse import first_bad_op, record_module_ops

    model = None
    try:
        model, _ = build(workload, device, seed)
        batch = device_batch(workload, device, seed)
        name = found["module"]
        cls = type(model.get_submodule(name) if name else model).__name__

        def forward(p):
            torch.manual_seed(seed)  # the dropout masks of the step that collapsed
            with prec.autocast(p, device):
                workload.loss(model, batch)

        half = record_module_ops(model, name, found["occurrence"], lambda: forward(precision))
        ref = record_module_ops(model, name, found["occurrence"], lambda: forward("fp32"))
        return first_bad_op(half, ref), cls
    except Exception:  # noqa: BLE001 - the collapse stands without its op
        return None, None
    finally:
        model = None  # noqa: F841 - let the copy go before the memory is released
        _release(device)


def _hunt_one(workload: Workload, device: torch.device, precision: str, seed: int, steps: int):
    """One precision: returns (JSON section, per-step call summaries for cross-precision checks)."""
    dtype = prec.autocast_dtype(precision)
    section: dict[str, Any] = {
        "autocast": str(dtype).replace("torch.", "") if dtype else None,
        "first_forward": None, "first_backward": None,
        "loss": None, "loss_finite": True, "steps_run": 0, "failed_step": None,
    }
    scaled = prec.uses_scaler(precision)
    if scaled:
        section.update({"loss_scale": None, "scaled_backward": None, "skipped_steps": 0})
    trace: list[list[dict]] = []
    model = opt = hooks = None
    try:
        model, opt = build(workload, device, seed)
        scaler = prec.make_scaler(precision, device)
        hooks = HookSet(model).attach()
        with prec.precision_mode(precision, device):
            for step in range(steps):
                batch = device_batch(workload, device, seed + step)
                scale = scaler.get_scale() if scaled else 1.0
                rep, loss = _forward_backward(workload, model, opt, batch, precision, device, scaler,
                                              seed + step, hooks)
                trace.append(rep.calls)
                section["steps_run"] = step + 1
                section["loss_finite"] = math.isfinite(loss)
                section["loss"] = loss if math.isfinite(loss) else None
                if not math.isfinite(loss):
                    section["loss_kind"] = "nan" if math.isnan(loss) else ("-inf" if loss < 0 else "inf")
                if scaled:
                    section["loss_scale"] = scale
                if rep.forward is not None or not math.isfinite(loss):
                    section["first_forward"] = _with_step(rep.forward, step)
                    if rep.backward is not None:
                        section["first_backward"] = {**_with_step(rep.backward, step), "caused_by_forward": True}
                    section["failed_step"] = step
                    break
                if rep.backward is not None and scaled:
                    # What a real fp16 run does: the scaled backward overflowed, GradScaler skips
                    # the step. Whether that is calibration or a real problem is decided by the
                    # same step without scaling.
                    section["skipped_steps"] += 1
                    if section["scaled_backward"] is None:
                        section["scaled_backward"] = {**_with_step(rep.backward, step), "loss_scale": scale}
                    scaler.step(opt)
                    scaler.update()
                    rep1, _ = _forward_backward(workload, model, opt, batch, precision, device, None,
                                                seed + step, hooks)
                    opt.zero_grad(set_to_none=True)
                    if rep1.backward is not None:
                        section["first_backward"] = {**_with_step(rep1.backward, step), "loss_scale": 1.0}
                        section["failed_step"] = step
                        break
                    continue
                if rep.backward is not None:
                    section["first_backward"] = _with_step(rep.backward, step)
                    section["failed_step"] = step
                    break
                if step + 1 < steps:
                    scaler.step(opt)
                    scaler.update()
    except Exception as exc:  # OOM or a model that fails in this precision: report, keep going
        section["error"] = _error_text(exc, device)
    finally:
        section["summary"] = _summary(section)
        if hooks is not None:
            hooks.detach()
        del model, opt, hooks
        _release(device)
    return section, trace


def _not_run(precision: str) -> dict:
    dtype = prec.autocast_dtype(precision)
    return {"autocast": str(dtype).replace("torch.", "") if dtype else None, "first_forward": None,
            "first_backward": None, "loss": None, "loss_finite": None, "steps_run": 0, "failed_step": None,
            "not_run": "budget", "summary": "not run: the check's time budget was spent (raise --budget)"}


def _summary(section: dict) -> str:
    """One line for the report table: what this precision's run found first."""
    if section.get("error"):
        return f"did not run: {section['error']}"
    if section["first_forward"] is not None:
        return _describe_forward(section["first_forward"])
    if not section["loss_finite"]:
        return "forward: every module output is finite but the loss is not"
    if section["first_backward"] is not None:
        return _describe_backward(section["first_backward"])
    if section.get("scaled_backward") is not None:
        return (f"finite; the scaled backward overflowed at loss scale {section['scaled_backward']['loss_scale']:g} "
                f"in {section['skipped_steps']} step(s), which GradScaler skips (it lowers the scale)")
    return "every module output and gradient is finite"


def _forward_backward(workload, model, opt, batch, precision, device, scaler, rng_seed, hooks):
    """One forward and backward with the hooks on; `scaler` None means an unscaled backward."""
    opt.zero_grad(set_to_none=True)
    torch.manual_seed(rng_seed)  # same dropout masks in every precision and in a re-run
    with prec.autocast(precision, device):
        loss = workload.loss(model, batch)
    if loss.requires_grad:
        (scaler.scale(loss) if scaler is not None else loss).backward()
    rep = hooks.collect()
    return rep, float(loss.detach().float())


def _with_step(d: dict | None, step: int) -> dict | None:
    return None if d is None else {**d, "step": step}


def _error_text(exc: BaseException, device: torch.device) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, torch.cuda.OutOfMemoryError) or isinstance(exc, MemoryError) or "out of memory" in text.lower():
        return f"out of memory on {device}: use a smaller batch or model for the check"
    return f"{type(exc).__name__}: {text}"


def _release(device: torch.device) -> None:
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# -- findings --------------------------------------------------------------------------
_REFERENCES = ("fp32", "tf32", "bf16")


def _reference_call(traces: dict, precision: str, step: int, index: int, module: str) -> dict | None:
    """The same call in a wider-range precision at the same step, when it ran there."""
    for ref in _REFERENCES:
        if ref == precision or ref not in traces or len(traces[ref]) <= step:
            continue
        calls = traces[ref][step]
        if index < len(calls) and calls[index]["module"] == module:
            return {"precision": ref, **calls[index]}
    return None


def _findings(sections: dict, traces: dict) -> list[Finding]:
    out: list[Finding] = []
    for p, s in sections.items():
        if s.get("not_run"):  # cut by the budget: nothing measured, nothing to say (errors.nan says it)
            continue
        ff, fb = s.get("first_forward"), s.get("first_backward")
        if ff is not None or not s.get("loss_finite", True):
            f = _forward_finding(p, s, ff, traces)
        elif fb is not None:
            f = _backward_finding(p, s, fb)
        else:
            continue
        shared = _shared_with_fp32(p, f, sections)
        if shared:
            f = _not_a_precision_problem(f, shared)
        elif p == "fp32":
            f = Finding(f.rule, f.name, f.severity, f.message, _MODEL_BUG_FP32 + f.suggestion, f.location,
                        f.precision, {**f.data, "precision_problem": False})
        out.append(f)
    return out


def _fp32_event(sections: dict) -> tuple[str, str | None] | None:
    """('forward'|'backward', module) of fp32's first non-finite value, when fp32 has one."""
    s = sections.get("fp32")
    if not isinstance(s, dict) or s.get("error"):
        return None
    if s.get("first_forward") is not None or not s.get("loss_finite", True):
        return "forward", blamed_module(s.get("first_forward"))
    if s.get("first_backward") is not None:
        return "backward", s["first_backward"].get("module")
    return None


def _shared_with_fp32(p: str, f: Finding, sections: dict) -> dict | None:
    """fp32 shows the same non-finite value (same pass, same module) as precision `p`."""
    if p == "fp32":
        return None
    ref = _fp32_event(sections)
    if ref is None:
        return None
    direction = "backward" if f.rule == "AMP206" else "forward"
    if ref != (direction, f.location.module):
        return None
    return {"precision": "fp32", "pass": direction, "module": f.location.module}


_MODEL_BUG = ("This happens in fp32 too, so it is a model or data bug, not a precision problem; bf16 or "
              "keeping a module in float32 will not cure it. ")


_MODEL_BUG_FP32 = "In fp32 this is a model or data bug, not a precision problem. "


def _fix_text(f: Finding) -> str:
    if f.rule == "AMP206":
        return ("Look for an operation whose derivative is infinite at the values seen: sqrt or pow(x, <1) at 0 "
                "(an L2 norm of an all-zero padding row: use torch.linalg.vector_norm or sqrt(x + eps)), log "
                "near 0, division by a small number; add an eps or mask the padding.")
    return ("Guard the operation that makes it: division by a zero norm (padding rows: mask them or clamp "
            "the norm with an eps), log/sqrt of non-positive values, inf - inf, weights or inputs that are "
            "already non-finite; check the data feeding it.")


def _not_a_precision_problem(f: Finding, shared: dict) -> Finding:
    """The same finding, saying it is shared with fp32 and dropping any half-precision cure."""
    where = "the loss" if f.location.module is None else f"module '{f.location.module}'"
    return Finding(f.rule, f.name, f.severity,
                   f"{f.message}; fp32 shows the same non-finite value at {where}: a model or data bug, "
                   "not a precision problem",
                   _MODEL_BUG + (f.suggestion if f.rule == "AMP205" and f.location.module is None else _fix_text(f)),
                   f.location, f.precision,
                   {**f.data, "also_in_fp32": shared, "precision_problem": False})


_MADE_IN = re.compile(r"code in the forward\(\) of '([^']+)' \(")


def made_by(fwd: dict | None) -> str | None:
    """The module whose own forward() code (not a submodule) made the first non-finite value:
    an overflowing `att += bias` in Attention.forward or `silu(gate) * up` in MLP.forward shows up
    first at the input of the next submodule, but the module that made it is the enclosing one
    ("" for the model's own forward). None when a module's output was the first non-finite value,
    or the batch was."""
    if not fwd or fwd.get("inputs_finite") is not False:
        return None
    if fwd.get("made_by"):
        return fwd["made_by"]["module"]
    m = _MADE_IN.match(str(fwd.get("source") or ""))  # a record without `made_by`
    if m is None:
        return None
    return "" if m.group(1) == "<root>" else m.group(1)


def blamed_module(fwd: dict | None) -> str | None:
    """The module a forward finding names: the maker of the value, else the first bad output."""
    maker = made_by(fwd)
    return maker if maker is not None else (fwd or {}).get("module")


def _made_in_forward_code(p: str, ff: dict, maker: str, traces: dict, reference: dict | None) -> Finding:
    """One finding at the module whose own code made the value: AMP202 when its output is finite
    in a wider-range precision (fp16's range was the problem), AMP205 otherwise; without such a
    run under fp16 an overflow is not ruled out, and the finding says so."""
    info = ff.get("made_by") or {}
    cls = info.get("class")
    ref = reference if reference is not None and reference.get("module", maker) == maker else None
    if ref is None and info.get("call_index") is not None:
        r = _reference_call(traces, p, ff.get("step", 0), info["call_index"], maker)
        if r is not None:
            ref = {"precision": r["precision"], "finite": r["finite"], "max_abs": number(r["max_abs"])}
    name = f"'{maker or '<root>'}'" + (f" ({cls})" if cls else "")
    first = ff.get("module")
    data = {"first_forward": ff, "first_nonfinite_output": first}
    value = _shown(ff)
    seen = f"first seen at the input of '{first}'"
    if p == "fp16" and ref is not None and ref.get("finite"):
        data["reference"] = {"precision": ref["precision"], "max_abs": ref.get("max_abs")}
        return Finding(
            "AMP202", "fp16-overflow", Severity.ERROR,
            f"{name} overflows float16 in the forward pass: its own forward() code makes {value} from finite "
            f"inputs under fp16 autocast ({seen}), while in {ref['precision']} its output is finite (max |x| "
            f"{ref.get('max_abs')}); float16's largest value is 65504",
            overflow_fix(maker, cls), Location(module=maker), p, data)
    message = f"{name} makes {value} in its own forward() code from finite inputs in {p} ({seen})"
    suggestion = ("Guard the operation in its forward() that makes it: clamp inputs of log/sqrt/pow/division, add "
                  "an eps, check the weights it uses.")
    if ref is not None and ref.get("finite"):
        message += f"; finite in {ref['precision']}"
        data["reference"] = {"precision": ref["precision"], "max_abs": ref.get("max_abs")}
        suggestion = (f"Keep '{maker or '<root>'}' in float32 under {p} (autocast enabled=False) or make the operation "
                      "tolerant of reduced precision (eps, clamping).")
    elif ref is None and p == "fp16":
        data["float32_check"] = "not run"
        message += (f"; the float32 check of '{maker or '<root>'}' could not run, so an fp16 overflow is not ruled "
                    "out: if it is finite with autocast off, this is AMP202 (keep it in float32 or use bf16)")
    return Finding("AMP205", "nonfinite-in-forward", Severity.ERROR, message, suggestion, Location(module=maker),
                   p, data)


def _forward_finding(p: str, s: dict, ff: dict | None, traces: dict, reference: dict | None = None) -> Finding:
    """AMP202/AMP205 for the first non-finite forward value (`ff` None: only the loss is);
    `reference` is a float32 run of the module that made it, when the caller made one (trace)."""
    if ff is None:
        # Every module output is finite, the loss is not: no module is at fault (module None);
        # data names the module whose output the loss took, and the message its magnitude.
        step = s.get("failed_step") or 0
        calls = traces.get(p, [])[step] if len(traces.get(p, [])) > step else []
        made = next((c for c in reversed(calls) if c["module"] != ""), None)
        peak = f" (the model output peaks at max |x| {number(made['max_abs'])})" if made else ""
        return Finding(
            "AMP205", "nonfinite-in-forward", Severity.ERROR,
            f"the loss is {s.get('loss_kind', 'not finite')} in {p} although every module output is finite"
            f"{peak}: the loss computation overflows",
            "Check the loss function and its inputs: a log/division on model outputs or targets "
            "out of range, outputs so large their square overflows, or a loss weight so large the loss overflows.",
            Location(module=None), p, {"where": "loss", "loss_finite": False,
                                       "output_module": made["module"] if made else None},
        )
    maker = made_by(ff)
    if maker is not None:
        return _made_in_forward_code(p, ff, maker, traces, reference)
    module, step = ff["module"], ff.get("step", 0)
    ref = _reference_call(traces, p, step, ff["call_index"], module) if ff.get("created") else None
    data = {"first_forward": ff}
    where = _where(ff)
    if p == "fp16" and ff.get("created") and (ref is not None and ref["finite"] or ref is None and ff["kind"] == "inf"):
        peak = f" ({ref['precision']} peaks at max |x| {number(ref['max_abs'])})" if ref else ""
        data["reference"] = {"precision": ref["precision"], "max_abs": number(ref["max_abs"])} if ref else None
        return Finding(
            "AMP202", "fp16-overflow", Severity.ERROR,
            f"{where} overflows float16 in the forward pass: its output is {_shown(ff)} under fp16 "
            f"autocast{peak}; float16's largest value is 65504",
            overflow_fix(module, ff.get("class")), Location(module=module), p, data,
        )
    only = ""
    if ref is not None and ref["finite"]:
        only = f" (finite in {ref['precision']})"
        data["reference"] = {"precision": ref["precision"], "max_abs": number(ref["max_abs"])}
    made = "creates it from finite inputs" if ff.get("created") else "receives non-finite inputs: " + ff.get("source", "")
    suggestion = ("Guard the operation that makes it: clamp inputs of log/sqrt/pow/division, add an eps, "
                  "check weights and inputs feeding this module.")
    if only:
        suggestion = (f"Keep '{module or '<root>'}' in float32 under {p} (autocast enabled=False) or "
                      "make the operation tolerant of reduced precision (eps, clamping).")
    return Finding(
        "AMP205", "nonfinite-in-forward", Severity.ERROR,
        f"{where} outputs {_shown(ff)} in the forward pass in {p}{only}; it {made}",
        suggestion, Location(module=module), p, data,
    )


def _backward_finding(p: str, s: dict, fb: dict) -> Finding:
    where = _where(fb)
    what = {"parameter": f"the gradient of its parameter '{fb.get('parameter')}'",
            "loss": "the loss's gradient w.r.t. its output (the model output)",
            "forward code": "the gradient its forward() code passes to a submodule"}.get(
        fb.get("grad_of"), "the gradient w.r.t. its input")
    unscaled = " without loss scaling" if p == "fp16" else ""
    data = {"first_backward": fb}
    if s.get("scaled_backward") is not None:
        data["scaled_backward"] = s["scaled_backward"]
    if fb.get("grad_of") == "loss":
        suggestion = ("The loss (with its weight) is too large for these gradients: lower the loss weight or "
                      "normalise the loss" + ("; in fp16 prefer bf16, whose range is float32's." if p == "fp16" else "."))
    else:
        suggestion = ("Look for operations whose derivative blows up at the values seen (sqrt or pow at 0, log "
                      "near 0, division by small numbers, large weights); add eps/clamping there"
                      + ("; in fp16 prefer bf16 or keep this module in float32." if p == "fp16" else "."))
    return Finding(
        "AMP206", "nonfinite-in-backward", Severity.ERROR,
        f"{where}: {what} is {_shown(fb)} in the backward pass in {p}{unscaled}, although the forward "
        "pass is finite",
        suggestion, Location(module=fb.get("module")), p, data,
    )
