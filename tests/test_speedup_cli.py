"""`python -m troubleshooter speedup`: presets and YAML specs, JSON/text, --plot, exit codes."""
import json

import pytest

from troubleshooter.cli import main
from troubleshooter.engine.speedup_plot import plot_speedup

PRESET = "mlp:in_features=32,hidden=64,depth=2,batch_size=16"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
YAML = """\
name: cli-yaml
model:
  layers:
    - Linear: [16, 32]
    - ReLU
    - Linear: [32, 4]
input: {shape: [8, 16], dtype: float32}
target: {kind: classes, num_classes: 4}
loss: cross_entropy
optimizer: {name: sgd, lr: 0.01}
"""


def test_preset_json_with_plot(tmp_path, capsys):
    png = tmp_path / "speedup.png"
    code = main(["speedup", "--preset", PRESET, "--device", "cpu", "--budget", "1",
                 "--format", "json", "--plot", str(png)])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert set(out["results"]) == {"fp32", "fp16", "bf16"} and "tf32" in out["unavailable"]
    fp32 = out["results"]["fp32"]["median_ms"]
    for r in out["results"].values():
        assert r["speedup_vs_fp32_medians"] == pytest.approx(fp32 / r["median_ms"])
        assert len(r["samples_ms"]) == r["samples"] > 0
    assert out["spec"]["name"] == "mlp" and out["verdict"]["recommendation"]
    data = png.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000


def test_yaml_spec_text_output(tmp_path, capsys):
    spec = tmp_path / "model.yaml"
    spec.write_text(YAML)
    code = main(["speedup", str(spec), "--device", "cpu", "--precisions", "fp32,bf16", "--budget", "1"])
    out = capsys.readouterr().out
    assert code == 0
    assert "cli-yaml" in out and "CPU numbers" in out and "Verdict:" in out
    rows = [line.split()[0] for line in out.splitlines() if line[:4] in ("fp32", "bf16", "fp16")]
    assert rows == ["fp32", "bf16*"] or rows == ["fp32", "bf16"]  # fp16 was not asked for


@pytest.mark.parametrize("argv,needle", [
    (["speedup", "--preset", PRESET, "--precisions", "fp32,fp8"], "unknown precision"),
    (["speedup", "--preset", PRESET, "--device", "cuda:7"], "cuda"),
    (["speedup"], "no model given"),
    (["speedup", "--preset", "nosuchmodel"], "nosuchmodel"),
    (["speedup", "--preset", PRESET, "--plot", "out.jpg"], "PNG"),
    (["speedup", "--python", "model.py"], "allow-exec"),
])
def test_bad_input_exits_2_with_a_message(argv, needle, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.py").write_text("def build_model():\n    raise SystemExit\n")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and needle.lower() in err.lower() and "Traceback" not in err


def test_bad_budget_is_an_argument_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["speedup", "--preset", PRESET, "--budget", "-3"])
    assert exc.value.code == 2
    assert "positive" in capsys.readouterr().err


def test_plot_from_a_saved_result_without_memory(tmp_path):
    result = {
        "device": {"type": "cuda", "name": "NVIDIA A100-SXM4-80GB", "cpu_numbers": False},
        "spec": {"name": "gpt"}, "settings": {"compile": True},
        "results": {p: {"median_ms": m, "q1_ms": m * 0.98, "q3_ms": m * 1.03, "speedup_vs_fp32": 40.0 / m,
                        "peak_memory_bytes": None} for p, m in (("fp32", 40.0), ("tf32", 20.0), ("bf16", 12.0))},
        "verdict": {"recommendation": "use AMP with bf16: 3.33x faster than fp32"},
    }
    fig = plot_speedup(result)
    path = tmp_path / "p.png"
    fig.savefig(path)
    assert path.read_bytes().startswith(PNG_MAGIC)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "3.33x" in texts and "1.00x" in texts
    assert "A100" in fig._suptitle.get_text()
