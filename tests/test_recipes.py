"""The recipe renderer, its option metadata and the `recipe` command; the NaN guard under injected faults."""
from __future__ import annotations

import json
import re

import pytest

from troubleshooter import recipes
from troubleshooter.cli import main
from troubleshooter.errors import UserError


def test_template_as_checked_in_is_the_as_written_variant():
    """The template runs as a file: its live lines are exactly one rendering, the rest dormant."""
    raw = recipes._template_text()
    live = [ln for ln in raw.splitlines() if not recipes._MARKER.match(ln) and not recipes._DORMANT.match(ln)]
    expected = re.sub(r"\n{4,}", "\n\n\n", "\n".join(live).strip("\n") + "\n")
    assert recipes.render_recipe(**recipes.as_written_options()) == expected


def test_every_option_is_documented_and_reaches_the_template():
    raw = recipes._template_text()
    for opt in recipes._metadata()["options"]:
        assert opt["flag"].startswith("--") and opt["help"] and opt["adds"], opt
        used_as_block = re.search(rf"# \[option: (not )?{opt['name']}\b", raw)
        used_as_value = "config" in opt and re.search(rf"^{opt['config']} = ", raw, re.M)
        selects_template = opt["name"] == "task" and recipes._metadata()["task_templates"]
        assert used_as_block or used_as_value or selects_template, f"{opt['name']} changes nothing in the template"


def test_renderer_blocks_else_and_dormant_lines():
    text = "a\n# [option: x]\nb\n# [else]\n#| c\n# [end]\n    # [option: y=2]\n    #| d\n    # [end]\n"
    assert recipes.render_template(text, {"x": True, "y": 2}) == "a\nb\n    d\n"
    assert recipes.render_template(text, {"x": False, "y": 3}) == "a\nc\n"
    with pytest.raises(ValueError, match="line 2"):
        recipes.render_template("a\n# [end]\n", {})
    with pytest.raises(ValueError, match="not closed"):
        recipes.render_template("# [option: x]\n", {"x": 1})


def test_values_land_in_the_config_block():
    text = recipes.render_recipe(precision="bf16", clip=0.5, accum=4, log_every=7, scheduler="cosine")
    assert re.search(r'^PRECISION = "bf16" +#', text, re.M)
    assert re.search(r"^GRAD_CLIP = 0.5 +#", text, re.M)
    assert re.search(r"^ACCUM_STEPS = 4 +#", text, re.M)
    assert re.search(r"^LOG_EVERY = 7 +#", text, re.M)
    assert "Regenerate: python -m troubleshooter recipe --precision bf16 --clip 0.5 --accum 4" in text
    assert "parser.error(\"this recipe was generated without checkpoints" in text  # --resume explains
    assert "GradScaler(" not in text  # bf16 has float32's range: no loss scaling in the script


def test_bad_options_report_every_problem_at_once():
    with pytest.raises(UserError) as exc:
        recipes.render_recipe(precision="fp8", clip=-1, accum=0, log_every=0, distributed="horovod", colour="red")
    message = str(exc.value)
    for part in ("colour", "--precision", "--clip", "--accum", "--log-every", "--distributed"):
        assert part in message
    assert len(exc.value.problems) == 6


@pytest.mark.parametrize("options, words", [
    ({"channels_last": True}, "--model cnn"),
    ({"compile": True, "distributed": "fsdp"}, "fsdp"),
    ({"accum": 2.5}, "whole number"),
    ({"checkpoint": "yes"}, "true or false"),
    ({"clip": 0}, "> 0"),
])
def test_unsupported_combinations_and_values_are_refused(options, words):
    with pytest.raises(UserError, match=re.escape(words)):
        recipes.render_recipe(**options)


