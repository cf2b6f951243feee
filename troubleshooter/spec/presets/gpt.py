"""`gpt`: a decoder-only transformer language model (GPT-2 layout, tied embeddings)."""
from __future__ import annotations

import torch
from torch import nn

from .. import batches
from . import Preset
from .catalogue import entry
from .shapes import checks
from .transformer import Block, init_weights


class GPT(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        d = cfg["d_model"]
        self.tok_emb = nn.Embedding(cfg["vocab_size"], d)
        self.pos_emb = nn.Embedding(cfg["seq_len"], d)
        self.drop = nn.Dropout(cfg["dropout"])
        self.blocks = nn.Sequential(*[Block(d, cfg["n_head"], causal=True, dropout=cfg["dropout"])
                                      for _ in range(cfg["n_layer"])])
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, cfg["vocab_size"], bias=False)
        self.lm_head.weight = self.tok_emb.weight  # weight tying, as in GPT-2
        init_weights(self, cfg["n_layer"])

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        return self.lm_head(self.ln_f(self.blocks(x)))


def build(cfg: dict) -> nn.Module:
    return GPT(cfg)


def make_batch(cfg: dict, batch_size: int, device, gen):
    shape = (batch_size, cfg["seq_len"])
    idx = batches.int_input(shape, cfg["vocab_size"], device, gen)
    target = batches.int_input(shape, cfg["vocab_size"], device, gen)
    return (idx,), target


def flops_per_step(cfg: dict, n_params: int) -> float:
    """6·N per token (forward + backward matmuls) plus the attention scores, 12·L·d·T per token
    (the estimate of the PaLM paper / nanoGPT; N without position embeddings)."""
    n = n_params - cfg["seq_len"] * cfg["d_model"]
    tokens = cfg["batch_size"] * cfg["seq_len"]
    return float(tokens * (6 * n + 12 * cfg["n_layer"] * cfg["d_model"] * cfg["seq_len"]))


PRESET = Preset(
    **entry("gpt"),
    **checks("gpt"),
    build=build,
    make_batch=make_batch,
    loss_fn=batches.cross_entropy_last_dim,
    seq_len=lambda cfg: cfg["seq_len"],
    flops_per_step=flops_per_step,
)
