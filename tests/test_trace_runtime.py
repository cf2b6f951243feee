"""trace on what real scripts do beyond the AMP protocol: save and copy their model mid-run,
update weights without torch.optim, write fp16 by hand (improved-diffusion --use_fp16, run
unmodified), and the report a person reads."""
from __future__ import annotations

import copy
import os
import pickle
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from torch import nn

from troubleshooter.trace import render_markdown, render_text, trace_script
from troubleshooter.trace.locate import caused_by_tool, script_traceback

FIX = Path(__file__).parent / "fixtures" / "trace"
DIFFUSION = FIX / "real" / "improved_diffusion"
DIFFUSION_ARGS = ["--image_size", "32", "--num_channels", "32", "--num_res_blocks", "1", "--num_heads", "1",
                  "--attention_resolutions", "8", "--diffusion_steps", "50", "--batch_size", "2",
                  "--use_fp16", "True", "--log_interval", "1000"]


def _images(folder: Path) -> Path:
    """Four random 32x32 PNGs: the image folder improved-diffusion's load_data reads."""
    from PIL import Image

    folder.mkdir()
    gen = torch.Generator().manual_seed(0)
    for i in range(4):
        pixels = torch.randint(0, 256, (32, 32, 3), generator=gen, dtype=torch.uint8).numpy()
        Image.fromarray(pixels).save(folder / f"img_{i}.png")
    return folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("runtime")
    data = _images(tmp / "images")
    old = {k: os.environ.get(k) for k in ("PYTHONPATH", "OPENAI_LOGDIR")}
    # improved-diffusion is imported as a package (pip install -e . in its README); mpi4py and
    # blobfile are stood in for by shims/ (see real/README.md)
    paths = [str(DIFFUSION), str(DIFFUSION / "shims"), old["PYTHONPATH"]]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    os.environ["OPENAI_LOGDIR"] = str(tmp / "logs")
    raises = tmp / "raises.py"
    raises.write_text("import torch\nx = torch.ones(2, 3)\ny = x @ torch.ones(2, 3)\n")
    jobs = {
        "raises": (raises, [], dict(steps=1)),
        "keep": (FIX / "keep" / "train.py", [], dict(steps=4)),
        "manual": (FIX / "manual_loop" / "train.py", [], dict(steps=6)),
        "collapse": (FIX / "half_collapse" / "train.py", [], dict(steps=2)),
        "diffusion": (DIFFUSION / "scripts" / "image_train.py", ["--data_dir", str(data), *DIFFUSION_ARGS],
                      dict(steps=1, cwd=str(tmp))),
    }
    try:
        with ThreadPoolExecutor(len(jobs)) as pool:
            futures = {k: pool.submit(trace_script, str(s), a, timeout_s=150, **kw) for k, (s, a, kw) in jobs.items()}
            return {k: f.result() for k, f in futures.items()}
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _serious(report):
    return [(f["rule"], f["message"][:200]) for f in report["findings"] if f["severity"] in ("error", "warning")]


def test_a_script_that_saves_and_copies_its_model_is_traced_cleanly(runs):
    r = runs["keep"]
    assert r["exit"]["status"] == "stopped" and r["steps_observed"] == 4, r["exit"]
    assert _serious(r) == []


def test_a_loop_without_an_optimizer_stops_after_the_requested_backward_passes(runs):
    r = runs["manual"]
    assert r["exit"]["status"] == "stopped" and r["steps_observed"] == 6, r["exit"]
    assert r["steps_counted"].startswith("backward passes")
    assert "6 backward passes" in render_text(r) and r["device"]["type"] == "cpu"
    assert r["precision"]["compute"] == "float32" and _serious(r) == []


