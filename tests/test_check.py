"""The check orchestration and command: JSON contract, exit codes, failures kept per check."""
import json
import sys
import time
import types
from pathlib import Path

import pytest
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "check"))
import check_workloads as cw  # noqa: E402

from troubleshooter.cli import main  # noqa: E402
from troubleshooter.engine import check  # noqa: E402
from troubleshooter.errors import UserError  # noqa: E402
from troubleshooter.findings import Finding, Location  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "check"
KEYS = {"device", "spec", "findings", "capability", "alignment", "skiprate", "nan", "headroom"}


def _cli_json(capsys, *argv):
    """`check ... --format json`; with a budget no busy host reaches (a test may give its own,
    later on the line), so what the tests assert does not depend on the machine's load."""
    code = main(["check", "--budget", "600", *argv, "--device", "cpu", "--format", "json"])
    out = capsys.readouterr().out
    return code, (json.loads(out) if out.strip() else None)


def _seen(result):
    return {(f["rule"], f["module"], f["precision"]) for f in result["findings"]
            if f["severity"] in ("warning", "error")}


def test_command_constants_match_the_engine():
    from troubleshooter.commands import check as command

    assert command.CHECKS == check.CHECKS and command.DEFAULT_STEPS == check.DEFAULT_STEPS
    assert command.DEFAULT_BUDGET_S == check.FIRST_ANSWER_BUDGET_S


def test_parse_only_orders_and_validates():
    assert check.parse_only("nan, alignment") == ["alignment", "nan"]
    assert check.parse_only(None) == list(check.CHECKS)
    with pytest.raises(UserError, match="unknown check"):
        check.parse_only("alignment,speed")


def test_run_check_contract_with_skipped_checks_and_progress():
    calls = []
    r = check.run_check(cw.mlp((32, 64, 10), batch_size=16), device="cpu", only="alignment,headroom",
                        steps=3, progress=lambda f, m: calls.append((f, m)))
    assert KEYS <= set(r)
    assert r["skiprate"] is None and r["nan"] is None and r["capability"] is None
    assert r["skipped"]["nan"].startswith("not selected")
    assert isinstance(r["alignment"], list) and r["headroom"]["first_overflow"] is None
    assert r["device"]["type"] == "cpu" and r["exit_code"] == 0 and r["errors"] == {}
    for f in r["findings"]:
        assert {"rule", "severity", "module", "precision", "message", "suggestion", "data"} <= set(f)
    fractions = [f for f, _ in calls]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0 and "alignment" in calls[0][1]
    json.dumps(r, allow_nan=False)


def test_same_seed_same_report():
    wl = cw.mlp((32, 64, 10), batch_size=16)
    a = check.run_check(wl, device="cpu", only="skiprate,headroom", steps=2, seed=5)
    b = check.run_check(wl, device="cpu", only="skiprate,headroom", steps=2, seed=5)
    for r in (a, b):
        r.pop("timings_s")
    assert a == b


def test_a_failing_check_is_an_error_entry_and_the_others_still_run(monkeypatch):
    def oom(*a):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    def broken(*a):
        raise RuntimeError("shape mismatch somewhere")

    monkeypatch.setitem(check._RUNNERS, "skiprate", oom)
    monkeypatch.setitem(check._RUNNERS, "nan", broken)
    r = check.run_check(cw.mlp((32, 64, 10), batch_size=16), device="cpu", only="skiprate,nan,headroom")
    assert r["errors"]["skiprate"]["kind"] == "out_of_memory" and r["skiprate"] is None
    assert r["errors"]["nan"] == {"kind": "failed",
                                  "message": "the nan check failed: RuntimeError: shape mismatch somewhere"}
    assert r["headroom"] is not None
    assert r["exit_code"] == 1  # nothing was verified where a check failed: not a clean run


def test_same_problem_from_two_checks_is_one_finding():
    a = Finding("AMP202", "fp16-overflow", "error", "nan says", "fix", Location(module="2"), "fp16", {"check": "nan"})
    b = Finding("AMP202", "fp16-overflow", "error", "headroom says", "fix", Location(module="2"), "fp16",
                {"check": "headroom"})
    c = Finding("AMP202", "fp16-overflow", "info", "near", "fix", Location(module="4"), "fp16", {"check": "headroom"})
    merged = check.merge_findings([a, b, c])
    assert [(f.location.module, f.data.get("confirmed_by")) for f in merged] == [("2", ["nan", "headroom"]), ("4", None)]


def test_nonfinite_numbers_become_strings():
    assert check.jsonable({"a": float("inf"), "b": [float("nan"), 1.5], "c": (1, -float("inf"))}) == \
        {"a": "inf", "b": ["nan", 1.5], "c": [1, "-inf"]}


