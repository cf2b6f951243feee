"""Each preset's name, one-line description and parameter defaults, in plain Python: the page's
preset list and `--help` read them here without importing torch (the server process never
imports it); each preset module builds its `Preset` from its entry."""
from __future__ import annotations

CATALOGUE: dict[str, tuple[str, dict]] = {
    "mlp": ("multilayer perceptron classifier: `depth` Linear layers of width `hidden`",
            {"in_features": 512, "hidden": 1024, "depth": 3, "num_classes": 10, "activation": "relu",
             "batch_size": 64}),
    "cnn": ("small ResNet-style image classifier: conv stem, residual stages, linear head",
            {"in_channels": 3, "image_size": 32, "width": 32, "stages": 3, "blocks_per_stage": 1, "num_classes": 10,
             "batch_size": 32}),
    "gpt": ("decoder-only transformer language model (GPT-2 style, causal attention, tied embeddings)",
            {"vocab_size": 8192, "d_model": 256, "n_layer": 4, "n_head": 4, "seq_len": 128, "batch_size": 8,
             "dropout": 0.0}),
    "bert": ("BERT-like text encoder (bidirectional attention) classifying each sequence",
             {"vocab_size": 8192, "d_model": 256, "n_layer": 4, "n_head": 4, "seq_len": 128, "num_classes": 2,
              "batch_size": 16, "dropout": 0.0}),
    "vit": ("Vision Transformer image classifier (patch embedding, class token, encoder blocks)",
            {"image_size": 32, "patch_size": 4, "in_channels": 3, "d_model": 192, "n_layer": 4, "n_head": 3,
             "num_classes": 10, "batch_size": 32, "dropout": 0.0}),
}


def entry(name: str) -> dict:
    """`Preset(**entry(name), build=...)`: the name, description and a copy of the defaults."""
    description, params = CATALOGUE[name]
    return {"name": name, "description": description, "params": dict(params)}
