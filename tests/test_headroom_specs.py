"""Headroom on YAML specs that once gave wrong answers (adversarial spec regressions)."""
from troubleshooter.engine import headroom as hr
from troubleshooter.spec import SpecSource, load_workload


def _wl(text):
    return load_workload(SpecSource.yaml_text(text))


def _rules(result):
    return {(f.rule, f.location.module, f.precision, f.severity.value) for f in result.findings}


def test_large_input_tamed_by_a_leading_layernorm_blames_no_container():
    # The model itself receives |x| = 1e5, but its first layer normalises it in fp32: nothing
    # overflows float16, and the root Sequential ('') must not be blamed for its input.
    wl = _wl("""
model:
  layers:
    - LayerNorm: [16]
    - Linear: [16, 16]
    - ReLU
    - Linear: [16, 8]
input: {shape: [8, 16], scale: 1.0e+5}
target: {kind: classes}
""")
    r = hr.check_headroom(wl)
    assert r.first_overflow is None
    assert not [f for f in r.findings if f.rule == "AMP202" and f.severity.value != "info"]


def test_large_input_into_a_linear_blames_that_linear_not_the_root():
    wl = _wl("""
model:
  layers:
    - ReLU
    - Linear: [16, 16]
    - Linear: [16, 8]
input: {shape: [8, 16], scale: 1.0e+5}
target: {kind: classes}
""")
    r = hr.check_headroom(wl)
    assert r.first_overflow == "1"
    assert ("AMP202", "1", "fp16", "error") in _rules(r)


def test_underflow_in_a_deep_conv_stack_is_one_finding_naming_every_module():
    # 7 Conv2d + 7 BatchNorm2d + a Linear with loss x 1e-10: one AMP203 for the model (not one per
    # module), located at a module that loses gradients, listing each one in data.modules.
    layers = "    - Conv2d: [3, 8, 3, 1, 1]\n    - BatchNorm2d: [8]\n    - ReLU\n"
    layers += "    - Conv2d: [8, 8, 3, 1, 1]\n    - BatchNorm2d: [8]\n    - ReLU\n" * 6
    wl = _wl("model:\n  layers:\n" + layers + "    - Flatten\n    - Linear: [128, 8]\n"
             "input: {shape: [8, 3, 4, 4]}\ntarget: {kind: classes}\nloss_weight: 1.0e-10\n")
    r = hr.check_headroom(wl)
    found = [f for f in r.findings if f.rule == "AMP203"]
    assert len(found) == 1 and found[0].severity.value == "warning" and found[0].precision == "fp16"
    listed = {m["module"] for m in found[0].data["modules"]}
    assert found[0].location.module in listed and {"0", "3", "22"} <= listed


def test_the_same_stack_with_a_loss_scale_the_default_scaler_handles_gets_no_warning():
    layers = "    - Conv2d: [3, 8, 3, 1, 1]\n    - BatchNorm2d: [8]\n    - ReLU\n"
    layers += "    - Conv2d: [8, 8, 3, 1, 1]\n    - BatchNorm2d: [8]\n    - ReLU\n" * 6
    wl = _wl("model:\n  layers:\n" + layers + "    - Flatten\n    - Linear: [128, 8]\n"
             "input: {shape: [8, 3, 4, 4]}\ntarget: {kind: classes}\nloss_weight: 1.0e-6\n")
    r = hr.check_headroom(wl)
    assert [(f.rule, f.severity.value) for f in r.findings if f.rule == "AMP203"] == [("AMP203", "info")]
