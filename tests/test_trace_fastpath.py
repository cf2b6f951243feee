"""trace's steady fast path: on a steady step each wrapped call that is the template step's next
one, from the same place, copies the template's event instead of running its `on_*` method. It
must be exact: a deviation planted at every position of a steady step (an extra call, a missing
one, the same call from another line, autocast switched on around it, a skipped step) gives the
violations, timeline and step series that --no-steady gives (the timeline's "instruments" marker
aside), and the same report of the autocast regions entered (their counts and steps). In process
and on a tiny model: each run is a few milliseconds."""
from __future__ import annotations

import contextlib
import io

import pytest
import torch
from torch import nn

from troubleshooter.trace.numerics import Numerics
from troubleshooter.trace.patches import install
from troubleshooter.trace.recorder import STEADY_AFTER, Recorder

CALLS = ("forward", "backward", "unscale", "clip", "step", "update", "sched", "zero_grad")
DEVIATE_AT = 6  # a steady step: steps 0-2 set the pattern, 3 is the third equal one, 4 on are steady
STEPS = 9


def _extra(what: str, model, opt, scaler, sched, x) -> None:
    """A call the steady steps do not make."""
    if what == "unscale":
        scaler.unscale_(opt)
    elif what == "clip":
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
    elif what == "backward":  # an unscaled backward
        ((model(x) ** 2).mean()).backward()
    elif what == "opt_step":
        opt.step()
    elif what == "sched":
        sched.step()
    elif what == "update":
        scaler.update()
    elif what == "save":
        torch.save({"optimizer": opt.state_dict()}, io.BytesIO())


