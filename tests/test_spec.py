"""Model specs: YAML stacks, presets and their validation (every problem in one SpecError)."""
import pickle
from pathlib import Path

import pytest
import torch

from troubleshooter.errors import SpecError
from troubleshooter.spec import (EXAMPLE_YAML, SpecSource, list_presets, load_workload,
                                 preset_descriptions)

SPECS = Path(__file__).parent / "fixtures" / "specs"
CPU = torch.device("cpu")


def problems_of(source, **kw):
    with pytest.raises(SpecError) as info:
        load_workload(source, **kw)
    return info.value.problems, str(info.value)


def one_step(wl):
    torch.manual_seed(0)
    model = wl.build_model()
    opt = wl.make_optimizer(model.parameters())
    loss = wl.loss(model, wl.batch(CPU, seed=1))
    loss.backward()
    opt.step()
    return model, loss.item()


def test_clean_yaml_builds_a_working_workload():
    wl = load_workload(SpecSource.yaml_file(SPECS / "tiny_mlp.yaml"))
    assert wl.name == "tiny-mlp" and wl.batch_size == 32 and wl.seq_len is None
    model, loss = one_step(wl)
    assert [n for n, _ in model.named_modules()] == ["", "0", "1", "2"]
    assert abs(loss - torch.log(torch.tensor(16.0)).item()) < 1.0
    assert wl.summary["params"] == 128 * 256 + 256 + 256 * 16 + 16
    assert wl.summary["output_shape"] == [32, 16]
    # forward+backward of the two Linear layers: 3 x 2 x batch x MACs (the first layer's input grad is skipped)
    assert wl.flops_per_step == pytest.approx(2 * 32 * (128 * 256 + 256 * 16) * 3 - 2 * 32 * 128 * 256, rel=0.01)
    assert isinstance(wl.make_optimizer(model.parameters()), torch.optim.AdamW)


def test_batches_are_seeded_and_scaled():
    wl = load_workload(SpecSource.yaml_file(SPECS / "conv_regression.yaml"))
    (x1,), y1 = wl.batch(CPU, seed=3)
    (x2,), _ = wl.batch(CPU, seed=3)
    (x3,), _ = wl.batch(CPU, seed=4)
    assert torch.equal(x1, x2) and not torch.equal(x1, x3)
    assert 5 < x1.std().item() < 15  # scale: 10.0
    assert y1.shape == (4, 4) and y1.dtype == torch.float32
    assert wl.loss_weight == 0.001
    opt = wl.make_optimizer(wl.build_model().parameters())
    assert isinstance(opt, torch.optim.SGD) and opt.defaults["momentum"] == 0.9


def test_token_input_and_inferred_classes():
    wl = load_workload(SpecSource.yaml_file(SPECS / "tokens.yaml"))
    (x,), y = wl.batch(CPU)
    assert x.dtype == torch.int64 and int(x.max()) < 64 and y.shape == (4, 8)
    assert wl.seq_len == 8 and wl.samples_unit == "tokens/s"
    one_step(wl)


def test_workload_pickles_for_worker_processes():
    wl = load_workload(SpecSource.yaml_file(SPECS / "tiny_mlp.yaml"))
    clone = pickle.loads(pickle.dumps(wl))
    torch.manual_seed(0)
    a = wl.build_model()
    torch.manual_seed(0)
    b = clone.build_model()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert pickle.loads(pickle.dumps(SpecSource.preset("gpt"))) == SpecSource.preset("gpt")


def test_every_problem_reported_with_its_line():
    problems, text = problems_of(SpecSource.yaml_file(SPECS / "bad_many.yaml"))
    joined = "\n".join(problems)
    assert "line 4: model.layers[0]: unknown layer 'Linearr' (did you mean 'Linear'?)" in joined
    assert "did you mean 'ReLU'?" in joined
    assert "unknown argument 'out_feature' (did you mean 'out_features'?)" in joined
    assert "'LSTM' cannot be used in a layers stack" in joined
    assert "weights file not found" in joined and "line 8" in joined
    assert "line 9: input.colour: unknown key 'colour'" in joined
    assert "line 10: loss:" in joined
    assert len(problems) == 7, problems
    # listed in the order of the file's lines, as a reader fixes them
    assert [int(p.split(":")[0].removeprefix("line ")) for p in problems] == [4, 5, 6, 7, 8, 9, 10]


