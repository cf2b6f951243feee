"""check --nproc: the skip-rate and NaN checks under torch.distributed.run, 2 ranks on gloo (CPU).
One launch by default (FSDP2 float16 on a planted model: found-inf agreement, the reduction measured
at FSDP2's copy-in); the DDP run on tiny gradients (a float16 compression hook flushing them) is
opt-in, TRACE_DISTRIBUTED_SLOW=1; the measurement itself is tested in-process."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from troubleshooter.engine.distributed_check import check_distributed, check_options, render_text
from troubleshooter.errors import SpecError, UserError
from troubleshooter.spec import SpecSource

FIX = Path(__file__).parent / "fixtures" / "check"


@pytest.fixture(scope="module")
def fsdp2_planted() -> dict:
    result = check_distributed(SpecSource.python_file(FIX / "distributed_planted.py"), nproc=2, wrap="fsdp2",
                               param_dtype="float16", steps=4, device="cpu", allow_exec=True, timeout_s=180)
    json.dumps(result)
    return result


@pytest.fixture(scope="module")
def ddp_tiny() -> dict:
    if not os.environ.get("TRACE_DISTRIBUTED_SLOW"):
        pytest.skip("a second launch: TRACE_DISTRIBUTED_SLOW=1")
    return check_distributed(SpecSource.yaml_file(FIX / "tiny_gradients.yaml"), nproc=2, wrap="ddp",
                             param_dtype="bfloat16", reduce_dtype="float16", steps=3, device="cpu", timeout_s=180)


def test_fsdp2_ranks_agree_although_only_one_shard_overflowed(fsdp2_planted):
    d = fsdp2_planted["distributed"]
    assert d["wrap"] == "fsdp2" and d["policy"] == {"param_dtype": "float16", "reduce_dtype": "float16"}
    ranks = {r["rank"]: r for r in d["ranks"]}
    assert all(r["status"] == "finished" and r["steps"] == 4 for r in ranks.values())
    assert ranks[0]["locally_nonfinite_steps"] and not ranks[1]["locally_nonfinite_steps"]  # only rank 0's shard
    assert ranks[0]["skipped_steps"] == ranks[1]["skipped_steps"] == ranks[0]["locally_nonfinite_steps"]
    assert all(row["agree"] for row in d["steps"])
    assert not [f for f in fsdp2_planted["findings"] if f["rule"] in ("AMP270", "AMP277", "AMP278")]
    assert d["launcher"]["leftover_processes"] == []
    assert "rank 0: finished" in render_text(fsdp2_planted)
    red = d["reduction"]
    assert red["dtype"] == "float16" and "copy-in" in red["measured_at"] and len(red["steps"]) == 4
    assert all(t["nonzero"] > 0 for t in red["steps"])


def test_the_meter_counts_what_the_reduce_dtype_loses():
    import torch

    from troubleshooter.engine.distributed_check import reduction_findings
    from troubleshooter.engine.distributed_rank import ReductionMeter

    meter = ReductionMeter()
    grads = torch.tensor([1e-9, 2e-9, 1e-3, 0.0, 7e4], dtype=torch.bfloat16)
    meter.measure(grads, torch.float16, divide=2)  # as fp16_compress_hook: cast to float16, then / world size
    step = meter.result()[0]
    # 1e-9/2 and 2e-9/2 flush; 7e4 is inf in float16 before the division could bring it in range
    assert (step["nonzero"], step["flushed"], step["overflowed"]) == (4, 2, 1)
    meter.measure(torch.tensor([1e5]), torch.float16)
    assert meter.result()[0]["overflowed"] == 2
    opts = {"wrap": "ddp", "nproc": 2, "param_dtype": "bfloat16", "reduce_dtype": "float16"}
    reduction = {"steps": [{**step, "flushed_share": 0.5}], "worst_flushed_share": 0.5, "overflowed": 1,
                 "measured_at": "here", "dtype": "float16"}
    f = reduction_findings(reduction, opts)
    assert [x.rule for x in f] == ["AMP277"] and "50.0%" in f[0].message and "no loss scaling" in f[0].message
    assert reduction_findings({**reduction, "worst_flushed_share": 0.01, "overflowed": 0}, opts) == []


def test_ddp_float16_reduction_flushes_tiny_gradients(ddp_tiny):
    found = [f for f in ddp_tiny["findings"] if f["rule"] == "AMP277"]
    assert len(found) == 1 and found[0]["severity"] == "warning"
    red = ddp_tiny["distributed"]["reduction"]
    assert red["dtype"] == "float16" and red["worst_flushed_share"] > 0.5 and "communication hook" in red["measured_at"]
    assert ddp_tiny["exit_code"] == 1
    assert all(r["skipped_steps"] == [] and r["final_scale"] is None for r in ddp_tiny["distributed"]["ranks"])


def test_bad_options_fail_before_anything_starts():
    with pytest.raises(UserError, match="--wrap"):
        check_options(2, "fsdp1", "float16", None)
    with pytest.raises(UserError, match="--reduce-dtype"):
        check_options(2, "ddp", "float16", "int8")
    assert check_options(1, "fsdp2", "bf16", None)["reduce_dtype"] == "bfloat16"  # FSDP2: the param dtype
    assert check_options(1, "ddp", "fp16", None)["reduce_dtype"] == "float32"  # DDP: no compression hook
    with pytest.raises(SpecError):
        check_distributed(SpecSource.python_file(FIX / "distributed_planted.py"), nproc=1, allow_exec=False)


def test_the_check_tab_shows_the_per_rank_table(fsdp2_planted, monkeypatch):
    from troubleshooter.ui import check as ui_check_module

    monkeypatch.setattr(ui_check_module, "run_distributed", lambda *a, **k: fsdp2_planted)
    monkeypatch.setattr(ui_check_module, "parse_nproc", lambda n, device: int(n) if int(n) > 1 else None)
    out = ui_check_module.ui_check("Preset", "mlp", "", "", None, None, "cpu", ["skiprate"], 4, 60, "cuda", 2, "fsdp2",
                                   "float16", "")
    assert len(out) == 11 and "| rank | status |" in out[0] and "FSDP2" in out[0]
    assert out[-1].endswith("check_distributed.json")


def test_the_check_ranks_endpoint(fsdp2_planted, monkeypatch):
    import gradio as gr

    from troubleshooter.ui import api, check as ui_check_module, ranks

    monkeypatch.setattr(ranks, "host_devices", lambda: ["auto", "cpu"])
    monkeypatch.setattr(ui_check_module, "run_distributed", lambda *a, **k: fsdp2_planted)
    out = json.loads(api.check_ranks(preset="mlp", device="cpu", nproc=2, wrap="fsdp2"))
    assert out["distributed"]["nproc"] == 2 and out["exit_code"] == fsdp2_planted["exit_code"]
    with pytest.raises(gr.Error, match="nproc must be 2 or more"):
        api.check_ranks(preset="mlp", device="cpu", nproc=1)
