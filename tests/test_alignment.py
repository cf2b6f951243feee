"""AMP201: every GEMM-shaping size against the tensor-core multiples, ranked by FLOP share."""
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "check"))
import check_workloads as cw  # noqa: E402

from troubleshooter.engine.alignment import check_alignment, padded_size  # noqa: E402
from troubleshooter.workload import Workload  # noqa: E402


def _by_module(result):
    return {f.location.module: f for f in result.findings}


def test_padded_size():
    assert padded_size(127, 8) == 128 and padded_size(128, 8) == 128 and padded_size(50257, 64) == 50304


def test_misaligned_linear_layers_are_warnings_with_padded_sizes():
    r = check_alignment(cw.mlp((127, 253, 10)))
    found = _by_module(r)
    assert set(found) == {"0", "2"}
    assert all(f.rule == "AMP201" and f.severity.value == "warning" and f.precision is None
               for f in found.values())
    dims = {(d["dimension"], d["value"]): d["padded"] for d in found["0"].data["dimensions"]}
    assert dims == {("in_features", 127): 128, ("out_features", 253): 256}
    assert "CPU" in found["0"].message  # says where it was measured
    rows = {(row["module"], row["dimension"]): row for row in r.to_list()}
    assert rows[("0", "in_features")]["aligned"] is False and rows[("0", "in_features")]["multiple"] == 8
    assert abs(rows[("0", "in_features")]["flops_share"] - 127 * 253 / (127 * 253 + 253 * 10)) < 1e-3
    assert rows[("<batch>", "batch_size")]["aligned"] is True


def test_clean_model_only_informs_about_its_class_count():
    r = check_alignment(cw.mlp((128, 256, 10)))
    assert [(f.location.module, f.severity.value) for f in r.findings] == [("2", "info")]
    assert "set by the task" in r.findings[0].message


def test_misaligned_batch_size_affects_every_linear():
    r = check_alignment(cw.mlp((128, 256, 16), batch_size=30))
    (f,) = r.findings
    assert f.location.module is None and f.severity.value == "warning"
    assert f.data["dimensions"][0]["dimension"] == "batch_size" and f.data["flops_share"] == 1.0


def test_vocabulary_wants_multiples_of_64_and_attention_sizes_are_checked():
    r = check_alignment(cw.tiny_lm(vocab=100, d=32, heads=4))
    found = _by_module(r)
    assert found["head"].severity.value == "warning"
    assert found["head"].data["dimensions"][0]["multiple"] == 64
    assert "emb" not in found  # a lookup: its 100 rows meet no GEMM (the untied head reports the vocab)
    rows = {(row["module"], row["dimension"]): row for row in r.to_list()}
    assert rows[("attn", "head_dim")]["value"] == 8 and rows[("attn", "embed_dim")]["aligned"]
    assert ("attn.out_proj", "in_features") not in rows  # reported through embed_dim
    bad_heads = check_alignment(cw.tiny_lm(vocab=128, d=36, heads=3))
    attn = _by_module(bad_heads)["attn"]
    assert {d["dimension"] for d in attn.data["dimensions"]} == {"embed_dim", "head_dim"}


def test_rgb_input_channels_are_informational():
    def build():
        return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(16 * 8 * 8, 10))

    def batch(n, device, gen):
        return (torch.randn(n, 3, 8, 8, generator=gen).to(device),), torch.randint(0, 10, (n,), generator=gen).to(device)

    wl = Workload("cnn", build, batch, nn.functional.cross_entropy, lambda p: torch.optim.SGD(p, lr=0.1), 8)
    r = check_alignment(wl)
    assert {f.location.module: f.severity.value for f in r.findings} == {"0": "info", "3": "info"}


def test_many_identical_misalignments_are_grouped():
    r = check_alignment(cw.mlp((36,) * 16 + (40,)))
    assert len(r.findings) < 15
    grouped = [f for f in r.findings if "modules" in f.data]
    assert grouped and len(grouped[0].data["modules"]) > 5