def _loop(deviation: tuple, rec: Recorder) -> None:
    """A scaled loop; at DEVIATE_AT, `deviation` is (kind, position, what): before the call at
    `position`, an extra call `what` ("extra"), that call left out ("skip") or made from another
    line ("moved": another line, so another event), the call inside an enabled bfloat16 autocast
    region ("autocast", or "silent autocast": switched on without a `with`), the same call on an
    unscaled loss or gradient ("unscaled"), a non-finite loss GradScaler skips ("inf") or a
    finite one with a non-finite gradient (before the unscale_: "inf grad", after a read of the
    timeline in that step, the script stopping after the step: "read, inf grad"), the
    same call on another GradScaler or optimizer ("other scaler", "other optimizer": the fast
    path's induction holds for the last step's objects only), or the script stopping there
    ("stop": the events of the calls matched so far, and the state changes the fast path defers,
    made only at a step's close, must be there all the same)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    scaler = torch.amp.GradScaler("cpu")
    other_opt = torch.optim.SGD(model.parameters(), lr=0.01)
    other_scaler = torch.amp.GradScaler("cpu")
    x, y = torch.ones(2, 3), torch.zeros(2, 1)
    outside = nn.Parameter(torch.ones(2))  # a parameter no optimizer holds, its gradient never unscaled
    kind, position, what = deviation
    for step in range(STEPS):
        here = step == DEVIATE_AT
        plan = {name: "as usual" for name in CALLS}
        if here:
            plan[CALLS[position]] = kind
        loss = None
        for name in CALLS:
            if plan[name] == "stop" or name == "update" and plan["unscale"] == "read, inf grad":
                return
            if plan[name] == "extra":
                try:  # what torch itself refuses (an update with no step) is the script's business
                    _extra(what, model, opt, scaler, sched, x)
                except (AssertionError, RuntimeError):
                    pass
            if plan[name] == "skip":
                continue
            try:  # after a deviation torch may refuse a call (unscale_ twice): the script's business
                ac = torch.autocast("cpu", dtype=torch.bfloat16) if plan[name] == "autocast" else contextlib.nullcontext()
                if plan[name] == "silent autocast":  # switched on without a `with`: no event says so
                    torch.set_autocast_enabled("cpu", True)
                moved = plan[name] == "moved"
                if plan[name] == "other scaler":
                    scaler = other_scaler  # from here on: a script that makes a new GradScaler
                if plan[name] == "other optimizer":
                    opt = other_opt
                if plan[name] in ("inf grad", "read, inf grad"):  # a finite loss, a non-finite gradient: a skip
                    if plan[name] == "read, inf grad":  # the timeline read first (as a result snapshot does)
                        assert rec.timeline
                    next(model.parameters()).grad.fill_(float("inf"))
                with ac:
                    if name == "forward":
                        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):
                            loss = ((model(x) - y) ** 2).mean()
                        if here and kind == "inf":
                            loss = loss * float("inf")
                    elif name == "backward":
                        if moved:
                            scaler.scale(loss).backward()
                        else:  # the same place, the loss unscaled when planted
                            (loss if plan[name] == "unscaled" else scaler.scale(loss)).backward()
                    elif name == "unscale":
                        if moved:
                            scaler.unscale_(opt)
                        else:
                            scaler.unscale_(opt)
                    elif name == "clip":
                        params = list(model.parameters())
                        if plan[name] == "unscaled":  # the same place, a gradient no unscale_ reached
                            outside.grad = torch.ones(2)
                            params.append(outside)
                        if moved:
                            torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
                        else:
                            torch.nn.utils.clip_grad_norm_(params, 1e9)
                    elif name == "step":
                        if moved:
                            scaler.step(opt)
                        else:
                            scaler.step(opt)
                    elif name == "update":
                        if moved:
                            scaler.update()
                        else:
                            scaler.update()
                    elif name == "sched":
                        if moved:
                            sched.step()
                        else:
                            sched.step()
                    elif moved:
                        opt.zero_grad()
                    else:
                        opt.zero_grad()
            except (AssertionError, RuntimeError, ValueError):
                pass
            finally:
                torch.set_autocast_enabled("cpu", False)


def _traced(deviation: tuple, steady_after: int) -> Recorder:
    rec = Recorder(steps=100, steady_after=steady_after)
    num = Numerics(rec, nan=False, headroom=False)
    rec.on_step = num.on_step
    installed = install(rec)
    try:
        _loop(deviation, rec)
    finally:
        installed.remove()
        num.close()
    return rec


def _seen(rec: Recorder) -> tuple:
    timeline = [{k: v for k, v in entry.items() if k != "instruments"} for entry in rec.timeline]  # caught up
    series = [{k: v for k, v in s.items() if k not in ("steady", "scaler")} for s in rec.series]  # scaler: its id()
    return (rec.violations, timeline, series, rec.steps, rec.precision_seen(),  # autocast regions: counts, steps
            _protocol_state(rec))


def _protocol_state(rec: Recorder) -> dict:
    """The per-step protocol state the checks read, objects named by their order of appearance
    (the two runs make their own): what the fast path defers must be caught up when read."""
    names: dict[int, int] = {}

    def name(key: int) -> int:
        return names.setdefault(key, len(names))

    return {"stage": sorted((name(s), name(o), v) for (s, o), v in rec.scaler_stage.items()),
            "stepped": sorted((name(s), v) for s, v in rec.scaler_stepped_since_update.items()),
            "update_mark": sorted((name(s), v) for s, v in rec.update_mark.items()),
            "backwards": [(b["scaled"], b["fp16"]) for b in rec.backwards], "scaled_pending": rec.scaled_pending,
            "unscaled": [name(id(o)) for o in rec.unscaled_optimizers], "fp16": rec.fp16_autocast_since_step,
            "scheduler": (rec.scheduler_after_scaler_steps, rec.scheduler_where, sorted(rec.steps_at_scheduler.values())),
            "last_step": (rec.last_step_skipped, rec.last_step_via_scaler, rec.scaler_steps),
            "autocast_stack": list(rec.autocast_stack), "in_scaler_step": len(rec.in_scaler_step)}


DEVIATIONS = [("extra", position, what) for position in range(len(CALLS))
              for what in ("unscale", "clip", "backward", "opt_step", "sched", "update", "save")]
DEVIATIONS += [(kind, position, None) for kind in ("skip", "moved", "autocast", "silent autocast")
               for position in range(len(CALLS))]
DEVIATIONS += [("unscaled", CALLS.index("backward"), None), ("unscaled", CALLS.index("clip"), None)]
DEVIATIONS += [("inf", 0, None), ("none", 0, None)]
DEVIATIONS += [(kind, CALLS.index("unscale"), None) for kind in ("inf grad", "read, inf grad")]
DEVIATIONS += [("stop", position, None) for position in range(len(CALLS))]
DEVIATIONS += [("other scaler", CALLS.index(name), None) for name in ("backward", "unscale", "step", "update")]
DEVIATIONS += [("other optimizer", CALLS.index(name), None) for name in ("unscale", "step", "zero_grad")]


@pytest.mark.parametrize("deviation", DEVIATIONS, ids=lambda d: "-".join(map(str, d)))
def test_a_deviation_anywhere_in_a_steady_step_is_recorded_as_without_steady_state(deviation):
    fast = _traced(deviation, STEADY_AFTER)
    full = _traced(deviation, 0)
    assert fast.fast_steps > 0  # the fast path ran (before the deviation at least)
    assert _seen(fast) == _seen(full)


def test_the_fast_path_covers_a_steady_step_and_leaves_it_at_a_deviation():
    clean = _traced(("none", 0, None), STEADY_AFTER)
    # steps 4-8 are steady; every window from the one after step 3's close follows the template
    assert clean.fast_steps == STEPS - STEADY_AFTER - 1
    moved = _traced(("moved", CALLS.index("unscale"), None), STEADY_AFTER)
    assert moved.fast_steps < clean.fast_steps
    assert not _traced(("none", 0, None), 0).fast_steps


def test_the_tracers_own_time_is_sampled_on_steady_steps_and_said_so():
    from troubleshooter.trace.report import overhead_line

    clean = _traced(("none", 0, None), STEADY_AFTER)
    cost = clean.overhead()
    # the first template-following window is timed (the sample), the next ones are given its time
    assert 0 < clean.sampled_steps < clean.fast_steps and cost["steps_sampled"] == clean.sampled_steps
    assert cost["per_step_ms"] > 0 and cost["total_s"] > 0
    assert f"{clean.sampled_steps} of them steady steps given a sampled steady step's time" in overhead_line(
        {"overhead": cost})
    assert _traced(("none", 0, None), 0).overhead()["steps_sampled"] == 0  # --no-steady: every step timed


def test_the_forward_post_hook_stands_down_while_steady_and_comes_back_last():
    rec = Recorder(steps=100, steady_after=STEADY_AFTER)
    num = Numerics(rec, nan=False, headroom=False)
    rec.on_step = num.on_step
    installed = install(rec)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu")
    x = torch.ones(2, 3)

    def step():
        scaler.scale(model(x).pow(2).mean()).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()

    try:
        step()
        assert list(model._forward_hooks.values()) == [num._root_post]
        model.register_forward_hook(lambda *a: None)  # the script's own, registered after ours
        for _ in range(6):
            step()
        assert rec.steady and len(model._forward_hooks) == 1  # ours stood down, the script's stays
        rec.rearm()  # a deviation
        step()
        assert list(model._forward_hooks.values())[-1] == num._root_post  # back, after the script's
    finally:
        installed.remove()
        num.close()
