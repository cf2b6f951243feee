"""trace pieces that need no child process: analysis of recorded events, install/remove, the CLI."""
from __future__ import annotations

import torch

from troubleshooter.cli import build_parser
from troubleshooter.trace import analysis
from troubleshooter.trace.recorder import _inspect_saved


def _series(skips: list[bool], scale: float = 65536.0) -> list[dict]:
    out = []
    for i, skipped in enumerate(skips):
        after = scale / 2 if skipped else scale
        out.append({"step": i, "skipped": skipped, "via_scaler": True, "scale": scale, "scale_after": after,
                    "loss": 1.0})
        scale = after
    return out


def test_skip_rate_needs_enough_steps_before_it_warns():
    # calibration (first skip) then 2 of 4 later steps skipped: a warning over 14 steps, info over 5
    short = analysis.skiprate_findings(_series([True, False, True, False, True]))
    assert [f.severity.value for f in short] == ["info"] and "inconclusive" in short[0].message
    long = analysis.skiprate_findings(_series([True] + [False, True] * 4 + [False] * 5))
    assert [f.severity.value for f in long] == ["warning"]
    assert long[0].data["skipped_steps"] == [0, 2, 4, 6, 8]
    assert analysis.skiprate_findings(_series([True, False, False, False, False, False])) == []


def test_violations_group_by_rule_and_line():
    v = [{"rule": "AMP101", "path": "/p/u.py", "line": 3, "function": "f", "step": s, "message": "m", "data": {}}
         for s in range(4)]
    v.append({"rule": "AMP101", "path": "/p/u.py", "line": 9, "function": "g", "step": 0, "message": "m", "data": {}})
    found = analysis.protocol_findings(v)
    assert [(f.location.line, f.data["count"], f.data["steps"]) for f in found] == [(3, 4, [0, 1, 2, 3]), (9, 1, [0])]
    assert found[0].name == "clip-before-unscale" and found[0].severity.value == "error"


def test_saved_objects_with_and_without_scaler_state():
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert _inspect_saved({"model": model.state_dict(), "opt": opt.state_dict()}) == (True, False)
    assert _inspect_saved({"opt": opt.state_dict(), "scaler": {"scale": 1.0}}) == (True, True)
    assert _inspect_saved([{"o": {"state": {}, "param_groups": []}}, torch.amp.GradScaler("cpu")]) == (True, True)
    assert _inspect_saved(model.state_dict()) == (False, False)


def test_install_and_remove_restore_torch():
    from troubleshooter.trace.patches import install
    from troubleshooter.trace.recorder import Recorder

    before = (torch.save, torch.autograd.backward, torch.Tensor.backward, torch.nn.utils.clip_grad_norm_,
              torch.amp.GradScaler.step, torch.amp.autocast_mode.autocast.__enter__, torch.nn.Module.to)
    rec = Recorder(10)
    installed = install(rec)
    try:
        assert torch.save is not before[0] and torch.amp.GradScaler.step is not before[4]
        x = torch.ones(2, requires_grad=True)
        (x * 2).sum().backward()
        assert [e["kind"] for e in rec.timeline[0]["events"]] == ["backward"]
        assert rec.timeline[0]["events"][0]["path"] == __file__
    finally:
        installed.remove()
    after = (torch.save, torch.autograd.backward, torch.Tensor.backward, torch.nn.utils.clip_grad_norm_,
             torch.amp.GradScaler.step, torch.amp.autocast_mode.autocast.__enter__, torch.nn.Module.to)
    assert after == before


def test_cli_passes_everything_after_double_dash_to_the_script():
    args = build_parser().parse_args(["trace", "train.py", "--steps", "5", "--format", "json", "--",
                                      "--steps", "9", "--lr", "0.1"])
    assert (args.script, args.steps, args.format) == ("train.py", 5, "json")
    assert args.script_args == ["--steps", "9", "--lr", "0.1"]
    assert build_parser().parse_args(["trace", "train.py"]).script_args == []


# -- found on the held-out scripts (tests/fixtures/trace/heldout) ---------------------------
def _recorder_with_optimizer():
    from troubleshooter.trace.recorder import Recorder

    rec = Recorder(steps=100)
    rec.on_optimizer_init(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1))
    return rec


def test_a_per_epoch_scheduler_is_not_a_per_iteration_one():
    # torchvision references: scheduler.step() once per epoch, after the epoch's last scaler step
    rec = _recorder_with_optimizer()
    per_epoch, per_iteration = object(), object()
    for _ in range(4):
        rec.complete_step(skipped=True, via_scaler=True)
    rec.on_scheduler_step(per_epoch)
    assert rec.violations == [] and rec.scheduler_after_scaler_steps == 0
    rec.complete_step(skipped=True, via_scaler=True)
    rec.on_scheduler_step(per_epoch)  # one step since its last call: as per-iteration as it gets
    rec.complete_step(skipped=True, via_scaler=True)
    rec.on_scheduler_step(per_iteration)  # first call: 6 steps since the start
    assert [v["rule"] for v in rec.violations] == ["AMP107"] and rec.scheduler_after_scaler_steps == 1


