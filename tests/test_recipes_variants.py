"""Every recipe variant (a pairwise covering set) renders, compiles, lints clean and trains on CPU.

Training runs the generated script as a user would (`python SCRIPT ARGS`, in a child forked from a
warm interpreter: tests/_scriptrunner.py) for a dozen steps on the demo model; resume and torchrun
(DDP, FSDP2 on gloo, fresh interpreters) are checked the same way.
"""
from __future__ import annotations

import ast
import itertools
import math
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from tests import _scriptrunner as scriptrunner
from troubleshooter import recipes

# The option values a covering set must pair with each other (distributed runs are separate).
SPACE = {
    "precision": ["auto", "bf16", "fp16", "fp32"],
    "model": ["transformer", "cnn"],
    "clip": [None, 1.0],
    "accum": [1, 3],
    "scheduler": ["none", "cosine"],
    "checkpoint": [False, True],
    "nan_guard": [False, True],
    "eval": [False, True],
    "compile": [False, True],
    "channels_last": [False, True],
    "activation_checkpointing": [False, True],
    "data": ["synthetic", "loader"],
    "ema": [False, True],
}


# Rendering, compiling and linting are cheap: there the covering set also pairs the process setup.
STATIC_SPACE = {**SPACE, "distributed": ["none", "ddp", "fsdp"], "log_every": [1, 10], "tf32": [False, True],
                "cudnn_benchmark": [False, True], "lora": [False, True], "load_weights": [False, True]}


def _valid(row: dict) -> bool:
    return (not (row.get("channels_last") and row.get("model") == "transformer")
            and not (row.get("compile") and row.get("distributed") == "fsdp")
            and not (row.get("ema") and row.get("distributed") == "fsdp")
            and not (row.get("lora") and (row.get("model") == "cnn" or row.get("distributed") == "fsdp"
                                          or row.get("channels_last"))))  # channels_last needs the cnn


def required_pairs(space: dict = SPACE) -> set:
    pairs = set()
    for (a, va_list), (b, vb_list) in itertools.combinations(space.items(), 2):
        for va in va_list:
            for vb in vb_list:
                if _valid({a: va, b: vb}):
                    pairs.add((a, repr(va), b, repr(vb)))
    return pairs


def covered_pairs(rows, space: dict = SPACE) -> set:
    pairs = set()
    for row in rows:
        full = {name: row.get(name, recipes.default_options()[name]) for name in space}
        for (a, va), (b, vb) in itertools.combinations(full.items(), 2):
            pairs.add((a, repr(va), b, repr(vb)))
    return pairs


def pairwise_rows(space: dict = SPACE) -> list[dict]:
    """Greedy all-pairs: each new row covers as many still-uncovered pairs as it can."""
    uncovered, rows = required_pairs(space), []
    while uncovered:
        a, va, b, vb = min(uncovered)
        row = {a: ast.literal_eval(va), b: ast.literal_eval(vb)}
        for name, values in space.items():
            if name in row:
                continue
            def gain(v):
                trial = {**row, name: v}
                if not _valid(trial):
                    return -1
                return sum((n, repr(trial[n]), name, repr(v)) in uncovered or (name, repr(v), n, repr(trial[n])) in uncovered
                           for n in row)
            row[name] = max(values, key=gain)
        uncovered -= covered_pairs([row], space)
        rows.append(row)
    return rows


VARIANTS = pairwise_rows()
STATIC_VARIANTS = pairwise_rows(STATIC_SPACE)
DISTRIBUTED_VARIANTS = [
    dict(distributed="ddp", precision="bf16", clip=1.0, accum=2, scheduler="cosine", checkpoint=True,
         nan_guard=True, eval=True, model="cnn", channels_last=True),
    dict(distributed="fsdp", precision="bf16", clip=1.0, accum=2, scheduler="cosine", checkpoint=True,
         nan_guard=True, eval=True),
    dict(distributed="fsdp", precision="fp16", clip=0.5, accum=2, scheduler="cosine", checkpoint=True,
         nan_guard=True, eval=True, model="cnn", data="loader"),  # BatchNorm under FSDP2, size-policy units
]
# One DDP and one FSDP2 run under torchrun: each costs three Python processes.
TORCHRUN_VARIANTS = [DISTRIBUTED_VARIANTS[0], DISTRIBUTED_VARIANTS[2]]


def _ids(options):
    return ",".join(f"{k}={v}" for k, v in options.items())


def test_pairwise_sets_cover_every_pair_and_stay_small():
    assert required_pairs() <= covered_pairs(VARIANTS)
    assert required_pairs(STATIC_SPACE) <= covered_pairs(STATIC_VARIANTS, STATIC_SPACE)
    assert len(VARIANTS) <= 12 and len(STATIC_VARIANTS) <= 16