def test_misaligned_spec_exits_1_with_findings_at_its_layers(capsys):
    code, r = _cli_json(capsys, str(FIXTURES / "misaligned.yaml"), "--only", "alignment")
    assert code == 1 and r["exit_code"] == 1
    assert {("AMP201", "0", None), ("AMP201", "2", None)} == _seen(r)


def test_underflow_spec_is_flagged_for_fp16(capsys):
    code, r = _cli_json(capsys, str(FIXTURES / "underflow.yaml"), "--only", "headroom")
    assert code == 1 and {("AMP203", "0", "fp16")} == _seen(r)  # one finding for the model
    (f,) = [f for f in r["findings"] if f["rule"] == "AMP203"]
    assert {m["module"] for m in f["data"]["modules"]} == {"0", "2"}


@pytest.mark.parametrize("spec", ["clean_mlp.yaml", "clean_cnn.yaml"])
def test_clean_specs_stay_clean(capsys, spec):
    code, r = _cli_json(capsys, str(FIXTURES / spec), "--only", "alignment,headroom,skiprate", "--steps", "3")
    assert code == 0 and _seen(r) == set(), r["findings"]


def test_overflow_spec_full_check_finds_fp16_overflow_at_layer_2_only(capsys, overflow_spec):
    code, r = _cli_json(capsys, str(overflow_spec), "--steps", "4", "--seed", "1")
    assert code == 1
    seen = _seen(r)
    assert ("AMP202", "2", "fp16") in seen
    assert not {s for s in seen if s[2] in ("bf16", "fp32")}  # only float16 breaks
    assert not {s for s in seen if s[0] == "AMP202" and s[1] != "2"}
    assert r["skiprate"]["recommendation"]["action"] == "bf16"
    assert all(r[k] is not None or k in r["errors"] for k in check.CHECKS)


def test_bad_input_exits_2(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  layers:\n    - Linaer: [4, 4]\ninput: {shape: [2, 4]}\n")
    assert main(["check", str(bad), "--device", "cpu"]) == 2
    assert "Linaer" in capsys.readouterr().err
    assert main(["check", str(FIXTURES / "clean_mlp.yaml"), "--only", "speed"]) == 2
    assert main(["check", str(FIXTURES / "clean_mlp.yaml"), "--steps", "0"]) == 2


def test_text_report_has_a_section_per_check(capsys):
    code = main(["check", str(FIXTURES / "misaligned.yaml"), "--device", "cpu", "--only", "alignment,headroom"])
    out = capsys.readouterr().out
    assert code == 1
    for title in ("Findings:", "== Alignment", "== fp16/bf16 headroom", "== fp16 skip rate"):
        assert title in out
    assert "skipped: not selected" in out and "253" in out


def test_device_info_on_cuda_reads_the_device_properties(monkeypatch):
    from types import SimpleNamespace

    props = SimpleNamespace(name="NVIDIA H100 80GB HBM3", major=9, minor=0, total_memory=80 * 2**30)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: props.name)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    info = check.device_info(torch.device("cuda"))
    assert info == {**info, "type": "cuda", "index": 0, "name": "NVIDIA H100 80GB HBM3",
                    "capability": "9.0", "memory_gb": 80.0}


def test_device_info_on_cpu_names_the_cpu_model_not_the_architecture():
    info = check.device_info(torch.device("cpu"))
    assert info["type"] == "cpu" and info["cpu_numbers"] is True
    from troubleshooter.engine.cpu_features import cpu_features

    model = cpu_features().get("model")
    if model:  # /proc/cpuinfo names the model (x86 Linux): the report must use it
        assert info["name"] == model
    assert "CPU" in info["summary"]


# ---------------------------------------------------------------- a check that could not run (issue 11.4)
def _dict_workload():
    """A model returning a dict with the default loss: every nan-check step fails on the loss."""
    from troubleshooter.spec.pyfile import _default_loss
    from troubleshooter.workload import Workload

    class DictModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 4)

        def forward(self, x):
            return {"logits": self.proj(x)}

    def batch(n, device, gen):
        return (torch.randn(n, 8, generator=gen).to(device),), torch.randint(0, 4, (n,), generator=gen).to(device)

    return Workload("dict", DictModel, batch, _default_loss, lambda ps: torch.optim.SGD(ps, lr=0.1), 4)


def test_a_check_that_ran_in_no_precision_is_an_error_and_exit_1():
    r = check.run_check(_dict_workload(), device="cpu", only="nan")
    assert r["errors"]["nan"]["kind"] == "failed"
    assert r["errors"]["nan"]["precisions"] == ["fp32", "fp16", "bf16"]
    assert "dict" in r["errors"]["nan"]["message"]
    assert r["findings"] == [] and r["exit_code"] == 1
    from troubleshooter.commands.check import render_text

    text = render_text(r)
    assert "No findings: nothing to fix" not in text and "NOT VERIFIED" in text


