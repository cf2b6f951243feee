"""trace: a non-finite loss made outside the model (a loss helper in another file) is pinned to
the line of the op that made it, not to backward().

In-process tests of `trace.outside.OutsideOps` (cheap), the findings built from it, and the CLI
on the multi-file fixture tests/fixtures/trace/heldout/loss_helpers (train.py + losses.py), run
concurrently as the issue's check runs them.
"""
from __future__ import annotations

import inspect
from concurrent.futures import ThreadPoolExecutor

import torch
from torch.overrides import TorchFunctionMode

from troubleshooter.trace.analysis import numerics_findings
from troubleshooter.trace.outside import OutsideOps

from .test_trace_heldout import CASES, problems_of, run_case


def _line_of(marker: str) -> int:
    """The line of this file holding `marker` (a comment next to the op under test)."""
    src = inspect.getsource(inspect.getmodule(_line_of)).splitlines()
    return 1 + next(i for i, line in enumerate(src) if line.rstrip().endswith("# " + marker))


def test_log_of_zero_is_named_at_its_line_and_nothing_is_read_while_finite():
    ops = OutsideOps()
    p = torch.tensor([0.5, 0.0, 1.0])
    ops.arm("bfloat16")
    q = p * 1.0
    loss = -torch.log(q).mean()  # log-line
    ops.disarm()
    assert torch._C._len_torch_function_stack() == 0 and not torch.isfinite(loss)
    found = ops.scan(step=3)
    assert found["op"] == "torch.log" and found["path"] == __file__ and found["line"] == _line_of("log-line")
    assert found["step"] == 3 and found["phase"] == "forward" and found["autocast"] == "bfloat16"
    assert [r["func"].__name__ for r in ops.records] == ["mul", "log", "mean", "neg"]


def test_a_value_that_came_in_non_finite_is_not_blamed_on_the_loss_code():
    ops = OutsideOps()
    model_output = torch.tensor([1.0, float("nan")])
    ops.arm()
    (model_output * 2).sum()
    ops.disarm()
    assert ops.scan(0) is None


def test_an_intended_minus_inf_mask_is_not_blamed_for_a_later_nan():
    ops = OutsideOps()
    logits = torch.randn(4, 4)
    count = torch.zeros(())
    ops.arm()
    masked = logits.masked_fill(torch.eye(4, dtype=torch.bool), float("-inf"))
    scaled = masked * 2.0  # -inf flows on: not a finding either
    per_row = torch.logsumexp(scaled, dim=1)
    loss = per_row.sum() / count  # zero-count-line
    ops.disarm()
    found = ops.scan(0)
    assert found["op"] == "Tensor.div" and found["line"] == _line_of("zero-count-line")


def test_an_in_place_op_is_blamed_not_the_op_that_made_its_tensor():
    ops = OutsideOps()
    x = torch.zeros(3)
    ops.arm()
    y = x * 1.0
    y.div_(0.0)  # inplace-line
    ops.disarm()
    found = ops.scan(0)
    assert found["op"] == "Tensor.div_" and found["line"] == _line_of("inplace-line") and found["inplace"]


def test_float16_overflow_is_told_from_a_log_of_zero_by_a_float32_rerun():
    ops = OutsideOps()
    big = torch.full((8,), 200.0, dtype=torch.float16)
    ops.arm("float16")
    (big * big).sum()  # 8 * 40000 > 65504
    ops.disarm()
    found = ops.scan(0)
    assert found["op"] == "Tensor.sum" and found["reference"] == {"precision": "fp32", "finite": True, "max_abs": 320000.0}
    ops.clear()
    zero = torch.zeros(2, dtype=torch.float16)
    ops.arm("float16")
    torch.log(zero)
    ops.disarm()
    assert ops.scan(0)["reference"]["finite"] is False  # -inf in float32 too: not a range problem