@pytest.mark.parametrize("options", STATIC_VARIANTS + DISTRIBUTED_VARIANTS, ids=_ids)
def test_variant_compiles_and_keeps_the_amp_order(options):
    text = recipes.render_recipe(**options)
    compile(text, "train_amp.py", "exec")
    assert "#|" not in text and "[option:" not in text and "[end]" not in text
    assert "zero_grad(set_to_none=True)" in text
    if options.get("precision", "auto") in ("fp16", "auto"):
        order = ["scaler.scale(loss).backward()", "scaler.step(optimizer)", "scaler.update()"]
        if options.get("clip"):
            order[1:1] = ["scaler.unscale_(optimizer)", "clip_grad_norm_("]
        positions = [text.index(s) for s in order]
        assert positions == sorted(positions), order
        assert text.count("scaler.update()") == 1 and text.count("scaler.step(") == 1
        if options.get("checkpoint"):
            assert '"scaler": scaler.state_dict()' in text and "scaler.load_state_dict(" in text
        if options.get("scheduler") == "cosine":
            # A skipped step leaves the loop before the schedule advances (and is retried).
            assert re.search(r"if not stepped:.*\n\s+check_nonfinite_streak\(step\)\n\s+continue\n\s+scheduler\.step\(\)",
                             text)
    else:
        assert "GradScaler(" not in text and "scaler." not in text
    # DDP skips the all-reduce of all but the last micro-batch through its documented no_sync(), not by
    # setting an undocumented attribute; the forward runs inside it (DDP decides in the forward).
    assert "require_backward_grad_sync" not in text
    if options.get("distributed") == "ddp":
        assert "else model.no_sync()" in text and "with grad_sync, autocast_ctx:" in text


def test_every_variant_passes_our_own_linter():
    from troubleshooter import lint

    for options in STATIC_VARIANTS + VARIANTS + DISTRIBUTED_VARIANTS:
        report = lint.lint_text(recipes.render_recipe(**options), path="train_amp.py")
        loud = [f for f in report.findings if getattr(f.severity, "value", f.severity) in ("error", "warning")]
        assert not report.errors, (options, report.errors)
        assert not loud, (options, [(f.rule, f.location.line, f.message) for f in loud])


# ---------------------------------------------------------------------------------------------
# Running the generated scripts

ROOT = Path(__file__).resolve().parent.parent
STEP_LINE = re.compile(r"^step (\d+)/\d+ \| loss (\S+)", re.M)


def _env(**extra) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), **extra)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def _write(tmp_path: Path, name: str, options: dict) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(recipes.render_recipe(log_every=4, **options))
    return path


def _run(cmd: list[str], cwd: Path, timeout: float = 240, **env) -> str:
    proc = scriptrunner.run(cmd, cwd, _env(**env), timeout)  # `python SCRIPT ...` forks from a warm zygote
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{proc.stdout}\n{proc.stderr[-3000:]}"
    # A first run prints no warnings of its own (torchrun's OMP_NUM_THREADS notice is the launcher's).
    own = [ln for ln in proc.stderr.splitlines() if "Warning" in ln and "OMP_NUM_THREADS" not in ln]
    assert not own, own
    return proc.stdout


def _losses(stdout: str) -> list[float]:
    return [float(v) for _, v in STEP_LINE.findall(stdout)]


def _train_args(options: dict, out: Path) -> list[str]:
    # CPU fp16 is emulated and slow: fewer samples there. Everything else: a dozen steps.
    batch = "4" if options.get("precision") == "fp16" else "8"
    return ["--max-steps", "12", "--batch-size", batch, "--device", "cpu", "--out-dir", str(out)]


def test_every_variant_trains_and_its_loss_falls(tmp_path):
    """Pairwise variants run in parallel pairs. `compile` variants run with TorchDynamo disabled
    (their code path runs; inductor on CPU takes minutes: see test_compile_variant_really_compiles)."""
    def job(i_options):
        i, options = i_options
        script = _write(tmp_path, f"v{i}", options)
        extra = {"TORCHDYNAMO_DISABLE": "1"} if options.get("compile") else {}
        return options, _run([sys.executable, str(script), *_train_args(options, tmp_path / f"out{i}")],
                             tmp_path, **extra)

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(job, enumerate(VARIANTS)))
    for options, stdout in results:
        losses = _losses(stdout)
        assert len(losses) == 3, (options, stdout)
        assert all(math.isfinite(x) for x in losses), (options, stdout)
        assert losses[-1] < losses[0], (options, stdout)
        assert re.search(r"^done: 12 steps", stdout, re.M), stdout
        ckpt = tmp_path / f"out{VARIANTS.index(options)}" / ("ckpt.pt" if options.get("checkpoint") else "model.pt")
        assert ckpt.exists(), options


