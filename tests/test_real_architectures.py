"""`check --python` on real architectures: Hugging Face BERT, GPT-2, T5 and Llama built from their
configs (no weights downloaded), clean and with a planted fp16 fault. Real models bring what our
own fixtures do not: additive attention masks, ModelOutput objects, a model computing its own
loss, tied embeddings, custom Conv1D projections and tanh-GELU."""
import json
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="transformers is in requirements-dev.txt; install it to run these")

from troubleshooter.cli import main  # noqa: E402
from troubleshooter.engine.check import CHECKS  # noqa: E402

MODELS = Path(__file__).parent / "fixtures" / "real_models"


def _check(capsys, name, *argv):
    code = main(["check", "--python", str(MODELS / name), "--allow-exec", "--device", "cpu", "--format", "json",
                 "--steps", "6", "--budget", "600", *argv])
    return code, json.loads(capsys.readouterr().out)


def _serious(result):
    return {(f["rule"], f["module"], f["precision"]) for f in result["findings"]
            if f["severity"] in ("warning", "error")}


@pytest.mark.parametrize("name", ["hf_bert_padded.py", "hf_gpt2.py", "hf_t5.py", "hf_llama.py"])
def test_a_clean_real_model_gets_no_warning_and_every_check_runs(capsys, name):
    code, r = _check(capsys, name)
    assert r["errors"] == {}, r["errors"]
    assert all(r[c] is not None for c in CHECKS)
    assert _serious(r) == set(), r["findings"]
    assert code == 0
    assert r["skiprate"]["summary"]["steps"] == 6 and r["skiprate"]["summary"]["skipped"] == 0
    for p in ("fp32", "fp16", "bf16"):
        assert r["nan"]["precisions"][p]["loss_finite"] is True
    if name == "hf_llama.py":  # batch 4 x 48 tokens: every GEMM has 192 rows
        assert not [f for f in r["findings"] if f["rule"] == "AMP201" and f["module"] is None]


def test_a_planted_fp16_overflow_in_gpt2_is_found_in_its_block_and_cured_by_bf16(capsys):
    code, r = _check(capsys, "hf_gpt2_overflow.py")
    assert code == 1
    serious = _serious(r)
    assert ("AMP204", None, "fp16") in serious  # every fp16 step skipped
    assert r["skiprate"]["recommendation"]["action"] == "bf16"
    located = {m for rule, m, p in serious if rule in ("AMP202", "AMP206") and p == "fp16"}
    assert located and all(m.startswith("transformer.h.1.mlp") for m in located), serious
    assert not {s for s in serious if s[2] in ("fp32", "bf16")}  # float16 only
    assert r["nan"]["precisions"]["bf16"]["loss_finite"] is True
