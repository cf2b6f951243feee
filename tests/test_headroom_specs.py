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