def test_cli_writes_the_script_and_lists_options(tmp_path, capsys):
    out = tmp_path / "train_amp.py"
    assert main(["recipe", "--precision", "fp16", "--clip", "1.0", "--accum", "4", "--scheduler", "cosine",
                 "--checkpoint", "--nan-guard", "-o", str(out)]) == 0
    text = out.read_text()
    assert text == recipes.render_recipe(precision="fp16", clip=1.0, accum=4, scheduler="cosine",
                                         checkpoint=True, nan_guard=True)
    assert main(["recipe", "--list", "--format", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [o["name"] for o in listed] == [o["name"] for o in recipes.recipe_options()]
    assert main(["recipe", "--list"]) == 0
    assert "--nan-guard" in capsys.readouterr().out


def test_cli_bad_combination_is_a_clear_error(capsys, tmp_path):
    assert main(["recipe", "--channels-last", "--clip", "0", "-o", str(tmp_path / "x.py")]) == 2
    err = capsys.readouterr().err
    assert "--clip: must be > 0" in err and "Traceback" not in err
    assert not (tmp_path / "x.py").exists()
    assert main(["recipe", "-o", str(tmp_path / "missing" / "x.py")]) == 2
    assert "cannot write" in capsys.readouterr().err


# A finite loss with NaN gradients while training on the listed micro-batches (by the script's own
# data position, so a resumed run meets the same faults): d sqrt(|z|)/dz at 0 is inf, times 0 is NaN.
_FAULT = """
_FAULT_BATCHES = {calls}
_plain_loss_fn = loss_fn


def loss_fn(logits, targets):
    loss = _plain_loss_fn(logits, targets)
    if model.training and globals().get("batches_seen") in _FAULT_BATCHES:
        loss = loss + 0.0 * (logits.sum() * 0.0).abs().sqrt()
    return loss
"""


def _run_with_faults(tmp_path, options: dict, calls: str, steps: int, *extra: str, out: str = "out"):
    import sys

    from tests import _scriptrunner

    text = recipes.render_recipe(**options)
    text = text.replace("\ndef get_batch(", _FAULT.format(calls=calls) + "\n\ndef get_batch(", 1)
    script = tmp_path / "train_faulty.py"
    script.write_text(text)
    return _scriptrunner.run([sys.executable, str(script), "--device", "cpu", "--max-steps", str(steps),
                              "--batch-size", "2", "--out-dir", str(tmp_path / out), *extra], None, timeout=240)


def test_nan_guard_skips_nonfinite_gradients_and_aborts_on_a_streak(tmp_path):
    import torch

    opts = dict(precision="bf16", nan_guard=True, checkpoint=True, eval=False, log_every=1)
    out = _run_with_faults(tmp_path, opts, "{2, 3}", 6)  # two bad steps with a finite loss: skipped
    assert out.returncode == 0, out.stderr
    assert "non-finite steps skipped: 2" in out.stdout
    weights = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["model"]
    assert all(torch.isfinite(t).all() for t in weights.values() if t.is_floating_point())
    out = _run_with_faults(tmp_path, dict(opts, checkpoint=False), "set(range(2, 999))", 30, out="out2")
    assert out.returncode != 0 and "in a row had inf/NaN" in out.stderr and not (tmp_path / "out2").exists()
    assert "Traceback" not in out.stderr


def test_without_the_guard_nonfinite_weights_are_never_saved(tmp_path):
    out = _run_with_faults(tmp_path, dict(precision="fp32", nan_guard=False, checkpoint=True, eval=False), "{1}", 3)
    assert out.returncode != 0 and "not saving" in out.stderr and not (tmp_path / "out" / "ckpt.pt").exists()


def test_recipe_reports_every_invalid_option_at_once(capsys):
    assert main(["recipe", "--accum", "0", "--clip", "-1", "--precision", "fp8", "--sync-batchnorm"]) == 2
    err = capsys.readouterr().err
    assert "--accum" in err and "--clip" in err and "--precision" in err and "--sync-batchnorm" in err


def test_skipped_fp16_steps_are_retried_so_the_schedule_completes_and_resume_is_exact(tmp_path):
    import torch

    opts = dict(precision="fp16", scheduler="cosine", checkpoint=True, nan_guard=True, eval=False, log_every=1)
    faults = "{1, 2, 6}"  # three attempts the GradScaler skips (inf/NaN gradients)
    whole = _run_with_faults(tmp_path, opts, faults, 12, out="whole")
    assert whole.returncode == 0, whole.stderr
    assert "done: 12 steps | fp16 steps skipped by the scaler: 3" in whole.stdout
    a = torch.load(tmp_path / "whole" / "ckpt.pt", weights_only=True)
    assert a["scheduler"]["last_epoch"] == 12 and a["batches_seen"] == 15  # 12 updates + 3 retried
    lrs = [float(x) for x in re.findall(r"\| lr ([\d.e+-]+)", whole.stdout)]
    assert lrs[-1] == pytest.approx(3e-3 * 0.1)  # the cosine schedule ran to its end
    first = _run_with_faults(tmp_path, opts, faults, 12, "--stop-at", "4", out="split")
    second = _run_with_faults(tmp_path, opts, faults, 12, "--resume", out="split")
    assert first.returncode == 0 and second.returncode == 0, second.stderr
    b = torch.load(tmp_path / "split" / "ckpt.pt", weights_only=True)
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert a["scaler"] == b["scaler"] and a["batches_seen"] == b["batches_seen"]


GAN_COMBOS = [dict(model="gan", precision=p, clip=c, checkpoint=k, nan_guard=g)
              for p in ("auto", "bf16", "fp16", "fp32") for c in (None, 1.0) for k in (False, True) for g in (False, True)]


@pytest.mark.parametrize("kind, key", [("model_templates", "gan"), ("task_templates", "inference")])
def test_own_templates_as_checked_in_are_their_as_written_variants(kind, key):
    raw = recipes._template_text(*(("gan", None) if key == "gan" else (None, key)))
    live = [ln for ln in raw.splitlines() if not recipes._MARKER.match(ln) and not recipes._DORMANT.match(ln)]
    expected = re.sub(r"\n{4,}", "\n\n\n", "\n".join(live).strip("\n") + "\n")
    as_written = recipes._metadata()[kind][key]["as_written"]
    assert recipes.render_recipe(**as_written) == expected


def test_inference_variants_compile_lint_clean_and_refuse_training_options():
    from troubleshooter import lint

    for precision in ("auto", "bf16", "fp16", "fp32"):
        for extra in ({}, {"compile": True, "load_weights": True}):
            text = recipes.render_recipe(task="inference", precision=precision, **extra)
            compile(text, "infer_amp.py", "exec")
            code = text.split('"""', 2)[2]  # after the docstring
            assert "GradScaler(" not in code and "optim." not in code and "inference_mode()" in code
            report = lint.lint_text(text, path="infer_amp.py")
            assert not [f for f in report.findings if getattr(f.severity, "value", f.severity) != "info"]
    with pytest.raises(UserError, match="--clip is not available with --task inference"):
        recipes.render_recipe(task="inference", clip=1.0)


def test_every_gan_variant_compiles_lints_clean_and_uses_one_scaler():
    from troubleshooter import lint

    for options in GAN_COMBOS:
        text = recipes.render_recipe(**options)
        compile(text, "train_gan_amp.py", "exec")
        assert "#|" not in text and "[option:" not in text
        body = text.split('"""', 2)[2]  # the code, after the docstring
        code = [ln.strip() for ln in body.splitlines() if not ln.lstrip().startswith("#")]
        if options["precision"] in ("auto", "fp16"):
            assert code.count("scaler.update()") == 1 and sum("GradScaler(" in ln for ln in code) == 1
            assert code.count("scaler.step(opt_d)") == 1 and code.count("scaler.step(opt_g)") == 1
            assert code.index("scaler.step(opt_g)") < code.index("scaler.update()")
        else:
            assert not any("scaler" in ln for ln in code)
        report = lint.lint_text(text, path="train_gan_amp.py")
        loud = [f for f in report.findings if getattr(f.severity, "value", f.severity) in ("error", "warning")]
        assert not report.errors and not loud, (options, [(f.rule, f.location.line, f.message) for f in loud])


def test_gan_trains_skips_and_resumes_exactly(tmp_path):
    import sys

    import torch

    from tests import _scriptrunner

    script = tmp_path / "gan.py"
    script.write_text(recipes.render_recipe(model="gan", precision="fp16", clip=1.0, checkpoint=True, nan_guard=True))
    base = [sys.executable, str(script), "--device", "cpu", "--max-steps", "30", "--batch-size", "32"]
    runs = [_scriptrunner.run(base + extra, None, timeout=240) for extra in
            (["--out-dir", str(tmp_path / "whole")], ["--out-dir", str(tmp_path / "split"), "--stop-at", "12"],
             ["--out-dir", str(tmp_path / "split"), "--resume"])]
    assert all(r.returncode == 0 for r in runs), runs[-1].stderr
    assert "resumed from" in runs[2].stdout and "done: 30 steps" in runs[0].stdout
    a = torch.load(tmp_path / "whole" / "ckpt.pt", weights_only=True)
    b = torch.load(tmp_path / "split" / "ckpt.pt", weights_only=True)
    for part in ("generator", "discriminator"):
        assert all(torch.equal(a[part][k], b[part][k]) for k in a[part]), part
    assert a["scaler"] == b["scaler"] and a["step"] == b["step"] == 30


def test_gan_refuses_options_it_does_not_take(capsys):
    assert main(["recipe", "--model", "gan", "--distributed", "ddp", "--scheduler", "cosine"]) == 2
    err = capsys.readouterr().err
    assert "--distributed is not available with --model gan" in err and "--scheduler" in err


def _checkpoint_blocks_function():
    """`checkpoint_blocks` as the rendered recipe defines it (its own source, run in a namespace)."""
    import ast

    import torch
    import torch.nn as nn
    import torch.utils.checkpoint  # noqa: F401  (the recipe imports it)

    text = recipes.render_recipe(activation_checkpointing=True)
    fn = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == "checkpoint_blocks")
    namespace = {"torch": torch, "nn": nn}
    exec(compile(ast.Module([fn], []), "recipe", "exec"), namespace)
    return namespace["checkpoint_blocks"]


def test_activation_checkpointing_finds_blocks_by_class_anywhere_and_keeps_names():
    """No `model.blocks` needed: blocks of the named class are recomputed wherever they sit, the
    gradients are those of the plain model, and the parameter names (hence checkpoints) do not change."""
    import copy

    import torch
    import torch.nn as nn

    checkpoint_blocks = _checkpoint_blocks_function()
    calls = []

    class DecoderLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x, scale=1.0):
            calls.append(1)
            return x + torch.tanh(self.fc(x)) * scale

    class Net(nn.Module):  # blocks under another name, one nested deeper, and a keyword argument
        def __init__(self):
            super().__init__()
            self.encoder = nn.ModuleDict({"layers": nn.ModuleList([DecoderLayer(), DecoderLayer()])})
            self.extra = nn.Sequential(nn.Linear(8, 8), DecoderLayer())

        def forward(self, x):
            for layer in self.encoder["layers"]:
                x = layer(x, scale=0.5)
            return self.extra(x).sum()

    torch.manual_seed(0)
    plain, wrapped = Net(), None
    wrapped = copy.deepcopy(plain)
    assert checkpoint_blocks(wrapped, {"DecoderLayer"}) == 3
    assert list(wrapped.state_dict()) == list(plain.state_dict())
    x = torch.randn(4, 8)
    plain(x).backward()
    calls.clear()
    wrapped(x).backward()
    assert len(calls) == 6  # each of the 3 blocks ran again in backward: activations were not stored
    for (name, p), q in zip(plain.named_parameters(), wrapped.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6), name
    calls.clear()
    wrapped.eval()
    with torch.no_grad():
        wrapped(x)
    assert len(calls) == 3  # no checkpointing outside training
    with pytest.raises(SystemExit, match="CHECKPOINT_CLASSES"):
        checkpoint_blocks(Net(), {"LlamaDecoderLayer"})