def test_fp16_backward_in_a_loop_without_an_optimizer_is_amp103():
    # word_language_model updates p.data itself: no optimizer step ever closes an iteration
    from troubleshooter.trace.recorder import Recorder

    def loop(rec, n):
        for _ in range(n):
            rec.on_autocast_enter(torch.autocast("cpu", dtype=torch.float16))
            rec.on_autocast_exit()
            rec.on_backward(torch.ones((), requires_grad=True))

    rec = Recorder(steps=100)
    loop(rec, 1)
    assert rec.violations == []  # one backward could be a gradient probe, not training
    loop(rec, 70)
    assert [v["rule"] for v in rec.violations] == ["AMP103"] and len(rec.backwards) <= 64
    with_opt = _recorder_with_optimizer()  # an optimizer: complete_step decides, as before
    loop(with_opt, 3)
    assert with_opt.violations == []


def test_the_module_whose_own_code_made_the_value_is_named():
    made = {"module": "blocks.1.attn.proj", "inputs_finite": False,
            "source": "code in the forward() of 'blocks.1.attn' (Attention) outside any submodule"}
    assert analysis._making_module(made) == "blocks.1.attn"
    assert analysis._making_module({**made, "source": "code in the forward() of '<root>' (Net) outside any submodule"}) == ""
    assert analysis._making_module({**made, "source": "the model's input batch is already non-finite"}) is None
    assert analysis._making_module({**made, "inputs_finite": True}) is None and analysis._making_module(None) is None


def test_an_overflow_inside_a_modules_own_code_is_amp202_when_float32_is_finite():
    fwd = {"module": "blocks.1.attn.proj", "class": "Linear", "dtype": "float16", "phase": "forward", "kind": "nan",
           "created": False, "inputs_finite": False, "input_max_abs": ["nan"], "output_max_abs": ["nan"],
           "call_index": 10, "occurrence": 1, "autocast": "float16",
           "source": "code in the forward() of 'blocks.1.attn' (Attention) outside any submodule"}
    event = {"step": 0, "skipped": True, "loss": 63.7, "precision": "fp16", "autocast": "float16", "forward": fwd,
             "backward": None, "loss_grad_nonfinite": False, "mode": "re-run of the failing step",
             "parameters_nonfinite_before": [], "where": {"path": "/p/model.py", "line": 19, "module": "blocks.1.attn"}}
    ref = {"precision": "fp32", "module": "blocks.1.attn", "finite": True, "max_abs": 99.7}
    [f] = analysis.numerics_findings({"events": [{**event, "reference": ref}]}, [])
    assert (f.rule, f.location.module, f.location.path) == ("AMP202", "blocks.1.attn", "/p/model.py")
    assert f.data["first_nonfinite_output"] == "blocks.1.attn.proj" and "65504" in f.message
    [g] = analysis.numerics_findings({"events": [{**event, "reference": {**ref, "finite": False}}]}, [])
    assert (g.rule, g.location.module) == ("AMP205", "blocks.1.attn")  # NaN in float32 too: not an overflow
    assert "float32_check" not in g.data
    [h] = analysis.numerics_findings({"events": [event]}, [])  # no float32 run: overflow not ruled out
    assert h.rule == "AMP205" and h.data["float32_check"] == "not run" and "not ruled out" in h.message


def test_the_first_watched_call_keeps_its_keyword_arguments():
    # model(**inputs) / model(x, labels=y): the loss is computed from a keyword argument, and a
    # re-run of the failing step without it would compute no loss and find nothing
    from torch import nn

    from troubleshooter.trace.numerics import Numerics
    from troubleshooter.trace.recorder import Recorder

    class WithLabels(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 2)

        def forward(self, x, labels=None):
            return self.lin(x)

    num = Numerics(Recorder(steps=100), nan=False, headroom=False)
    try:
        WithLabels()(torch.ones(2, 3), labels=torch.zeros(2))
        args, kwargs, _ = num._last_in
        assert len(args) == 1 and set(kwargs) == {"labels"}
    finally:
        num.close()  # also pops the loss watch armed when the forward returned
    assert torch._C._len_torch_function_stack() == 0


