"""trace --nproc: real runs under torch.distributed.run with 2 ranks on gloo (CPU).

Each launch imports torch three times (torchrun and two ranks), so the scenarios are grouped into
two scripts, each launched once (module-scoped fixtures): FSDP1 with a plain and with a sharded
GradScaler and FSDP2 with a plain one; DDP accumulation without, with and wrongly with no_sync,
then a rank that raises. Faults are located by `# marker:` comments in the scripts, never by a
hard-coded line. The hang test (the time limit) is opt-in: TRACE_DISTRIBUTED_SLOW=1.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from troubleshooter.errors import UserError
from troubleshooter.trace import exit_code, render_text, trace_script
from troubleshooter.trace import merge

FIX = Path(__file__).parent / "fixtures" / "trace" / "distributed"


def line_of(script: str, marker: str) -> int:
    lines = (FIX / script).read_text().splitlines()
    hits = [i for i, text in enumerate(lines, 1) if f"# marker: {marker}" in text]
    assert len(hits) == 1, marker
    return hits[0]


def run(script: str, **kw) -> dict:
    kw.setdefault("steps", 10)
    kw.setdefault("timeout_s", 180)
    report = trace_script(FIX / script, [], nproc=2, device="cpu", **kw)
    json.dumps(report)  # the contract: JSON-serialisable as returned
    return report


def rules(report: dict, rule: str) -> list[dict]:
    return [f for f in report["findings"] if f["rule"] == rule]


def problems(report: dict) -> list[tuple[str, int | None]]:
    return [(f["rule"], f["line"]) for f in report["findings"] if f["severity"] in ("error", "warning")]


def assert_no_process_left(report: dict) -> None:
    """Neither torchrun nor any rank (nor anything in a rank's process group) is still running."""
    launcher = report["distributed"]["launcher"]
    assert launcher["leftover_processes"] == []
    pids = {int(p) for p in launcher["pids"].values() if p}
    assert len(pids) == 3  # torchrun and both ranks were seen
    out = subprocess.run(["ps", "-eo", "pid=,pgid=,stat="], capture_output=True, text=True, check=True).stdout
    running = [line.split() for line in out.splitlines() if line.split() and not line.split()[2].startswith("Z")]
    assert not [p for p in running if int(p[0]) in pids or int(p[1]) in pids], running


@pytest.fixture(scope="module")
def fsdp() -> dict:
    return run("fsdp_scalers.py")


@pytest.fixture(scope="module")
def ddp() -> dict:
    return run("ddp_accumulation.py")


def test_fsdp1_plain_scaler_ranks_disagree_at_its_step(fsdp):
    f = rules(fsdp, "AMP270")
    assert len(f) == 1 and f[0]["severity"] == "error"
    f = f[0]
    assert f["path"].endswith("fsdp_scalers.py") and f["line"] == line_of("fsdp_scalers.py", "fsdp1 plain step")
    assert f["data"]["skipped_ranks"] == [0] and f["data"]["stepped_ranks"] == [1]
    assert f["data"]["steps"] == [0, 1, 2]  # only the plain-scaler phase
    assert "ShardedGradScaler" in f["suggestion"] and "own shard" in f["message"]
    steps = {row["step"]: row for row in fsdp["distributed"]["steps"]}
    assert [steps[s]["agree"] for s in range(9)] == [False] * 3 + [True] * 6
    assert steps[0]["skipped"] == {"0": True, "1": False}


def test_sharded_scaler_and_fsdp2_plain_scaler_are_clean(fsdp):
    # the framework layer (issue 23) also names the plain scaler itself, AMP135, at the line that made it
    assert set(problems(fsdp)) - {("AMP135", line_of("fsdp_scalers.py", "plain scaler"))} == {
        ("AMP270", line_of("fsdp_scalers.py", "fsdp1 plain step"))}
    assert fsdp["exit"]["status"] == "finished" and fsdp["steps_observed"] == 9
    assert all(r["status"] == "finished" and r["steps_observed"] == 9 for r in fsdp["distributed"]["ranks"])
    # the sharded phase and the FSDP2 phase calibrate: both ranks skip the same steps
    assert fsdp["distributed"]["ranks"][1]["skipped_steps"] == [s for s in fsdp["distributed"]["ranks"][0]["skipped_steps"]
                                                                if s >= 3]
    by = {(r["by"], r["op"], r["dtype"]) for r in fsdp["distributed"]["reductions"]}
    assert ("FSDP1", "reduce_scatter_single", "float16") in by  # reduce_dtype=float16
    assert ("FSDP2", "reduce_scatter_single", "float32") in by  # reduce_dtype=float32
    assert any(b == "ShardedGradScaler" for b, _, _ in by)  # its found_inf all-reduce
    assert fsdp["precision"]["mixed"] is True and "float16" in fsdp["precision"]["compute"]
    assert not rules(fsdp, "AMP292")


def test_fsdp_policy_in_effect_per_module(fsdp):
    policies = fsdp["distributed"]["fsdp"]
    fsdp1 = [p for p in policies if p["version"] == 1]
    fsdp2 = {p["module"]: p for p in policies if p["version"] == 2}
    assert len(fsdp1) == 2 and all(p["compute_dtype"] == "float16" and p["reduce_dtype"] == "float16" for p in fsdp1)
    assert fsdp1[1]["line"] == line_of("fsdp_scalers.py", "fsdp1 wrap")
    assert fsdp2["0"]["compute_dtype"] == "float16" and fsdp2["0"]["reduce_dtype"] == "float32"
    assert fsdp2["0"]["line"] == line_of("fsdp_scalers.py", "fsdp2 layer")
    assert fsdp2["<root>"]["class"] == "Sequential"


def test_fsdp_text_report_has_the_rank_and_step_tables(fsdp):
    text = merge.render_text(fsdp, render_text)
    assert "Per rank:" in text and "<- ranks disagree" in text and "FSDP2 '0' (Linear): compute float16" in text
    assert exit_code(fsdp) == 1
    assert_no_process_left(fsdp)


def test_ddp_accumulation_without_no_sync_all_reduces_every_micro_step(ddp):
    f = rules(ddp, "AMP272")
    assert len(f) == 1 and f[0]["severity"] == "warning"
    assert f[0]["line"] == line_of("ddp_accumulation.py", "every micro-step syncs")
    assert f[0]["data"]["steps"] == [0, 1] and f[0]["data"]["synced"] == [True, True]
    sync = {s["step"]: s["synced"] for s in ddp["distributed"]["gradient_sync"]}
    assert sync[2] == sync[3] == [False, True]  # the no_sync phase: right, no finding there


def test_ddp_step_on_gradients_never_all_reduced(ddp):
    f = rules(ddp, "AMP273")
    assert len(f) == 1 and f[0]["severity"] == "error"
    assert f[0]["line"] == line_of("ddp_accumulation.py", "no_sync on the last micro-step too")
    assert f[0]["data"]["steps"] == [4]


def test_ddp_crashing_rank_is_named_and_the_other_stopped(ddp):
    failed = rules(ddp, "AMP274")
    assert len(failed) == 1 and failed[0]["data"]["rank"] == 1
    assert failed[0]["line"] == line_of("ddp_accumulation.py", "rank 1 raises")
    assert "rank 1" in failed[0]["message"] and "ValueError" in failed[0]["message"]
    assert ddp["exit"]["status"] == "raised" and ddp["exit"]["rank"] == 1
    ranks = {r["rank"]: r for r in ddp["distributed"]["ranks"]}
    assert ranks[1]["status"] == "raised" and ranks[1]["exception"]["type"] == "ValueError"
    # rank 0 was left in its next all-reduce: gloo raised when rank 1 went (or this module stopped it)
    assert ranks[0]["consequence"] or ranks[0]["status"] == "stopped"
    assert [f["data"]["ranks"] for f in rules(ddp, "AMP290")] == [[1]]  # rank 0's fallout is not a finding
    assert {(r, line) for r, line in problems(ddp)} == {
        ("AMP272", line_of("ddp_accumulation.py", "every micro-step syncs")),
        ("AMP273", line_of("ddp_accumulation.py", "no_sync on the last micro-step too")),
        ("AMP274", line_of("ddp_accumulation.py", "rank 1 raises")),
        ("AMP290", line_of("ddp_accumulation.py", "rank 1 raises"))}
    assert_no_process_left(ddp)


@pytest.mark.skipif(not os.environ.get("TRACE_DISTRIBUTED_SLOW"), reason="waits for the time limit: TRACE_DISTRIBUTED_SLOW=1")
def test_hanging_rank_is_named_at_the_time_limit(tmp_path):
    script = tmp_path / "hang.py"
    script.write_text(
        "import time\nimport torch\nimport torch.distributed as dist\n\n"
        "dist.init_process_group('gloo')\nmodel = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor step in range(5):\n"
        "    if step == 2 and dist.get_rank() == 1:\n        time.sleep(3600)\n"
        "    model(torch.randn(2, 4)).sum().backward()\n    opt.step()\n    opt.zero_grad()\n")
    report = trace_script(script, [], nproc=2, device="cpu", steps=5, timeout_s=60)
    hung = rules(report, "AMP275")
    assert len(hung) == 1 and report["distributed"]["launcher"]["timed_out"]
    ranks = {r["rank"]: r for r in report["distributed"]["ranks"]}
    assert ranks[1]["status"] == "timeout" and ranks[1]["where"]["line"] == 10  # the sleep
    assert ranks[0]["where"]["line"] == 11 and "backward" in ranks[0]["description"]  # DDP's all-reduce waits
    assert_no_process_left(report)


# -- no launch: options and the merge's own readings -------------------------------------------------
def test_nproc_is_bounded_by_the_host_and_the_operator(monkeypatch):
    with pytest.raises(UserError, match="nproc must be from 1 to"):
        trace_script(FIX / "fsdp_scalers.py", [], nproc=os.cpu_count() + 1, device="cpu")
    monkeypatch.setenv("AMP_TROUBLESHOOTER_MAX_NPROC", "1")
    with pytest.raises(UserError, match="capped by AMP_TROUBLESHOOTER_MAX_NPROC"):
        trace_script(FIX / "fsdp_scalers.py", [], nproc=2, device="cpu")
    with pytest.raises(UserError, match="whole number"):
        trace_script(FIX / "fsdp_scalers.py", [], nproc="two", device="cpu")


def test_a_stack_dumped_in_a_collective_names_the_users_line():
    from troubleshooter.torchrun import _blocked_at

    torch_dir = os.path.dirname(__import__("torch").__file__)
    text = (f"Thread 0x00007f0000000002 (most recent call first):\n  File \"/usr/lib/python3.11/threading.py\", line 324 in wait\n\n"
            f"Current thread 0x00007f0000000001 (most recent call first):\n"
            f"  File \"{torch_dir}/distributed/c10d_logger.py\", line 81 in wrapper\n"
            f"  File \"{FIX}/ddp_accumulation.py\", line 69 in main\n  File \"<frozen runpy>\", line 88 in _run_code\n")
    at = _blocked_at(text, 0x7F0000000001)
    assert at["line"] == 69 and at["path"].endswith("ddp_accumulation.py") and "collective" in at["doing"]
    assert _blocked_at("", 1) is None


def test_nccl_on_a_host_without_cuda_runs_gloo(monkeypatch):
    import torch

    from troubleshooter.trace.rank import RankObserver

    seen = []
    observer = RankObserver(rec=None, folder="/nonexistent")  # nothing is written before install()
    wrapped = observer._make_init_process_group(lambda *a, **k: seen.append((a, k)))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    wrapped("nccl", timeout=None)
    wrapped(backend="nccl")
    wrapped(backend="gloo")
    assert seen == [(("gloo",), {"timeout": None}), ((), {"backend": "gloo"}), ((), {"backend": "gloo"})]
    assert observer.backend["asked"] == "gloo" and "gloo ran instead" in observer.backend["substituted"]


def test_the_page_shows_the_per_rank_table_and_bounds_the_count(fsdp, monkeypatch):
    from troubleshooter.ui import ranks, server
    from troubleshooter.ui.trace import summary_markdown

    text = summary_markdown({**fsdp, "script": "fsdp_scalers.py"})
    assert "2 ranks under torch.distributed.run" in text and "| rank | status |" in text and "ranks disagree" in text
    monkeypatch.setattr(ranks, "host_devices", lambda: ["auto", "cpu"])
    monkeypatch.setattr(server.SETTINGS, "max_nproc", 2)
    assert ranks.parse_nproc(1) is None and ranks.parse_nproc("2", "cpu") == 2
    with pytest.raises(UserError, match="at most"):
        ranks.parse_nproc(3, "cpu")
    monkeypatch.setattr(server.SETTINGS, "max_nproc", 1)
    with pytest.raises(UserError, match="at most 1"):
        ranks.parse_nproc(2, "cpu")
    with pytest.raises(UserError, match="whole number"):
        ranks.parse_nproc(1.5, "cpu")