def test_shape_mismatch_found_on_meta_names_the_layer():
    problems, _ = problems_of(SpecSource.yaml_file(SPECS / "bad_shape.yaml"))
    assert len(problems) == 1
    assert problems[0].startswith("line 5: model.layers[2]: module '2' (Linear)")
    assert "[64, 253]" in problems[0]


def test_target_and_loss_checked_against_the_output():
    problems, _ = problems_of(SpecSource.yaml_file(SPECS / "bad_target.yaml"))
    joined = "\n".join(problems)
    assert "optimizer must be one of adamw, sgd, adam" in joined
    assert "loss mse does not fit target kind 'classes'" in joined
    assert "num_classes is 12 but the model's output [8, 10]" in joined


def test_malformed_yaml_names_the_line():
    _, text = problems_of(SpecSource.yaml_file(SPECS / "bad_yaml.yaml"))
    assert "not valid YAML at line 4" in text


@pytest.mark.parametrize("text, needle", [
    ("model: {layers: [ReLU]}", "needs `input:`"),
    ("model: {layers: [{Linear: [4, -2]}]}\ninput: {shape: [2, 4]}", "cannot be built"),
    ("model: {layers: [{Linear: [4, 2, true, cpu]}]}\ninput: {shape: [2, 4]}", "too many positional"),
    ("model: {layers: [{Linear: {in_features: 4, out_features: 2, device: cuda}}]}\ninput: {shape: [2, 4]}",
     "'device' is not allowed"),
    ("model: {layers: [{Embedding: [10, 4]}]}\ninput: {shape: [2, 3], dtype: int64, high: 50}",
     "only 10 rows"),
    ("model: {layers: [{Embedding: [10, 4]}]}\ninput: {shape: [2, 3]}", "takes int64"),
    ("model: {layers: [{Linear: [4, 2]}]}\ninput: {shape: [2, 4], dtype: int64}", "needs `high`"),
    ("model: {layers: [{Linear: [4, 2]}], preset: mlp}\ninput: {shape: [2, 4]}", "not both"),
    ("model: {preset: mlp}\ninput: {shape: [2, 4]}", "cannot be set beside a preset"),
    ("model: {layers: [{Linear: [4, 2]}]}\ninput: {shape: [2, 4]}\nloss_weight: 0", "positive"),
    ("- just\n- a list", "must be a YAML mapping"),
])
def test_bad_specs(text, needle):
    _, message = problems_of(SpecSource.yaml_text(text))
    assert needle in message


def test_weights_loaded_and_checked(tmp_path):
    base = tmp_path / "spec.yaml"
    text = (SPECS / "tiny_mlp.yaml").read_text() + "weights: w.pt\n"
    base.write_text(text)
    torch.manual_seed(5)
    ref = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 16))
    torch.save({k: v.half() for k, v in ref.state_dict().items()}, tmp_path / "w.pt")
    wl = load_workload(SpecSource.yaml_file(base))
    model = wl.build_model()
    assert model[0].weight.dtype == torch.float32
    assert torch.allclose(model[0].weight, ref[0].weight, atol=1e-3)
    # weights saved from a DDP-wrapped model fit too
    torch.save({"module." + k: v for k, v in ref.state_dict().items()}, tmp_path / "w.pt")
    assert torch.equal(load_workload(SpecSource.yaml_file(base)).build_model()[2].bias, ref[2].bias)
    # wrong shapes and keys
    torch.save({"0.weight": torch.zeros(3, 3), "9.bias": torch.zeros(2)}, tmp_path / "w.pt")
    problems, _ = problems_of(SpecSource.yaml_file(base))
    joined = "\n".join(problems)
    assert "0.weight has shape [3, 3], the model expects [256, 128]" in joined
    assert "lacks 3 key(s)" in joined and "9.bias" in joined
    # pickled code is refused by weights_only loading
    torch.save({"0.weight": torch.nn.Linear(2, 2)}, tmp_path / "w.pt")
    problems, _ = problems_of(SpecSource.yaml_file(base))
    assert "weights_only=True" in problems[0]


def test_oversized_spec_refused_before_allocating(monkeypatch):
    huge = "model: {layers: [{Linear: [100000, 100000]}]}\ninput: {shape: [2, 100000]}"
    _, text = problems_of(SpecSource.yaml_text(huge), max_params=1e9)
    assert "10,000,100,000 parameters, over the limit of 1,000,000,000" in text
    monkeypatch.setenv("TROUBLESHOOTER_MAX_MEMORY_GB", "0.001")
    _, text = problems_of(SpecSource.preset("mlp"))
    assert "over the limit of 0.001 GiB" in text and "TROUBLESHOOTER_MAX_MEMORY_GB" in text