def test_hand_written_fp16_is_reported_as_fp16_and_its_silent_collapse_named(runs):
    r = runs["collapse"]
    p = r["precision"]
    assert p["compute"] == "float16 weights, no autocast" and p["mixed"] is True
    assert p["master_weights"] == "float32" and p["loss_scale_by_hand"] == 1024.0
    rules = [f["rule"] for f in r["findings"]]
    assert rules == ["AMP212"], r["findings"]  # the NaN gradients it causes are folded into it
    (f,) = r["findings"]
    assert f["module"] == "norm" and f["path"].endswith("half_collapse/train.py") and f["line"] == 16
    assert f["data"]["op"]["op"] == "Tensor.pow" and f["data"]["consequences"][0]["rule"] == "AMP206"


def test_improved_diffusion_use_fp16_unmodified_is_float16_with_master_weights(runs):
    r = runs["diffusion"]
    assert r["exit"]["status"] == "stopped" and r["steps_observed"] == 1, r["exit"]
    p = r["precision"]
    assert p["compute"] == "float16 weights, no autocast" and p["master_weights"] == "float32"
    assert p["loss_scale_by_hand"] == 2.0 ** 20  # INITIAL_LOG_LOSS_SCALE = 20 in train_util.py
    assert "no mixed precision ran" not in render_text(r)
    assert r["timeline"][0]["loss"] < 100  # the step's loss, not loss * 2**20


def test_the_reports_people_read_show_no_dict_and_no_frame_of_the_tool(runs):
    from troubleshooter.ui.trace import public_result, summary_markdown

    r = runs["raises"]
    folder = str(Path(r["argv"][0]).parent)
    assert r["exit"]["status"] == "raised" and r["findings"][0]["rule"] == "AMP290"
    assert r["findings"][0]["line"] == 3
    tool = str(Path(__file__).resolve().parents[1] / "troubleshooter")
    for text in (render_text(r), render_markdown(r), r["exit"]["exception"]["traceback"]):
        assert tool not in text and "child.py" not in text and "patches.py" not in text
    page = summary_markdown(public_result(r, "raises.py", folder))
    assert "{" not in page and "'requested'" not in page and folder not in page
    assert "RuntimeError" in page and "raises.py:3" in page


# ---------------------------------------------------------------- in-process units


def test_hooks_of_the_tracer_and_nanhunt_stay_out_of_what_the_script_does_with_its_model():
    from troubleshooter.engine.nanhooks import HookSet
    from troubleshooter.trace.numerics import Numerics
    from troubleshooter.trace.recorder import Recorder

    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(3, 4)
    num = Numerics(Recorder(steps=100), nan=False, headroom=False)
    hooks = HookSet(model).attach()  # what --nan and nanhunt() put on every module
    try:
        model(x)  # the tracer finds and watches the model at its first forward
        assert sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()) > 4
        for other in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
            assert all(not m._forward_hooks and not m._forward_pre_hooks for m in other.modules())
            torch.testing.assert_close(other(x), model(x))
        assert [n for n, _ in model.named_modules()] == ["", "0", "1", "2"]
        assert list(model.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]
        compiled = torch.compile(model, backend="eager")
        torch.testing.assert_close(compiled(x), model(x))
    finally:
        hooks.detach()
        num.close()
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def _raised(call):
    try:
        call()
    except Exception as exc:  # noqa: BLE001
        return exc
    raise AssertionError("no exception")


def test_an_exception_from_the_tool_is_told_from_the_scripts_own():
    from troubleshooter.trace.outside import OutsideOps
    from troubleshooter.trace.recorder import Recorder

    assert caused_by_tool(_raised(lambda: Recorder.on_backward(None, None)))  # a bug in our own line
    mode = OutsideOps()  # the loss watch: our __torch_function__ hands the op on, the op refuses
    mode.arm()
    try:
        passed = _raised(lambda: torch.ones(2) @ torch.ones(3))
    finally:
        mode.disarm()
    assert not caused_by_tool(passed)
    assert caused_by_tool(TypeError("cannot pickle 'Numerics' object"))
    shown = script_traceback(passed)
    assert "outside.py" not in shown and "test_trace_runtime.py" in shown and "RuntimeError" in shown
