"""Checkpoint inspection: layouts, half-only weights, scaler state, refusals of non-checkpoints."""
import json

import pytest
import torch

from troubleshooter.cli import main
from troubleshooter.engine.inspect_checkpoint import inspect_checkpoint
from troubleshooter.errors import UserError
from troubleshooter.findings import Severity


def trained(half=False):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    sched = torch.optim.lr_scheduler.StepLR(opt, 10)
    if half:
        model.half()
    return model, opt, sched


def rules(report, severity=None):
    return sorted(f.rule for f in report.findings if severity is None or f.severity is severity)


def save(tmp_path, obj, name="ckpt.pt"):
    path = tmp_path / name
    torch.save(obj, path)
    return path


def test_complete_fp16_checkpoint_is_clean(tmp_path):
    model, opt, sched = trained()
    scaler = torch.amp.GradScaler("cpu")
    path = save(tmp_path, {"model": model.state_dict(), "optimizer": opt.state_dict(), "scaler": scaler.state_dict(),
                           "scheduler": sched.state_dict(), "iter_num": 100, "config": {"dtype": "float16"}})
    r = inspect_checkpoint(path)
    d = r.to_dict()
    assert d["layout"] == "training_checkpoint" and r.findings == []
    assert d["models"][0]["key"] == "model" and d["models"][0]["half_only"] is False
    assert d["scaler"]["scale"] == 65536.0 and d["scheduler"]["present"] and d["step"] == {"key": "iter_num", "value": 100}
    assert d["optimizer"]["state_keys"] == ["exp_avg", "exp_avg_sq", "step"]
    assert d["precision_evidence"] == "fp16"
    json.dumps(d)


