"""What kind of layer a module is (attention, MLP, norm...), read from its class and name, so an
fp16-overflow fix names what to change in that layer: "scale the attention scores" means nothing
to an MLP whose `silu(gate) * up` overflowed."""
from __future__ import annotations

import re

_ATTENTION = ("attn", "attention", "selfatt", "multihead", "mha")
_MLP = ("mlp", "ffn", "feedforward", "swiglu", "geglu", "glu", "gated")
_PART = re.compile(r"[._\-]")


def kind_of(module: str | None, cls: str | None) -> str:
    """'attention', 'mlp', 'norm', 'conv', 'embedding' or 'other' (class first: it says what the
    code does; the name, `blocks.3.mlp`, when the class is generic)."""
    name = (cls or "").lower()
    last = _PART.split((module or "").lower())[-1] if module else ""
    for text in (name, last):
        if not text:
            continue
        if any(k in text for k in _ATTENTION):
            return "attention"
        if "norm" in text:
            return "norm"
        if any(k in text for k in _MLP) or text in ("ff", "fc_block"):
            return "mlp"
        if "conv" in text:
            return "conv"
        if "embed" in text:
            return "embedding"
    return "other"


_IN_RANGE = {
    "attention": "scale the scores by 1/sqrt(head_dim) before a bias or mask is added to them (or use "
                 "F.scaled_dot_product_attention), and fill masks with torch.finfo(scores.dtype).min rather than "
                 "a large constant",
    "mlp": "the product of its activations (silu(gate) * up, gelu(x) * gate) passes 65504: compute that product "
           "in float32 (.float()), normalise the block's input, or initialise its up/gate projections smaller",
    "norm": "compute its statistics in float32 (x.float().pow(2).mean(...), as Hugging Face's RMSNorm does) and "
            "cast back after normalising",
    "conv": "normalise its input (a norm layer before it), or initialise its weights smaller",
    "embedding": "initialise it smaller or normalise its output before the next layer",
    "other": "normalise its input (a norm layer before it), scale down large constants, or initialise it smaller",
}


def overflow_fix(module: str | None, cls: str | None) -> str:
    """The fix for a float16 overflow made by this module (AMP202), in terms of its kind."""
    name = module or "<root>"
    return (f"Train in bf16 where the GPU supports it (float32's range); otherwise keep '{name}' in float32 (run it "
            "under torch.autocast(device_type, enabled=False) with .float() inputs), or bring its values into "
            f"range: {_IN_RANGE[kind_of(module, cls)]}.")