def test_shorthands_and_yaml_exponent_strings():
    wl = load_workload(SpecSource.yaml_text(
        "model: {layers: [{Linear: [4, 3]}, {Dropout: 0.1}]}\ninput: {shape: [2, 4], scale: 1e4}\n"
        "target: regression\nloss_weight: 1e-6\noptimizer: {name: AdamW, lr: 3e-4}"))
    assert wl.loss_weight == 1e-6 and wl.summary["input"]["scale"] == 1e4
    assert wl.summary["target"]["kind"] == "regression" and wl.summary["loss"] == "mse"
    assert wl.summary["optimizer"]["lr"] == 3e-4


def test_limits_from_environment(monkeypatch):
    from troubleshooter.errors import UserError
    from troubleshooter.spec import Limits

    monkeypatch.setenv("TROUBLESHOOTER_MAX_PARAMS", "5e6")
    assert Limits.resolve().max_params == 5e6 and Limits.resolve(max_params=7).max_params == 7
    monkeypatch.setenv("TROUBLESHOOTER_MAX_PARAMS", "lots")
    with pytest.raises(UserError, match="TROUBLESHOOTER_MAX_PARAMS"):
        Limits.resolve()


def test_example_yaml_is_a_valid_spec():
    wl = load_workload(SpecSource.yaml_text(EXAMPLE_YAML))
    assert wl.summary["target"] == {"kind": "classes", "num_classes": 10}


def test_yaml_preset_with_training_settings():
    wl = load_workload(SpecSource.yaml_file(SPECS / "preset_gpt.yaml"))
    assert wl.name == "small-gpt" and wl.seq_len == 16 and wl.batch_size == 2
    assert wl.loss_weight == 0.5
    assert type(wl.make_optimizer(wl.build_model().parameters())) is torch.optim.Adam


def test_missing_spec_file():
    _, text = problems_of(SpecSource.yaml_file("/nonexistent/spec.yaml"))
    assert "spec file not found" in text


def test_list_presets():
    presets = list_presets()
    assert {"mlp", "cnn", "gpt", "bert", "vit"} <= set(presets)
    assert presets["gpt"]["d_model"] > 0 and "seq_len" in presets["gpt"]
    assert all(preset_descriptions()[name] for name in presets)


# ---------------------------------------------------------------- hostile YAML (issue 11.6)
def _bomb(levels: int) -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines + [f"model: {{layers: *a{levels - 1}}}", "input: {shape: [1, 4]}", ""])


def test_alias_bomb_is_refused_in_milliseconds_with_a_short_message():
    import time

    text = _bomb(9)  # 9**9 = 387 million strings once expanded; about 400 bytes of YAML
    assert len(text) < 500
    started = time.perf_counter()
    with pytest.raises(SpecError) as info:
        load_workload(SpecSource.yaml_text(text))
    assert time.perf_counter() - started < 5
    assert "alias" in str(info.value) and len(str(info.value)) < 500


def test_self_referencing_alias_is_refused():
    with pytest.raises(SpecError, match="refers to itself"):
        load_workload(SpecSource.yaml_text("a: &a [*a]\nmodel: {layers: *a}\ninput: {shape: [1, 4]}\n"))


def test_a_few_aliases_still_work():
    text = ("model:\n  layers:\n    - Linear: [4, &h 16]\n    - ReLU\n    - Linear: [*h, 3]\n"
            "input: {shape: [2, 4]}\n")
    wl = load_workload(SpecSource.yaml_text(text))
    assert wl.summary["params"] == 4 * 16 + 16 + 16 * 3 + 3


def test_error_messages_are_capped():
    layers = "\n".join(f"    - Lineer{i}" for i in range(300))
    with pytest.raises(SpecError) as info:
        load_workload(SpecSource.yaml_text(f"model:\n  layers:\n{layers}\ninput: {{shape: [2, 4]}}\n"))
    assert len(info.value.problems) <= 41 and "more problems" in info.value.problems[-1]
    huge = "model:\n  layers:\n    - [" + ",".join(["1"] * 3000) + "]\ninput: {shape: [2, 4]}\n"
    with pytest.raises(SpecError) as info:
        load_workload(SpecSource.yaml_text(huge))
    assert len(str(info.value)) < 1000


