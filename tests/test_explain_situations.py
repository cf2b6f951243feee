"""`explain` gives the fix for the situation the pasted text shows (issue 26): LoRA, a library bug,
a resumed run, inference, the GPU named, the framework. One real message per situation
(troubleshooter/data/explain_situations.yaml, each with its source)."""
from __future__ import annotations

from importlib import resources

import pytest
import yaml

from troubleshooter.explain import explain_log
from troubleshooter.explain_context import find_gpu_in_text, read_context

SITUATIONS = yaml.safe_load(resources.files("troubleshooter.data").joinpath("explain_situations.yaml")
                            .read_text(encoding="utf-8"))["situations"]


@pytest.mark.parametrize("case", SITUATIONS, ids=[s["name"] for s in SITUATIONS])
def test_the_fix_fits_the_situation(case):
    assert case["source"]
    report = explain_log(case["text"])
    by_id = {m.id: m for m in report.matches}
    assert case["expect"] in by_id, [m.id for m in report.matches]
    m = by_id[case["expect"]]
    for words in case.get("fix_has", []):
        assert words in m.fix, (words, m.fix)
    for words in case.get("fix_lacks", []):
        assert words not in m.fix, (words, m.fix)
    if "rule" in case:
        assert m.rule == case["rule"]
    if "severity" in case:
        assert m.severity == case["severity"]
    if "library_bug" in case:
        assert m.library_bug and m.library_bug["library"] == case["library_bug"] and m.library_bug["url"]
        assert case.get("fixed_in_has", "") in (m.library_bug["fixed_in"] or "")
    else:
        assert m.library_bug is None
    for gone in case.get("absent", []):
        assert gone not in by_id


def test_context_is_read_not_guessed():
    """No clue, no context: a bare message keeps its general fix; a GPU named as a requirement or an
    example is not taken for the user's."""
    plain = explain_log("ValueError: Attempting to unscale FP16 gradients.").matches[0]
    assert plain.context == [] and "Remove model.half()" in plain.fix
    assert find_gpu_in_text("FP8 needs compute capability 8.9 or higher (e.g., RTX 4090). Your GPU's capability "
                            "is 8.6.").cc == (8, 6)
    assert find_gpu_in_text("only supported on compute capability >= 9.0 or 8.9, or ROCm MI300+") is None
    assert find_gpu_in_text("layer A2 feeds block L4") is None
    ctx = read_context('  File "/x/site-packages/vllm/engine/llm_engine.py", line 3\nValueError: x')
    assert "inference" in ctx.keys and "vllm" in ctx.libraries
    training = read_context("from vllm import LLM\nloss.backward()\noptimizer.step()")
    assert "inference" not in training.keys