def test_nan_mode_float32_check_skipped_on_nonfinite_parameters_keeps_one_set_of_hooks():
    # --nan, fp16 without GradScaler: the optimizer already wrote NaN into the weights, so the
    # float32 re-run is not the step's model and is skipped; the per-module hooks must stay as
    # they were (not a second HookSet on top of the first)
    from torch import nn

    from troubleshooter.trace.numerics import Numerics
    from troubleshooter.trace.recorder import Recorder

    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2))

    def hook_count():
        return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())

    num = Numerics(Recorder(steps=100), nan=True, headroom=False)
    try:
        with torch.autocast("cpu", dtype=torch.float16):
            model(torch.ones(2, 3))
        before = hook_count()
        with torch.no_grad():
            model[0].weight.fill_(float("nan"))
        event = {}
        report = type("Report", (), {"forward": {"inputs_finite": False,
                                                 "source": "code in the forward() of '<root>' (Sequential)"}})()
        num._nan_reference(event, report)
        assert hook_count() == before and "reference" not in event
    finally:
        num.close()
    assert hook_count() == 0 and torch._C._len_torch_function_stack() == 0


def test_the_loss_watch_records_the_scripts_ops_only_and_the_tracer_times_itself():
    # the root model's hooks run before the watch is armed and scaler.scale() stops it: none of
    # the tracer's own tensor calls (or GradScaler's) pass through it as the script's loss ops;
    # each completed step leaves a mark for the report's "tracing added about X ms per step"
    from torch import nn

    from troubleshooter.trace.numerics import Numerics
    from troubleshooter.trace.patches import install
    from troubleshooter.trace.recorder import Recorder
    from troubleshooter.trace.report import overhead_line

    rec = Recorder(steps=100)
    num = Numerics(rec, nan=False, headroom=False)
    rec.on_step = num.on_step
    installed = install(rec)
    try:
        model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu")
        x, y = torch.ones(2, 3), torch.zeros(2, 1)
        for _ in range(3):
            loss = ((model(x) - y) ** 2).mean()
            scaled = scaler.scale(loss)
            assert torch._C._len_torch_function_stack() == 0  # stopped at scale()
            assert [r["func"].__name__ for r in num.outside.records] == ["sub", "pow", "mean"]
            assert {r["where"][0] for r in num.outside.records} == {__file__}
            scaled.backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
        assert sorted(num._out_grads) == [0]  # the output gradient kept for a re-run
    finally:
        installed.remove()
        num.close()
    cost = rec.overhead()
    assert rec.steps == 3 and cost["steps_timed"] == 2 and 0 < cost["per_step_ms"] < cost["step_ms"]
    assert rec.own_s > 0 and cost["total_s"] >= 0
    assert overhead_line({"overhead": cost}).startswith(f"Tracing added about {cost['per_step_ms']:.3g} ms per step (")
    assert overhead_line({"overhead": Recorder(steps=1).overhead()}) is None  # no step: nothing to state


def test_a_remembered_line_is_the_frames_own_and_a_traced_frame_is_read_afresh():
    import sys

    from troubleshooter.trace.locate import _lines, line_of

    def here():
        return line_of(sys._getframe(1))

    start = sys._getframe().f_lineno
    lines = [here() for _ in range(3)]  # one call site, read once and remembered
    other = here()  # another call site of the same function: its own line
    assert lines == [start + 1] * 3 and other == start + 2
    before = len(_lines)
    sys.settrace(lambda *a: None)  # a debugger's tracer: the frame's line is read, not remembered
    try:
        frame = sys._getframe()
        frame.f_trace = lambda *a: None
        assert line_of(frame) == frame.f_lineno
    finally:
        sys.settrace(None)
        frame.f_trace = None
    assert len(_lines) == before


def test_a_clip_over_parameters_unscale_did_not_reach_is_amp101_with_its_counts():
    from torch import nn

    from troubleshooter.trace.patches import install
    from troubleshooter.trace.recorder import Recorder

    rec = Recorder(steps=100)
    installed = install(rec)
    try:
        a, b = nn.Linear(3, 1), nn.Linear(3, 1)
        opt_a, opt_b = torch.optim.SGD(a.parameters(), lr=0.1), torch.optim.SGD(b.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu")
        x = torch.ones(2, 3)
        for _ in range(2):
            scaler.scale((a(x) + b(x)).sum()).backward()
            scaler.unscale_(opt_a)  # opt_b's gradients are still scaled at the clip
            torch.nn.utils.clip_grad_norm_([*a.parameters(), *b.parameters()], 1.0)
            scaler.step(opt_a)
            scaler.step(opt_b)
            scaler.update()
            opt_a.zero_grad()
            opt_b.zero_grad()
    finally:
        installed.remove()
    clips = [v for v in rec.violations if v["rule"] == "AMP101"]
    assert len(clips) == 2 and clips[0]["data"] == {"scaled_params": 2}
    assert "(2 of 4 parameters not unscaled)" in clips[0]["message"]
    assert rec.steps == 4 and [s["scale"] for s in rec.series] == [65536.0] * 4  # read as get_scale() gives it
