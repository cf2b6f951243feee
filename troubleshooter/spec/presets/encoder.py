"""`bert` and `vit`: transformer encoders (bidirectional attention) with a classification head."""
from __future__ import annotations

import torch
from torch import nn

from .. import batches
from . import Preset
from .catalogue import entry
from .shapes import checks
from .transformer import Block, init_weights


class TextEncoder(nn.Module):
    """BERT-like: token + position embeddings, encoder blocks, classify from the first token."""

    def __init__(self, cfg: dict):
        super().__init__()
        d = cfg["d_model"]
        self.tok_emb = nn.Embedding(cfg["vocab_size"], d)
        self.pos_emb = nn.Embedding(cfg["seq_len"], d)
        self.blocks = nn.Sequential(*[Block(d, cfg["n_head"], causal=False, dropout=cfg["dropout"])
                                      for _ in range(cfg["n_layer"])])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, cfg["num_classes"])
        init_weights(self, cfg["n_layer"])

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.blocks(self.tok_emb(idx) + self.pos_emb(pos))
        return self.head(self.ln_f(x)[:, 0])


class VisionTransformer(nn.Module):
    """ViT: patches by a strided conv, a class token, encoder blocks, classify from the class token."""

    def __init__(self, cfg: dict):
        super().__init__()
        d = cfg["d_model"]
        n_patches = (cfg["image_size"] // cfg["patch_size"]) ** 2
        self.patch_embed = nn.Conv2d(cfg["in_channels"], d, cfg["patch_size"], stride=cfg["patch_size"])
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d))
        self.pos_emb = nn.Parameter(torch.randn(1, n_patches + 1, d) * 0.02)
        self.blocks = nn.Sequential(*[Block(d, cfg["n_head"], causal=False, dropout=cfg["dropout"])
                                      for _ in range(cfg["n_layer"])])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, cfg["num_classes"])
        init_weights(self, cfg["n_layer"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_emb
        return self.head(self.ln_f(self.blocks(x))[:, 0])


def build_bert(cfg: dict) -> nn.Module:
    return TextEncoder(cfg)


def build_vit(cfg: dict) -> nn.Module:
    return VisionTransformer(cfg)


def bert_batch(cfg: dict, batch_size: int, device, gen):
    idx = batches.int_input((batch_size, cfg["seq_len"]), cfg["vocab_size"], device, gen)
    return (idx,), batches.int_input((batch_size,), cfg["num_classes"], device, gen)


def vit_batch(cfg: dict, batch_size: int, device, gen):
    shape = (batch_size, cfg["in_channels"], cfg["image_size"], cfg["image_size"])
    x = batches.float_input(shape, device, gen)
    return (x,), batches.int_input((batch_size,), cfg["num_classes"], device, gen)


BERT = Preset(
    **entry("bert"),
    **checks("bert"),
    build=build_bert,
    make_batch=bert_batch,
    loss_fn=batches.cross_entropy_last_dim,
    seq_len=lambda cfg: cfg["seq_len"],
)

VIT = Preset(
    **entry("vit"),
    **checks("vit"),
    build=build_vit,
    make_batch=vit_batch,
    loss_fn=batches.cross_entropy_last_dim,
)