def test_dry_run_refuses_a_dict_model_without_loss_fn_with_exit_2(capsys):
    code = main(["check", "--python", str(FIXTURES / "dict_output_no_loss.py"), "--allow-exec",
                 "--only", "nan", "--device", "cpu", "--format", "json"])
    err = capsys.readouterr().err
    assert code == 2 and "loss_fn" in err and "logits" in err


def test_a_dict_with_its_own_loss_needs_no_loss_fn():
    from troubleshooter.spec import SpecSource, load_workload

    wl = load_workload(SpecSource.python_file(FIXTURES / "dict_output_own_loss.py"), allow_exec=True)
    r = check.run_check(wl, device="cpu", only="nan")
    assert r["errors"] == {} and r["exit_code"] == 0
    assert all(s["steps_run"] == 1 for s in r["nan"]["precisions"].values())


# ---------------------------------------------------------------- the time budget (issue 11.5)
def test_budget_shares_stop_steps_at_a_boundary_and_say_what_was_cut(monkeypatch):
    """Every step 'takes' 1 s of a fake clock: a 16 s budget gives the nan check (it runs first) its
    first precision only, the skip-rate probe (last) the steps that fit what is left, and the report
    lists both cuts."""
    from troubleshooter.engine import budget as budget_mod, nanhunt, skiprate

    now = [0.0]

    def fake():  # every perf_counter() call advances the clock a quarter second
        now[0] += 0.25
        return now[0]

    real_hunt = nanhunt._hunt_one

    def slow_hunt(*a, **k):  # a nan-check precision "takes" 5 s
        now[0] += 5.0
        return real_hunt(*a, **k)

    monkeypatch.setattr(nanhunt, "_hunt_one", slow_hunt)
    # The GEMM-rate probe behind the cost predictions is measured once per process, so on the fake
    # clock its answer depended on whether an earlier test in this process had measured it: here
    # every precision computes at one rate and the predictions rest on the steps measured.
    monkeypatch.setattr(budget_mod, "gemm_rate", lambda precision, device: 1e12)
    # Only the check's own modules see the fake clock (torch reads time.perf_counter too).
    fake_time = types.SimpleNamespace(perf_counter=fake, time=time.time)
    for mod in (budget_mod, skiprate, check, nanhunt):
        monkeypatch.setattr(mod, "time", fake_time)
    seen = []
    r = check.run_check(cw.mlp((32, 64, 10), batch_size=16), device="cpu", only="skiprate,nan", steps=50,
                        budget_s=16.0, progress=lambda f, m: seen.append((f, m)))
    s = r["skiprate"]["summary"]
    assert s["stopped_by_budget"] and s["steps"] < s["steps_requested"] == 50 and "rests on" in s["note"]
    nan = r["nan"]["precisions"]
    assert nan["fp32"]["steps_run"] == 1 and nan["bf16"]["not_run"] == "budget"
    assert r["errors"]["nan"]["kind"] == "budget" and r["exit_code"] == 1
    assert not [f for f in r["findings"] if f["precision"] == "bf16"]  # not run is not a finding
    assert any("skiprate" in c for c in r["budget"]["cut"]) and any("bf16 not run" in c for c in r["budget"]["cut"])
    assert list(r["timings_s"])[:2] == ["nan", "skiprate"]  # the skip-rate probe runs last (issue 28)
    assert r["budget"]["suggested_s"] > 16 and f"--budget {r['budget']['suggested_s']:g}" in r["budget"]["more"]
    steps = [m for _, m in seen if m.startswith("skiprate: fp16 step")]
    assert len(steps) == s["steps"]  # progress moves per step
    fractions = [f for f, _ in seen]
    assert fractions == sorted(fractions)


def test_no_budget_runs_every_step_and_a_bad_budget_is_refused():
    r = check.run_check(cw.mlp((32, 64, 10), batch_size=16), device="cpu", only="skiprate", steps=3, budget_s=None)
    assert r["skiprate"]["summary"]["steps"] == 3 and r["budget"]["cut"] == []
    for bad in (0, -1, float("nan"), True, "10"):
        with pytest.raises(UserError, match="--budget"):
            check.run_check(cw.mlp((32, 64, 10), batch_size=16), device="cpu", only="alignment", budget_s=bad)