def test_sqrt_at_zero_is_found_in_backward():
    ops = OutsideOps()
    emb = torch.randn(4, 3, requires_grad=True)
    ops.arm()
    d = (emb[:, None] - emb[None]).pow(2).sum(-1).sqrt()  # sqrt-line
    loss = torch.relu(1.0 - d).mean()
    ops.disarm()
    loss.backward()
    assert torch.isfinite(loss) and not torch.isfinite(emb.grad).all()
    assert ops.scan(0) is None
    found = ops.scan_backward(0)
    assert found["op"] == "Tensor.sqrt" and found["line"] == _line_of("sqrt-line") and found["phase"] == "backward"


def test_disarmed_records_nothing_and_a_mode_of_the_script_stays_on_the_stack():
    ops = OutsideOps()
    torch.ones(2) * 2
    assert ops.records == []

    class ScriptMode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    ops.arm()
    with ScriptMode() as mine:
        ops.disarm()  # the script's mode is on top: stop recording, pop nothing
        torch.ones(2) * 3
        assert torch._C._get_function_stack_at(torch._C._len_torch_function_stack() - 1) is mine
    ops.disarm()
    assert torch._C._len_torch_function_stack() == 0 and ops.records == []


def test_findings_point_at_the_op_with_module_null():
    base = {"path": "/w/losses.py", "line": 10, "function": "bce", "step": 2, "dtype": "bfloat16",
            "op": "torch.log", "loss": "nan", "precision": "bf16", "phase": "forward", "reference": None}
    rerun_event = {"step": 2, "skipped": False, "loss": "nan", "forward": None, "backward": {"module": ""},
                   "mode": "re-run of the failing step", "where": {"path": "/w/train.py", "line": 5}}
    (f,) = numerics_findings({"events": [rerun_event], "outside": base}, [])
    assert (f.rule, f.location.path, f.location.line, f.location.module) == ("AMP205", "/w/losses.py", 10, None)
    assert f.data["made_outside_model"] and f.data["op"] == "torch.log" and f.precision == "bf16"
    over = {**base, "dtype": "float16", "precision": "fp16", "loss": "inf",
            "reference": {"precision": "fp32", "finite": True, "max_abs": 83132.5}}
    assert numerics_findings({"events": [], "outside": over}, [])[0].rule == "AMP202"
    back = {**base, "phase": "backward", "loss": 0.5}
    assert numerics_findings({"events": [], "outside": back}, [])[0].rule == "AMP206"
    # a module that made it in an earlier step's forward keeps the module finding
    model_event = {**rerun_event, "step": 1, "forward": {"module": "fc", "kind": "nan"}}
    assert numerics_findings({"events": [model_event], "outside": base}, [])[0].location.module == "fc"
    # ... and in the same step's forward too: the loss was non-finite because the output was
    assert numerics_findings({"events": [{**model_event, "step": 2}], "outside": base}, [])[0].location.module == "fc"
    # a module that went non-finite only in a later step does not hide the loss op that came first
    later = {**model_event, "step": 5}
    (f,) = numerics_findings({"events": [later], "outside": base}, [])
    assert (f.rule, f.location.path, f.location.module) == ("AMP205", "/w/losses.py", None) and f.data["step"] == 2


CLI = ["loss-log-of-zero-bf16", "loss-fp16-overflow-in-helper", "loss-sqrt-at-zero-backward", "loss-stable-fp16"]


def test_cli_points_into_losses_py_side_by_side():
    """fp32/bf16 log of zero, fp16 overflow, sqrt at 0 in backward, and a clean fp16 run."""
    cases = [c for c in CASES if c["id"] in CLI]
    assert len(cases) == len(CLI)
    with ThreadPoolExecutor(len(cases)) as pool:
        results = list(pool.map(run_case, cases))
    for case, (status, report) in zip(cases, results):
        assert problems_of(case, status, report) == [], case["id"]
    made = [f for _, r in results for f in r["findings"] if f["data"].get("made_outside_model")]
    assert {f["rule"] for f in made} == {"AMP202", "AMP205", "AMP206"}
