"""Presets: defaults, typed overrides, meaningful module paths, FLOPs, a real training step."""
import pytest
import torch

from troubleshooter.errors import SpecError
from troubleshooter.spec import SpecSource, list_presets, load_workload

CPU = torch.device("cpu")
TINY = {
    "mlp": "mlp:in_features=16,hidden=32,depth=2,num_classes=4,batch_size=4",
    "cnn": "cnn:width=4,stages=2,image_size=8,batch_size=2",
    "gpt": "gpt:vocab_size=128,d_model=16,n_layer=1,n_head=2,seq_len=8,batch_size=2",
    "bert": "bert:vocab_size=128,d_model=16,n_layer=1,n_head=2,seq_len=8,batch_size=2",
    "vit": "vit:image_size=8,patch_size=4,d_model=16,n_layer=1,n_head=2,batch_size=2",
}


@pytest.mark.parametrize("name", sorted(TINY))
def test_preset_trains_one_step(name):
    wl = load_workload(SpecSource.preset(TINY[name]))
    torch.manual_seed(0)
    model = wl.build_model()
    assert all(p.dtype == torch.float32 for p in model.parameters())
    opt = wl.make_optimizer(model.parameters())
    loss = wl.loss(model, wl.batch(CPU))
    assert torch.isfinite(loss)
    loss.backward()
    opt.step()
    assert wl.summary["params"] == sum(p.numel() for p in model.parameters())
    assert wl.flops_per_step and wl.flops_per_step > 0


def test_all_presets_have_tiny_variants_here():
    from troubleshooter.spec.presets import PRESET_NAMES

    assert set(TINY) == set(list_presets()) == set(PRESET_NAMES)


def test_cli_helpers_import_without_torch():
    import subprocess
    import sys

    code = ("import sys, argparse; from troubleshooter.spec import add_spec_arguments, SpecSource, EXAMPLE_YAML; "
            "add_spec_arguments(argparse.ArgumentParser()); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


def test_gpt_module_paths_seq_len_and_flops():
    wl = load_workload(SpecSource.preset(TINY["gpt"]))
    names = dict(wl.build_model().named_modules())
    assert {"tok_emb", "blocks.0.attn.qkv", "blocks.0.mlp.fc", "lm_head"} <= set(names)
    assert wl.seq_len == 8 and wl.items_per_step == 16 and wl.samples_unit == "tokens/s"
    n = wl.summary["params"] - 8 * 16  # without position embeddings
    assert wl.flops_per_step == 2 * 8 * (6 * n + 12 * 1 * 16 * 8)
    # a fresh GPT starts near ln(vocab): the init keeps logits small
    torch.manual_seed(0)
    loss = wl.loss(wl.build_model(), wl.batch(CPU)).item()
    assert abs(loss - torch.log(torch.tensor(128.0)).item()) < 0.5


def test_defaults_are_used_and_overrides_typed():
    wl = load_workload(SpecSource.preset("gpt:n_layer=1,dropout=0.1"))
    cfg = wl.summary["config"]
    assert cfg["n_layer"] == 1 and cfg["dropout"] == 0.1 and cfg["d_model"] == list_presets()["gpt"]["d_model"]


@pytest.mark.parametrize("text, needle", [
    ("gpt:d_modl=8", "unknown parameter 'd_modl' (did you mean 'd_model'?)"),
    ("gpt:n_layer=two", "n_layer must be an integer, got 'two'"),
    ("gpt:dropout=lots", "dropout must be a number"),
    ("gpt:d_model=30,n_head=4", "not divisible by n_head"),
    ("gpt:n_layer=0", "n_layer must be positive"),
    ("mlp:activation=swish", "activation must be one of"),
    ("vit:image_size=10", "not divisible by patch_size"),
    ("gtp", "unknown preset 'gtp' (did you mean 'gpt'?)"),
    ("gpt:n_layer", "is not key=value"),
])
def test_bad_overrides(text, needle):
    with pytest.raises(SpecError) as info:
        load_workload(SpecSource.preset(text))
    assert needle in str(info.value)


def test_all_override_problems_together():
    with pytest.raises(SpecError) as info:
        load_workload(SpecSource.preset("gpt:d_modl=8,n_layer=x,seq_len=1.5"))
    assert len(info.value.problems) == 3


def test_default_presets_fit_the_default_limits():
    for name in list_presets():
        assert load_workload(SpecSource.preset(name)).summary["estimated_training_bytes"] < 2 * 1024 ** 3


@pytest.mark.parametrize("spec", [
    "mlp", "mlp:depth=1", "mlp:depth=4,hidden=7", "cnn", "cnn:stages=1", "cnn:stages=4,blocks_per_stage=2,width=8",
    "gpt", "gpt:n_layer=1,d_model=32,n_head=2", "bert:n_layer=2", "vit", "vit:n_layer=1,patch_size=8",
])
def test_a_presets_computed_size_is_what_building_gives(spec):
    """Each preset's `size(cfg)` (parameters, modules) is what a refusal before building rests on."""
    from troubleshooter.spec import estimate
    from troubleshooter.spec.presets import get_preset, parse_preset_string, resolve_params

    name, overrides = parse_preset_string(spec)
    preset = get_preset(name)
    cfg, problems = resolve_params(preset, overrides)
    assert not problems
    model = estimate.build_on_meta(lambda: preset.build(cfg))
    assert preset.size(cfg) == (estimate.count_params(model), len(list(model.modules())))


@pytest.mark.parametrize("spec, says", [
    ("gpt:n_layer=3000", "modules"), ("gpt:n_layer=1000000", "modules"),
    ("gpt:d_model=1000000000", "parameters"), ("cnn:blocks_per_stage=100000000", "modules"),
])
def test_a_monster_preset_is_refused_before_anything_is_built(spec, says, monkeypatch):
    """`d_model=1e9` used to crash on meta ("Storage size calculation overflowed") and
    `n_layer=1e6` to build for minutes at gigabytes: both are refused from their computed size."""
    from troubleshooter.spec import estimate, precheck

    def never(*args, **kwargs):
        raise AssertionError("built a model that its size alone refuses")

    monkeypatch.setattr(estimate, "build_on_meta", never)
    for check in (precheck, load_workload):
        with pytest.raises(SpecError, match=says):
            check(SpecSource.preset(spec))


def test_precheck_builds_nothing_and_passes_a_good_spec(monkeypatch):
    from troubleshooter.spec import estimate, precheck

    monkeypatch.setattr(estimate, "build_on_meta", lambda *a: (_ for _ in ()).throw(AssertionError("built")))
    precheck(SpecSource.preset(TINY["gpt"]))
    precheck(SpecSource.yaml_text("model:\n  layers:\n    - Linear: [4, 8]\ninput: {shape: [2, 4]}\n"))
    with pytest.raises(SpecError, match="unknown layer|Linearr"):
        precheck(SpecSource.yaml_text("model:\n  layers:\n    - Linearr: [4, 8]\ninput: {shape: [2, 4]}\n"))


def test_every_preset_is_checked_without_torch_by_the_functions_it_builds_with():
    """The server's check of a preset (spec/presets/shapes.py) and the built preset must agree:
    the same parameters, choices, checks and size formula, one set of functions for both."""
    from troubleshooter.spec.presets import get_preset, get_shape
    from troubleshooter.spec.presets.catalogue import CATALOGUE

    for name in CATALOGUE:
        built, checked = get_preset(name), get_shape(name)
        assert (checked.params, checked.choices, checked.size) == (built.params, built.choices, built.size), name
        assert checked.validate is built.validate or (name == "mlp" and not built.validate(built.params)), name