def test_cli_budget_option(capsys):
    code = main(["check", "--preset", "mlp:in_features=32,hidden=32,depth=2,batch_size=8", "--only", "nan",
                 "--budget", "30", "--device", "cpu", "--format", "json"])
    r = json.loads(capsys.readouterr().out)
    assert code == 0 and r["budget"]["budget_s"] == 30.0 and r["timings_s"]["total"] < 30
    with pytest.raises(SystemExit) as info:
        main(["check", "--preset", "mlp", "--budget", "0"])
    assert info.value.code == 2


def test_a_step_predicted_not_to_fit_is_not_started_and_says_so(monkeypatch):
    """The budget is a bound, not a wish: an fp16 step predicted (FLOPs over the fp16 GEMM rate)
    to take far longer than the share is never started; fp32/bf16 work that fits still runs."""
    import dataclasses

    from troubleshooter.engine import budget as budget_mod

    rates = {"fp32": 1e12, "bf16": 1e12, "fp16": 1.0}  # an fp16 step would take ~forever here
    monkeypatch.setattr(budget_mod, "gemm_rate", lambda p, d: rates.get(p, 1e12))
    wl = dataclasses.replace(cw.mlp((32, 64, 10), batch_size=16), flops_per_step=1e6)
    r = check.run_check(wl, device="cpu", only="skiprate,nan,headroom", steps=5, budget_s=30.0)
    assert r["skiprate"] is None and r["errors"]["skiprate"]["kind"] == "budget"
    assert "not run" in r["errors"]["skiprate"]["message"] and "raise --budget" in r["errors"]["skiprate"]["message"]
    nan = r["nan"]["precisions"]
    assert nan["fp32"]["steps_run"] == 1 and nan["bf16"]["steps_run"] == 1 and nan["fp16"]["not_run"] == "budget"
    assert r["headroom"] is None and r["errors"]["headroom"]["kind"] == "budget"  # it needs an fp16 forward
    assert "skiprate: not run (its first step would not fit)" in r["budget"]["cut"] and r["exit_code"] == 1
    assert r["timings_s"]["total"] < 30


def test_the_budget_counts_from_started_at_and_keeps_a_reserve():
    from troubleshooter.engine.budget import Budget, StepCosts

    b = Budget(10.0, {"nan": 1})
    assert 8.4 < b.remaining() <= 9.0  # 10 s less the reserve (1 s: a tenth of it)
    r = check.run_check(cw.mlp((32, 64, 10), batch_size=16), device="cpu", only="alignment", budget_s=5.0,
                        started_at=__import__("time").time() - 60)  # the model took a minute to build
    assert r["budget"]["exceeded_s"] > 50  # said, not hidden
    assert 60 <= r["timings_s"]["start_up"] < r["timings_s"]["total"]  # and where it went
    from troubleshooter.engine.check_render import budget_markdown

    assert ", 60 s of it before the checks began" in budget_markdown(r)
    quick = check.run_check(cw.mlp((32, 64, 10), batch_size=16), device="cpu", only="alignment", budget_s=5.0,
                            started_at=__import__("time").time())
    assert "before the checks began" not in budget_markdown(quick)  # under a second explains nothing
    assert "start_up" not in check.run_check(cw.mlp((32, 64, 10), batch_size=16), device="cpu",
                                             only="alignment")["timings_s"]  # no start given: none claimed
    costs = StepCosts(None, "cpu")
    assert costs.expected("fp16") is None  # nothing to go on: the first step runs and is measured
    costs.record("fp16", 2.0)
    assert costs.expected("fp16") == 2.0


def test_headroom_progress_moves_within_the_check():
    seen = []
    check.run_check(cw.mlp((32, 64, 10), batch_size=16), device="cpu", only="headroom", budget_s=None,
                    progress=lambda f, m: seen.append((f, m)))
    inside = [m for _, m in seen if m.startswith("headroom:")]
    assert inside[0] == "headroom: fp32 reference step with hooks" and "headroom: fp16 forward" in inside
    assert "headroom: fp16 GradScaler step 1 at scale 65536" in inside  # per real fp16 step
    fractions = [f for f, _ in seen]
    assert fractions == sorted(fractions) and len(set(fractions)) > 3


def test_a_busy_host_gets_one_thread_per_free_core():
    """Issue 28: PyTorch's threads wait for cores other processes hold (gpt: 35 s on 2 threads at
    load 2.7, 8.8 s on one); the check takes the cores the host leaves free, at least one."""
    from troubleshooter.engine.threads import threads_for

    assert threads_for(2.7, cores=2, default=2) == 1 and threads_for(9.0, cores=2, default=2) == 1
    assert threads_for(0.3, cores=2, default=2) == 2 and threads_for(1.2, cores=4, default=4) == 3
    assert threads_for(0.0, cores=8, default=4) == 4  # never more than PyTorch's own default
