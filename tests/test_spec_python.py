"""Python model files: only with allow_exec, and then in a child process with a time limit."""
import argparse
from pathlib import Path

import pytest
import torch

from troubleshooter.errors import SpecError, UserError
from troubleshooter.spec import (SpecSource, add_spec_arguments, load_workload, run_with_workload,
                                 source_from_args)

SPECS = Path(__file__).parent / "fixtures" / "specs"


def describe_workload(workload, extra):
    """A job for run_with_workload: module-level so the spawned child can import it."""
    import os

    model = workload.build_model()
    loss = workload.loss(model, workload.batch(torch.device("cpu")))
    return {"name": workload.name, "params": workload.summary["params"], "loss_finite": bool(torch.isfinite(loss)),
            "pid": os.getpid(), "extra": extra}


def test_python_file_refused_without_allow_exec():
    src = SpecSource.python_file(SPECS / "model_file.py")
    for call in (lambda: load_workload(src), lambda: run_with_workload(src, describe_workload, 1)):
        with pytest.raises(SpecError) as info:
            call()
        assert "--allow-exec" in str(info.value)


def test_python_file_runs_in_a_child_process():
    import os

    src = SpecSource.python_file(SPECS / "model_file.py")
    out = run_with_workload(src, describe_workload, "x", allow_exec=True, timeout_s=120)
    assert out["name"] == "model_file" and out["loss_finite"] and out["extra"] == "x"
    assert out["params"] == 8 * 16 + 16 + 16 * 3 + 3
    assert out["pid"] != os.getpid()


def test_python_file_in_process_loader(tmp_path):
    wl = load_workload(SpecSource.python_file(SPECS / "model_file.py"), allow_exec=True)
    assert wl.batch_size == 4 and wl.summary["output_shape"] == [4, 3]
    (x,), y = wl.batch(torch.device("cpu"), seed=7)
    (x2,), _ = wl.batch(torch.device("cpu"), seed=7)
    assert torch.equal(x, x2) and y.dtype == torch.int64
    bad = tmp_path / "bad.py"
    bad.write_text("def build_model():\n    return 3\n")
    with pytest.raises(SpecError) as info:
        load_workload(SpecSource.python_file(bad), allow_exec=True)
    assert "make_batch" in str(info.value)
    odd = tmp_path / "odd.py"
    odd.write_text("def build_model(): pass\ndef make_batch(n): pass\nLOSS_WEIGHT = 'big'\nSEQ_LEN = 0\n")
    with pytest.raises(SpecError) as info:
        load_workload(SpecSource.python_file(odd), allow_exec=True)
    assert len(info.value.problems) == 2 and "LOSS_WEIGHT" in str(info.value)
    broken = tmp_path / "broken.py"
    broken.write_text("def build_model(:\n")
    with pytest.raises(SpecError, match="syntax error at line 1"):
        load_workload(SpecSource.python_file(broken), allow_exec=True)


def test_yaml_and_presets_run_in_process():
    assert run_with_workload(SpecSource.preset("mlp:depth=1,in_features=4,num_classes=2"),
                             describe_workload, 5)["extra"] == 5


def parse(argv):
    parser = argparse.ArgumentParser()
    add_spec_arguments(parser)
    return source_from_args(parser.parse_args(argv))


def test_cli_arguments():
    assert parse(["--preset", "gpt:n_layer=2"]) == SpecSource.preset("gpt:n_layer=2")
    assert parse(["a.yaml"]).kind == "yaml" and parse(["a.yaml"]).value.endswith("a.yaml")
    assert parse(["--python", "m.py", "--allow-exec"]).kind == "python"
    with pytest.raises(UserError, match="no model given"):
        parse([])
    with pytest.raises(UserError, match="only one"):
        parse(["a.yaml", "--preset", "gpt"])


def test_python_model_flops_count_forward_and_backward(tmp_path):
    """Issue 11.7: FLOPs of a --python model are a training step's (forward + backward), like the
    presets': F for the forward, F for the weight gradients and F for the input gradients of
    every layer but the first (its input, the data, needs none). Already right when checked here
    (2026-11-22); this keeps it so."""
    from troubleshooter.spec import SpecSource, load_workload

    f = tmp_path / "mlp_flops.py"
    f.write_text("import torch\nfrom torch import nn\nBATCH_SIZE = 64\n"
                 "def build_model():\n    return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))\n"
                 "def make_batch(batch_size):\n"
                 "    return torch.randn(batch_size, 256), torch.randint(0, 10, (batch_size,))\n")
    wl = load_workload(SpecSource.python_file(str(f)), allow_exec=True)
    forward = 2 * 64 * (256 * 512 + 512 * 10)
    first_input_grad = 2 * 64 * 256 * 512
    assert wl.flops_per_step == 3 * forward - first_input_grad
    assert wl.summary["flops_per_step"] == wl.flops_per_step
