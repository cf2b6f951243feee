"""Framework-managed AMP (issue 23): the rules AMP130-AMP142 on real framework files, the precision read
from config files beside a script, and severity that follows how sure the precision is."""
import importlib.util
import json
from pathlib import Path

import pytest

from troubleshooter.lint import lint_paths, lint_text

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "lint_corpus_frameworks"
CONFIGS = ROOT / "tests" / "fixtures" / "lint_configs"
PERMISSIVE = {"Apache-2.0", "MIT", "BSD-3-Clause"}


@pytest.fixture(scope="module")
def result():
    spec = importlib.util.spec_from_file_location("lint_corpus", ROOT / "bench" / "lint_corpus.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.evaluate(CORPUS)


def test_corpus_is_real_sourced_and_permissive():
    labels = json.loads((CORPUS / "labels.json").read_text())
    real = {n: e for n, e in labels.items() if e["origin"] == "real"}
    assert len(real) >= 20 and sum(1 for e in real.values() if e["expect"]) >= 8
    for name, entry in labels.items():
        assert "Source:" in (CORPUS / name).read_text().splitlines()[1], name
        if entry["origin"] == "real":
            assert entry["licence"] in PERMISSIVE and "@" in entry["source"], name
    assert {e["kind"] for e in labels.values()} >= {"accelerate", "lightning", "fabric", "hf_trainer", "deepspeed", "fsdp"}


def test_no_false_error_or_warning_and_every_label_found(result):
    assert [f for f in result["false"] if f[2] in ("error", "warning")] == []
    assert result["missed"] == [] and result["unread"] == []


def _rules(src: str, path: str = "t.py") -> dict[tuple[str, int], str]:
    return {(f.rule, f.location.line): f.severity.value for f in lint_text(src, path).findings}


_ACCEL = """import torch
from accelerate import Accelerator
accelerator = Accelerator({kw})
model, optimizer = accelerator.prepare(model, optimizer)
for batch in loader:
    accelerator.backward(model(batch).sum())
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
"""


@pytest.mark.parametrize("kw, want", [('mixed_precision="fp16"', "error"), ("mixed_precision=args.mp", "warning"),
                                      ("", "warning"), ('mixed_precision="bf16"', None), ('mixed_precision="no"', None)])
def test_severity_follows_how_sure_the_precision_is(kw, want):
    """error only for float16 written in the file; a precision from outside gives a warning; bf16/fp32 nothing."""
    assert _rules(_ACCEL.format(kw=kw)).get(("AMP130", 7)) == want


def test_argparse_default_and_choices_name_the_evidence():
    src = _ACCEL.format(kw="mixed_precision=args.mixed_precision") + (
        "import argparse\np = argparse.ArgumentParser()\n"
        "p.add_argument('--mixed_precision', default='bf16', choices=['no', 'fp16', 'bf16'])\n")
    f = next(f for f in lint_text(src).findings if f.rule == "AMP130")
    assert f.severity.value == "warning" and "defaults to 'bf16'" in f.message


def test_config_files_beside_the_script_are_read_from_disk_only():
    """`accelerate launch` reads mixed_precision from the YAML; LightningCLI reads trainer.precision; DeepSpeed
    the JSON the script names. lint_text (an upload, no folder) never reads them."""
    report = lint_paths([str(CONFIGS)])
    got = {(Path(f.location.path).parent.name, f.rule): f for f in report.findings}
    assert "default_config.yaml:8" in got[("accelerate_yaml", "AMP130")].message
    assert "config.yaml:5: trainer.precision: 16-mixed" in got[("lightning_cli", "AMP130")].message
    ds = got[("deepspeed_json", "AMP136")]
    assert "ds_config.json:9" in ds.message and ds.severity.value == "warning"  # named by a default: may be another
    text = (CONFIGS / "accelerate_yaml" / "train.py").read_text()
    uploaded = [f for f in lint_text(text, str(CONFIGS / "accelerate_yaml" / "train.py")).findings if f.rule == "AMP130"]
    assert uploaded and "default_config.yaml" not in uploaded[0].message


def test_fsdp2_with_a_plain_grad_scaler_is_right():
    """torch 2.13: DTensor gradients reduce the inf check (found_inf_reduce_handler): no AMP135 for FSDP2."""
    src = ("import torch\nfrom torch.distributed.fsdp import FullyShardedDataParallel as FSDP, MixedPrecision,"
           " MixedPrecisionPolicy, fully_shard\n{wrap}\nscaler = torch.amp.GradScaler('cuda')\n"
           "scaler.scale(model(x).sum()).backward()\nscaler.step(opt)\nscaler.update()\n")
    fsdp1 = "model = FSDP(model, mixed_precision=MixedPrecision(param_dtype=torch.float16))"
    fsdp2 = "fully_shard(model, mp_policy=MixedPrecisionPolicy(param_dtype=torch.float16))"
    assert ("AMP135", 4) in _rules(src.format(wrap=fsdp1))
    assert not any(r == "AMP135" for r, _ in _rules(src.format(wrap=fsdp2)))


def test_a_local_name_prepared_in_another_function_is_another_object():
    """accelerate's fp8 benchmarks: train_baseline() steps its own optimizer; train_integration() prepares one."""
    src = ("from accelerate import Accelerator\n"
           "def baseline(model, optimizer):\n    accelerator = Accelerator()\n"
           "    for b in loader:\n        model(b).sum().backward()\n        optimizer.step()\n"
           "def integration(model, optimizer):\n    accelerator = Accelerator(mixed_precision='fp16')\n"
           "    model, optimizer = accelerator.prepare(model, optimizer)\n"
           "    for b in loader:\n        model(b).sum().backward()\n        optimizer.step()\n")
    got = _rules(src)
    assert ("AMP141", 11) in got and not any(line == 5 for _, line in got)


def test_a_config_beside_the_script_is_read_bounded(tmp_path):
    """A YAML config is user input like a spec: a few hundred bytes of aliases ("billion laughs")
    expanding past the bounded loader's limit are refused, and the config is then no evidence."""
    src = CONFIGS / "accelerate_yaml"
    (tmp_path / "train.py").write_text((src / "train.py").read_text())
    good = (src / "default_config.yaml").read_text()
    bomb = ['l0: &l0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    bomb += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, 9)]
    (tmp_path / "default_config.yaml").write_text(good)
    cited = [f for f in lint_paths([str(tmp_path)]).findings if "default_config.yaml" in f.message]
    assert cited  # the plain config is evidence
    (tmp_path / "default_config.yaml").write_text(good + "\n".join(bomb) + "\nlaughs: *l8\n")
    report = lint_paths([str(tmp_path)])
    assert not any("default_config.yaml" in f.message for f in report.findings)
