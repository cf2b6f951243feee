"""Find the first module whose output or gradient is NaN/Inf: in a user's loop and as a check.

Two entry points share the hook machinery of `nanhooks`:
- `nanhunt(model)`: a context manager / hook object for a user's own training script; it
  synchronises once per `step()` and reports the first non-finite module on the step it
  happens (log, record, or raise `NonFiniteError`).
- `hunt_nonfinite(workload, device, precisions)`: the engine's `nan` check; one seeded
  training step per precision, turned into AMP205/AMP206/AMP202 findings.
The text of an event and the findings are built in `nonfinite_findings`, without torch (the
trace parent builds the same findings and does not import torch).
"""
from __future__ import annotations

import logging
import math
from typing import Any, Sequence

import torch
from torch import nn

from ..findings import Finding
from ..workload import Workload
from . import precision as prec
import time

from .budget import expected_step_s, fits, record_step_s
from .nanhooks import HookSet, StepReport
from .nonfinite_findings import format_event, hunt_findings, section_summary
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
    from .collapse_findings import fold_consequences

    findings = fold_consequences(hunt_findings(sections, traces) + _collapses(workload, device, sections, traces, seed))
    return {"device": str(device), "precisions": sections, "findings": findings}


def _collapses(workload: Workload, device: torch.device, sections: dict, traces: dict, seed: int) -> list[Finding]:
    """AMP212: a half-precision run whose first step stayed finite but flattened a module's output
    (all zeros, one value) where fp32's varies; the op that started it from one more forward."""
    from .collapse import first_collapse
    from .collapse_findings import collapse_finding, is_collapse_candidate

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
        section["summary"] = section_summary(section)
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