def test_half_only_training_checkpoint(tmp_path):
    model, opt, sched = trained(half=True)
    path = save(tmp_path, {"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                           "step": 5})
    r = inspect_checkpoint(path)
    assert rules(r, Severity.WARNING) == ["AMP110", "AMP124"]
    assert r.to_dict()["models"][0]["half_only"] and r.to_dict()["models"][0]["dtypes"]["float16"]["tensors"] == 8
    assert r.to_dict()["models"][0]["dtypes"]["int64"]["tensors"] == 1  # num_batches_tracked


def test_bare_half_state_dict_is_info_only(tmp_path):
    model, _, _ = trained(half=True)
    r = inspect_checkpoint(save(tmp_path, model.state_dict()))
    assert r.to_dict()["layout"] == "state_dict" and rules(r) == ["AMP124"]
    assert r.findings[0].severity is Severity.INFO
    assert any("weights only" in n for n in r.notes)


@pytest.mark.parametrize("extra, expected", [
    ({"amp": True}, ["AMP110"]),  # an amp flag and no scaler state: warning
    ({"args": {"mixed_precision": "fp16"}}, ["AMP110"]),  # nested settings count
    ({"config": {"dtype": "bfloat16"}}, []),  # bf16 needs no scaler
    ({}, []),  # no evidence: info only
])
def test_missing_scaler_state(tmp_path, extra, expected):
    model, opt, sched = trained()
    path = save(tmp_path, {"model": model.state_dict(), "optimizer": opt.state_dict(),
                           "scheduler": sched.state_dict(), "epoch": 3, **extra})
    assert rules(inspect_checkpoint(path), Severity.WARNING) == expected


def test_low_scale_and_nested_lightning_layout(tmp_path):
    model, opt, sched = trained()
    scaler = torch.amp.GradScaler("cpu", init_scale=0.25)
    path = save(tmp_path, {"state": {"state_dict": model.state_dict(), "optimizer_states": [opt.state_dict()],
                                     "lr_schedulers": [sched.state_dict()],
                                     "native_amp_scaling_state": scaler.state_dict()},
                           "global_step": 7})
    r = inspect_checkpoint(path)
    d = r.to_dict()
    assert d["optimizer"]["key"] == "state.optimizer_states.0" and d["scaler"]["scale"] == 0.25
    assert d["models"][0]["key"] == "state.state_dict"
    (f,) = r.findings
    assert f.rule == "AMP202" and f.severity is Severity.WARNING and f.data["scale"] == 0.25


def test_disabled_scaler_counts_as_present(tmp_path):
    model, opt, sched = trained()
    path = save(tmp_path, {"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                           "scaler": torch.amp.GradScaler("cpu", enabled=False).state_dict(), "amp": True})
    r = inspect_checkpoint(path)
    assert r.to_dict()["scaler"]["present"] and r.findings == []


@pytest.mark.parametrize("scaler_entry, key, fmt, scale", [
    # apex.amp.state_dict(), as NVIDIA's apex README saves it (apex/amp/frontend.py)
    ({"amp": {"loss_scaler0": {"loss_scale": 32768.0, "unskipped": 12}}}, "amp", "apex", 32768.0),
    ({"scaler": {"scale": 1024.0}}, "scaler", "scale only", 1024.0),
    ({"grad_scaler": {"scale": torch.tensor(512.0)}}, "grad_scaler", "scale only", 512.0),
])
def test_other_ways_of_saving_the_loss_scale_count_as_scaler_state(tmp_path, scaler_entry, key, fmt, scale):
    """A checkpoint that kept its loss scale another way than GradScaler.state_dict() is not
    'missing scaler state' (no AMP110), and a scale tensor is not reported as model weights."""
    model, opt, sched = trained(half=True)
    path = save(tmp_path, {"model": model.state_dict(), "optimizer": opt.state_dict(),
                           "scheduler": sched.state_dict(), **scaler_entry})
    r = inspect_checkpoint(path)
    sc = r.to_dict()["scaler"]
    assert sc["present"] and sc["key"] == key and sc["format"] == fmt and sc["scale"] == scale
    assert "AMP110" not in rules(r)
    assert [m["key"] for m in r.to_dict()["models"]] == ["model"]
    assert f"GradScaler state: yes at {key}" in r.to_text()


def test_a_dict_with_a_scale_under_another_key_is_not_scaler_state(tmp_path):
    model, opt, sched = trained(half=True)
    path = save(tmp_path, {"model": model.state_dict(), "optimizer": opt.state_dict(),
                           "scheduler": sched.state_dict(), "augment": {"scale": 1.5}})
    r = inspect_checkpoint(path)
    assert not r.to_dict()["scaler"]["present"] and "AMP110" in rules(r)


def test_refuses_pickled_code_and_non_checkpoints(tmp_path):
    model, _, _ = trained()
    with pytest.raises(UserError, match="refused: .* needs code to be unpickled"):
        inspect_checkpoint(save(tmp_path, model, "module.pt"))
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(UserError, match="not a PyTorch checkpoint"):
        inspect_checkpoint(tmp_path / "notes.txt")
    with pytest.raises(UserError, match="single tensor"):
        inspect_checkpoint(save(tmp_path, torch.zeros(3), "t.pt"))
    with pytest.raises(UserError, match="no tensors"):
        inspect_checkpoint(save(tmp_path, {"a": 1}, "d.pt"))
    with pytest.raises(UserError, match="not found"):
        inspect_checkpoint(tmp_path / "missing.pt")


def test_cli_exit_codes(tmp_path, capsys):
    model, opt, sched = trained(half=True)
    bad = save(tmp_path, {"model": model.state_dict(), "optimizer": opt.state_dict()})
    assert main(["inspect", str(bad), "--format", "json"]) == 1
    assert json.loads(capsys.readouterr().out)["findings"]
    good = save(tmp_path, trained()[0].state_dict(), "good.pt")
    assert main(["inspect", str(good)]) == 0
    assert "state dict" in capsys.readouterr().out
    (tmp_path / "x.pt").write_bytes(b"\x00\x01garbage")
    assert main(["inspect", str(tmp_path / "x.pt")]) == 2
    assert "not a PyTorch checkpoint" in capsys.readouterr().err


def test_safetensors_header_is_read_without_loading(tmp_path):
    header = json.dumps({"__metadata__": {"format": "pt"},
                         "w": {"dtype": "BF16", "shape": [4, 4], "data_offsets": [0, 32]},
                         "b": {"dtype": "BF16", "shape": [4], "data_offsets": [32, 40]}}).encode()
    path = tmp_path / "model.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + bytes(40))
    r = inspect_checkpoint(path)
    d = r.to_dict()
    assert d["format"] == "safetensors" and d["layout"] == "state_dict"
    assert d["models"][0]["dtypes"] == {"bfloat16": {"tensors": 2, "elements": 20}}
    assert rules(r) == ["AMP124"] and r.findings[0].severity is Severity.INFO


def test_separate_state_files(tmp_path):
    model, opt, sched = trained()
    r = inspect_checkpoint(save(tmp_path, opt.state_dict(), "optimizer.pt"))
    assert r.to_dict()["layout"] == "optimizer_state" and r.findings == []
    scaler = torch.amp.GradScaler("cpu", init_scale=0.5)
    r = inspect_checkpoint(save(tmp_path, scaler.state_dict(), "scaler.pt"))
    assert r.to_dict()["layout"] == "scaler_state" and rules(r) == ["AMP202"]


def test_missing_scheduler_state_has_its_own_rule(tmp_path):
    """Issue 11.7: a missing LR scheduler is AMP211 checkpoint-missing-scheduler-state, not AMP110."""
    from troubleshooter.engine.inspect_checkpoint import inspect_checkpoint

    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "ckpt.pt"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 1}, path)
    found = [(f.rule, f.name) for f in inspect_checkpoint(str(path)).findings]
    assert ("AMP211", "checkpoint-missing-scheduler-state") in found
    assert all(name != "checkpoint-missing-scaler-state" or rule == "AMP110" for rule, name in found)
    assert not any(rule == "AMP110" and "scheduler" in name for rule, name in found)


def test_a_safetensors_header_that_lies_about_its_file_is_refused(tmp_path):
    """A 10^10-element tensor in a file of a few dozen bytes was reported as real."""
    header = json.dumps({"w": {"dtype": "F16", "shape": [100_000, 100_000], "data_offsets": [0, 32]}}).encode()
    path = tmp_path / "lying.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + bytes(32))
    with pytest.raises(UserError, match="does not describe this file"):
        inspect_checkpoint(path)
    outside = json.dumps({"w": {"dtype": "F16", "shape": [4], "data_offsets": [0, 8_000_000]}}).encode()
    path.write_bytes(len(outside).to_bytes(8, "little") + outside + bytes(8))
    with pytest.raises(UserError, match="do not lie within"):
        inspect_checkpoint(path)
