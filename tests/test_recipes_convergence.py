"""Generated loops must learn, not only run: for every model kind, the bf16 and fp16 loops follow the
fp32 loop on CPU (same seed, same data) and reach what it reaches. The GAN must learn the real ring
(radius 2), which it did not when the discriminator stepped on the generator's loss-scaled gradients
(issue 26). The loops the questionnaire hands back for LoRA, weights stored in float16 and inference
do what their reasons say. All runs share one process (tests/_recipe_runs.py): torch is imported once."""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from troubleshooter import recipes

PRECISIONS = ("fp32", "bf16", "fp16")
# Small and deterministic: a tiny GPT and a small CNN for 30 steps (clipping on, so the unscale_ path
# runs), the GAN for 200 iterations (long enough to separate the fixed loop from the broken one: the
# old order had its samples at radius 3.5-4.2 by then, the fixed one at 1.95-1.98).
KINDS = {
    "transformer": ({"model": "transformer", "clip": 1.0}, ["--max-steps", "30", "--batch-size", "4"]),
    "cnn": ({"model": "cnn", "clip": 1.0}, ["--max-steps", "30", "--batch-size", "4"]),
    "gan": ({"model": "gan", "clip": 1.0}, ["--max-steps", "200"]),
    "lora": ({"model": "transformer", "lora": True, "clip": 1.0}, ["--max-steps", "30", "--batch-size", "4"]),
    "inference": ({"task": "inference"}, ["--batches", "4", "--batch-size", "32"]),
}
STEP_LOSS = re.compile(r"^step (\d+)/\d+ \| loss (\S+)", re.M)
RADIUS = re.compile(r"mean radius of generated samples (\S+)")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("convergence")
    spec = [{"name": f"{kind}_{p}", "options": {**opts, "precision": p},
             "argv": ["--device", "cpu", *argv] + ([] if kind == "inference" else ["--out-dir", str(out / f"{kind}_{p}")])}
            for kind, (opts, argv) in KINDS.items() for p in PRECISIONS]
    # Start from the trained fp32 transformer's weights stored in float16 (a half-precision checkpoint).
    spec.append({"name": "init_fp16", "options": {"model": "transformer", "precision": "fp16", "load_weights": True},
                 "half_copy": [str(out / "transformer_fp32" / "model.pt"), str(out / "weights_fp16.pt")],
                 "argv": ["--device", "cpu", "--max-steps", "10", "--batch-size", "4", "--out-dir", str(out / "init"),
                          "--init-from", str(out / "weights_fp16.pt")]})
    (out / "spec.json").write_text(json.dumps(spec))
    root = str(Path(__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("_recipe_runs.py")), str(out),
                           str(out / "spec.json")], capture_output=True, text=True, timeout=300, cwd=root, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout)
    for name, r in results.items():
        assert r["exit"] == 0, (name, r["stdout"][-2000:])
    return results


@pytest.mark.parametrize("kind", ["transformer", "cnn", "lora"])
def test_half_precision_loops_follow_the_fp32_loop(runs, kind):
    curves = {p: [float(v) for _, v in STEP_LOSS.findall(runs[f"{kind}_{p}"]["stdout"])] for p in PRECISIONS}
    reference = curves["fp32"]
    assert len(reference) == 3 and all(math.isfinite(v) for v in reference)
    assert reference[-1] < 0.8 * reference[0], reference  # the fp32 loop itself learns
    for p in ("bf16", "fp16"):
        assert len(curves[p]) == len(reference), (p, runs[f"{kind}_{p}"]["stdout"][-1500:])
        for got, want in zip(curves[p], reference):
            assert abs(got - want) <= 0.03 * want + 1e-3, (kind, p, curves[p], reference)
    assert "scale 65536" in runs[f"{kind}_fp16"]["stdout"]  # the fp16 loop really ran with its GradScaler


def test_gan_learns_the_real_ring_in_every_precision(runs):
    radius = {p: float(RADIUS.search(runs[f"gan_{p}"]["stdout"]).group(1)) for p in PRECISIONS}
    for p, r in radius.items():
        assert 1.6 <= r <= 2.4, radius  # the real samples lie on a ring of radius 2
        assert abs(r - radius["fp32"]) <= 0.25, radius


def test_the_discriminator_steps_before_the_generators_backward():
    """The order the convergence test depends on, in every GAN variant that has a scaler."""
    for precision in ("auto", "fp16"):
        for guard in (False, True):
            code = [ln.strip() for ln in recipes.render_recipe(model="gan", precision=precision, clip=1.0,
                                                               nan_guard=guard).splitlines()]
            d_step, g_backward = code.index("scaler.step(opt_d)"), code.index("scaler.scale(loss_g).backward()")
            assert d_step < g_backward
            frozen = code.index("discriminator.requires_grad_(False)")
            assert frozen < g_backward < code.index("discriminator.requires_grad_(True)")


def test_lora_trains_float32_adapters_on_a_half_precision_base(runs):
    for p, base in (("fp16", "torch.float16"), ("bf16", "torch.bfloat16"), ("fp32", "torch.float32")):
        line = next(ln for ln in runs[f"lora_{p}"]["stdout"].splitlines() if ln.startswith("LoRA:"))
        assert "trainable adapter parameters in torch.float32" in line and f"frozen in {base}" in line, line


def test_weights_stored_in_float16_start_as_float32_master_weights(runs):
    out = runs["init_fp16"]["stdout"]
    assert "as float32 master weights" in out and "scale 65536" in out
    fresh = float(STEP_LOSS.findall(runs["transformer_fp16"]["stdout"])[0][1])
    started = float(STEP_LOSS.findall(out)[0][1])
    trained = float(STEP_LOSS.findall(runs["transformer_fp32"]["stdout"])[-1][1])
    assert started < 0.5 * fresh and started < 2 * trained  # it continued from the trained weights


def test_inference_runs_in_the_half_dtype_and_checks_against_float32(runs):
    for p in ("bf16", "fp16"):
        out = runs[f"inference_{p}"]["stdout"]
        assert f"inference on cpu in {p}" in out and "top-1 disagreement with float32" in out
        assert re.search(rf"^done: 4 batches in {p}", out, re.M)
    assert "disagreement" not in runs["inference_fp32"]["stdout"]  # nothing to compare in float32