def test_oversized_spec_file_is_refused(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("# " + "x" * 400_000 + "\nmodel: {layers: [ReLU]}\n")
    with pytest.raises(SpecError, match="over the limit"):
        load_workload(SpecSource.yaml_file(path))


def test_memory_limit_defaults_to_this_hosts_memory(monkeypatch):
    """Issue 11.7: a fixed 48 GiB limit on a 23 GiB host let specs through that could not fit."""
    from troubleshooter.spec import estimate, limits

    monkeypatch.delenv(estimate.ENV_MAX_MEMORY_GB, raising=False)
    monkeypatch.setattr(limits, "host_memory_gb", lambda: 23.0)
    assert estimate.Limits.resolve().max_memory_gb == 23.0
    monkeypatch.setattr(limits, "host_memory_gb", lambda: 512.0)
    assert estimate.Limits.resolve().max_memory_gb == estimate.DEFAULT_MAX_MEMORY_GB
    monkeypatch.setattr(limits, "host_memory_gb", lambda: None)
    assert estimate.Limits.resolve().max_memory_gb == estimate.DEFAULT_MAX_MEMORY_GB
    monkeypatch.setenv(estimate.ENV_MAX_MEMORY_GB, "100")
    assert estimate.Limits.resolve().max_memory_gb == 100.0


def test_boolean_layer_sizes_are_refused_but_boolean_flags_are_fine():
    """Issue 11.7: `Linear: [4, true]` built a Linear(4, 1); bias: false is a real flag."""
    with pytest.raises(SpecError, match="out_features of Linear is a size"):
        load_workload(SpecSource.yaml_text("model:\n  layers:\n    - Linear: [4, true]\ninput: {shape: [2, 4]}\n"))
    with pytest.raises(SpecError, match="kernel_size of Conv2d is a size"):
        load_workload(SpecSource.yaml_text("model:\n  layers:\n    - Conv2d: [3, 4, [true, 3]]\n"
                                           "input: {shape: [2, 3, 8, 8]}\n"))
    wl = load_workload(SpecSource.yaml_text("model:\n  layers:\n    - Linear: {in_features: 4, out_features: 3, "
                                            "bias: false}\ninput: {shape: [2, 4]}\n"))
    assert wl.summary["params"] == 12


# ---------------------------------------------------------------- the one bounded YAML loader (issue 22)
def test_every_yaml_limit_is_applied_before_values_are_built(monkeypatch):
    from troubleshooter import safeyaml
    from troubleshooter.errors import UserError

    with pytest.raises(UserError, match="nests more than 64"):
        safeyaml.load("a: " + "[" * 5000 + "]" * 5000)
    # aliases stacking shallow lists deep: 70 levels once expanded, each anchor 1 deep on the page
    chain = "l0: &l0 [x]\n" + "".join(f"l{i}: &l{i} [*l{i - 1}]\n" for i in range(1, 70))
    with pytest.raises(UserError, match="once its aliases are expanded"):
        safeyaml.load(chain)
    monkeypatch.setattr(safeyaml, "_BoundedLoader", None)  # a parse would fail loudly: it must not start
    with pytest.raises(UserError, match="refused before reading it"):
        safeyaml.load("# " + "x" * 4_000_000)
    with pytest.raises(UserError, match="refused before reading it"):
        safeyaml.load(b"x" * (safeyaml.MAX_BYTES + 1))


def test_the_apps_weights_check_reads_the_spec_through_the_bounded_loader(tmp_path, monkeypatch):
    """The app looked at `weights:` with yaml.safe_load before the spec's own guard ran, so a bomb
    under weights: was expanded and quoted whole (a 7 MB message from 368 bytes)."""
    from troubleshooter.ui import specinput

    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path))
    text = _bomb(9).replace("model: {layers: *a8}", "weights: *a8\nmodel: {layers: [ReLU]}")
    with pytest.raises(SpecError) as info:
        specinput.yaml_source(text)
    assert "alias" in str(info.value) and len(str(info.value)) < 500


def test_every_user_error_is_bounded():
    from troubleshooter.errors import UserError

    err = UserError("x" * 100_000, ["y" * 100_000] * 100)
    assert len(str(err)) < 2500 + 41 * 500 and len(err.problems) == 41 and "more problems" in err.problems[-1]