class _HostSync(nn.Module):
    """A forward that reads a value on the host cannot run on the meta device."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(20, 30)

    def forward(self, x):
        return self.lin(x) * float(x.abs().max() > -1)


def test_models_that_cannot_run_on_meta_fall_back_to_a_cpu_forward():
    def batch(n, device, gen):
        return (torch.randn(n, 20, generator=gen).to(device),), torch.randint(0, 30, (n,), generator=gen).to(device)

    wl = Workload("sync", _HostSync, batch, nn.functional.cross_entropy, lambda p: torch.optim.SGD(p, lr=0.1), 8)
    r = check_alignment(wl)
    assert r.summary["flops_method"] == "cpu"
    f = _by_module(r)["lin"]
    assert f.data["flops_share"] == 1.0 and f.severity.value == "warning"


class _TinyBert(nn.Module):
    """BERT-like: word, position and a 2-row token-type table; an MLM head tied to the word
    embedding, either functionally (F.linear with the table) or as an nn.Linear sharing it."""

    def __init__(self, vocab=1000, d=32, functional_head=True):
        super().__init__()
        self.word = nn.Embedding(vocab, d)
        self.position = nn.Embedding(16, d)
        self.token_type = nn.Embedding(2, d)
        self.body = nn.Linear(d, d)
        self.functional_head = functional_head
        if not functional_head:
            self.head = nn.Linear(d, vocab, bias=False)
            self.head.weight = self.word.weight

    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device)
        h = self.word(ids) + self.position(pos) + self.token_type(torch.zeros_like(ids))
        h = torch.relu(self.body(h))
        return nn.functional.linear(h, self.word.weight) if self.functional_head else self.head(h)


def _bert(functional_head):
    def make_batch(n, device, gen):
        ids = torch.randint(0, 1000, (n, 16), generator=gen).to(device)
        return (ids,), ids

    return Workload("tiny-bert", lambda: _TinyBert(functional_head=functional_head), make_batch,
                    lambda out, t: nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), t.reshape(-1)),
                    lambda p: torch.optim.SGD(p, lr=0.1), 8, seq_len=16)


def test_a_two_row_token_type_table_is_not_told_to_pad_only_a_table_in_a_gemm_is():
    r = check_alignment(_bert(functional_head=True))
    rows = {(row["module"], row["dimension"]): row for row in r.to_list()}
    assert ("token_type", "num_embeddings (vocab)") not in rows and ("position", "num_embeddings (vocab)") not in rows
    word = rows[("word", "num_embeddings (vocab)")]  # F.linear(h, word.weight): the vocab GEMM
    assert word["value"] == 1000 and word["padded"] == 1024
    assert not any("token_type" == f.location.module for f in r.findings)
    tied = check_alignment(_bert(functional_head=False))
    found = _by_module(tied)
    assert "word" not in found and "token_type" not in found  # the tied nn.Linear reports the vocab
    assert found["head"].data["dimensions"][0]["dimension"] == "out_features (vocab)"


def test_a_batch_size_whose_token_rows_are_aligned_is_not_a_finding():
    """Batch 4 x 48 tokens (Llama's real case) gives 192-row GEMMs: padding the batch changes
    nothing, so no finding; batch 3 x 15 tokens (45 rows) still gets one."""
    aligned = check_alignment(cw.tiny_lm(vocab=128, d=32, heads=4, seq=16, batch_size=3))
    rows = {(row["module"], row["dimension"]): row for row in aligned.to_list()}
    assert rows[("<batch>", "batch_size")]["aligned"] is False
    assert "already a multiple of 8" in rows[("<batch>", "batch_size")]["note"]
    assert not [f for f in aligned.findings if f.location.module is None]
    odd = check_alignment(cw.tiny_lm(vocab=128, d=32, heads=4, seq=15, batch_size=3))
    (f,) = [f for f in odd.findings if f.location.module is None]
    assert f.data["dimensions"][0]["dimension"] == "batch_size" and f.data["flops_share"] > 0.5