def _state(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def _assert_same(a, b, where="ckpt"):
    if isinstance(a, dict):
        assert set(a) == set(b), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    else:
        assert a == b, where


def test_resume_in_a_new_process_reproduces_the_uninterrupted_run(tmp_path):
    """fp16 + clip + accumulation + cosine + NaN guard: stop at step 4, resume, compare at step 8
    with a run that never stopped: weights, optimizer, scheduler, GradScaler (scale and growth
    tracker), step and counters must be identical, as must every logged loss after the stop."""
    options = dict(precision="fp16", clip=1.0, accum=2, scheduler="cosine", checkpoint=True, nan_guard=True)
    script = _write(tmp_path, "resume", options)
    # A scale that grows every 2 steps and overflows fp16 now and then, so the scaler state moves.
    text = script.read_text()
    assert "torch.amp.GradScaler(device.type, enabled=PRECISION == \"fp16\")" in text
    script.write_text(text.replace("torch.amp.GradScaler(device.type, enabled=PRECISION == \"fp16\")",
                                   "torch.amp.GradScaler(device.type, enabled=PRECISION == \"fp16\", "
                                   "init_scale=2.0**14, growth_interval=2)"))
    args = ["--max-steps", "8", "--batch-size", "4", "--device", "cpu"]
    whole_dir, split_dir = tmp_path / "whole", tmp_path / "split"
    with ThreadPoolExecutor(max_workers=2) as pool:
        whole = pool.submit(_run, [sys.executable, str(script), *args, "--out-dir", str(whole_dir)], tmp_path)
        first = pool.submit(_run, [sys.executable, str(script), *args, "--out-dir", str(split_dir),
                                   "--stop-at", "4"], tmp_path)
        whole_out, first_out = whole.result(), first.result()
    assert _state(split_dir / "ckpt.pt")["step"] == 4
    second_out = _run([sys.executable, str(script), *args, "--out-dir", str(split_dir), "--resume"], tmp_path)
    assert "resumed from" in second_out and "at step 4" in second_out

    a, b = _state(whole_dir / "ckpt.pt"), _state(split_dir / "ckpt.pt")
    assert a["step"] == b["step"] == 8
    assert a["scaler"]["scale"] != 2.0**14, "the scaler never moved: the test would prove nothing"
    _assert_same(a, b)
    assert STEP_LINE.findall(whole_out)[-1] == STEP_LINE.findall(second_out)[-1]
    assert STEP_LINE.findall(first_out) == STEP_LINE.findall(whole_out)[: len(STEP_LINE.findall(first_out))]


def test_resume_from_a_missing_checkpoint_is_a_clear_error(tmp_path):
    script = _write(tmp_path, "ck", dict(checkpoint=True, precision="bf16"))
    proc = scriptrunner.run([sys.executable, str(script), "--resume", str(tmp_path / "nope.pt")], tmp_path, _env(), 120)
    assert proc.returncode != 0 and "no checkpoint at" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("options", TORCHRUN_VARIANTS, ids=_ids)
def test_distributed_variant_under_torchrun_on_gloo(tmp_path, options):
    """Two processes on gloo. The FSDP2 run stops at step 4 and resumes from its full-state checkpoint."""
    script = _write(tmp_path, "dist", options)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script),
           "--max-steps", "8", "--batch-size", "4", "--device", "cpu", "--out-dir", str(out)]
    if options["distributed"] == "fsdp":
        stdout = _run(cmd + ["--stop-at", "4"], tmp_path, timeout=300)
        stdout += _run(cmd + ["--resume"], tmp_path, timeout=300)
        assert "resumed from" in stdout and "at step 4" in stdout
    else:
        stdout = _run(cmd, tmp_path, timeout=300)
    assert "2 process(es)" in stdout
    losses = _losses(stdout)
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses) and losses[-1] < losses[0], stdout
    ckpt = _state(out / "ckpt.pt")
    assert ckpt["step"] == 8
    # Full (unsharded) float32 weights, even from FSDP's shards.
    assert all(t.dtype == torch.float32 for t in ckpt["model"].values() if t.is_floating_point())
    assert all(type(t) is torch.Tensor for t in ckpt["model"].values())


@pytest.mark.skipif(os.environ.get("AMP_TS_SLOW_TESTS") != "1",
                    reason="inductor compiles for minutes on CPU; set AMP_TS_SLOW_TESTS=1 to run")
def test_compile_variant_really_compiles(tmp_path):
    script = _write(tmp_path, "compiled", dict(compile=True, precision="bf16"))
    stdout = _run([sys.executable, str(script), "--max-steps", "4", "--batch-size", "8", "--device", "cpu",
                   "--out-dir", str(tmp_path / "o")], tmp_path, timeout=600)
    assert all(math.isfinite(x) for x in _losses(stdout))