def test_activation_checkpointing_trains_and_resumes_exactly(tmp_path):
    """The CNN's ConvBlocks (the transformer's Blocks train in the variants test) under bf16 with the
    NaN guard: a step with non-finite gradients is skipped, and a run stopped and resumed after it
    ends with the same weights and the same skip count as the uninterrupted run."""
    import torch

    opts = dict(model="cnn", precision="bf16", activation_checkpointing=True, checkpoint=True, nan_guard=True,
                eval=False, log_every=1)
    whole = _run_with_faults(tmp_path, opts, "{2, 5}", 7, out="whole")
    assert whole.returncode == 0, whole.stderr
    assert "non-finite steps skipped: 2" in whole.stdout
    first = _run_with_faults(tmp_path, opts, "{2, 5}", 7, "--stop-at", "3", out="split")
    second = _run_with_faults(tmp_path, opts, "{2, 5}", 7, "--resume", out="split")
    assert first.returncode == 0 and second.returncode == 0, second.stderr
    assert "resumed from" in second.stdout
    a = torch.load(tmp_path / "whole" / "ckpt.pt", weights_only=True)
    b = torch.load(tmp_path / "split" / "ckpt.pt", weights_only=True)
    assert list(a["model"]) == list(b["model"]) and not any(".block." in k for k in a["model"])
    assert a["batches_seen"] == b["batches_seen"]
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
        if a["model"][key].is_floating_point():
            assert torch.isfinite(a["model"][key]).all(), key
