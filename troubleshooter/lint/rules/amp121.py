"""AMP121 misaligned-layer-dims."""
import ast

from ...hardware_sizes import HALF_MULTIPLE, VOCAB_MULTIPLE, padded_size
from ..analysis import tail
from .base import Hit, Rule

VOCAB_MIN = 10_000  # the smallest output a Linear is taken to be a vocabulary projection at (BERT: 30522)

_LAYERS = {"Linear": ("in_features", "out_features"), "Conv1d": ("in_channels", "out_channels"),
           "Conv2d": ("in_channels", "out_channels"), "Conv3d": ("in_channels", "out_channels"),
           "ConvTranspose1d": ("in_channels", "out_channels"), "ConvTranspose2d": ("in_channels", "out_channels"),
           "ConvTranspose3d": ("in_channels", "out_channels"), "Embedding": ("num_embeddings", "embedding_dim")}


class MisalignedLayerDims(Rule):
    id = "AMP121"
    name = "misaligned-layer-dims"
    severity = "info"
    summary = ("Literal `nn.Linear`/`nn.Conv*`/`nn.Embedding` sizes that are not multiples of 8 (vocabulary sizes: "
               "of 64), with the padded size.")
    why = ("Tensor cores run fp16/bf16 matmuls and convolutions at full speed only when the dimensions are "
           "multiples of 8 (16-byte alignment); otherwise cuBLAS/cuDNN fall back to slower kernels or pad "
           "internally. A vocabulary padded to a multiple of 64 makes the output projection markedly faster "
           "(nanoGPT: 50257 -> 50304; measured on an H200, GPT-2 small's bf16 training step ran 1.53x faster with "
           "50304, its head's GEMMs leaving sm75-era `align1` kernels: BENCHMARKS.md).")
    example_bad = """
self.lm_head = nn.Linear(768, 50257)
"""
    example_good = """
self.lm_head = nn.Linear(768, 50304)  # vocab padded to a multiple of 64
"""
    fix = "Pad the dimension to the suggested multiple (unused vocabulary rows/extra channels cost little)."

    known_problems = 'Sizes computed at run time are not seen; literal sizes that the GPU pads anyway cost little. A `Linear` with a side under 8 (a gate or scalar head, `nn.Linear(12, 1)`) is a matrix-vector product and is not reported. A `Linear` output is judged as a vocabulary (multiple of 64) only from 10,000 up; a smaller one is a layer width (multiple of 8).'
    references = ('https://docs.nvidia.com/deeplearning/performance/mixed-precision-training/index.html',)

    def check(self, m):
        for n in m.calls_named(*_LAYERS):
            t = tail(n.func)
            q = m.names.qual(n.func) or ""
            if not q.startswith(("torch.nn.", "nn.")):
                continue
            names = _LAYERS[t]
            values = {}
            for i, a in enumerate(n.args[:2]):
                values[names[i]] = a
            for k in n.keywords:
                if k.arg in names:
                    values[k.arg] = k.value
            if t == "Linear" and any(isinstance(v, ast.Constant) and type(v.value) is int and v.value < HALF_MULTIPLE
                                     for v in values.values()):
                continue  # Linear(12, 1): a matrix-vector product (a gate, a scalar head) gains nothing from padding
            for i, pname in enumerate(names):
                v = values.get(pname)
                if not (isinstance(v, ast.Constant) and isinstance(v.value, int)) or isinstance(v.value, bool):
                    continue
                size = v.value
                # a Linear's output is taken for a vocabulary projection only at a vocabulary's size:
                # Linear(768, 3000) is a wide layer (3000 is a multiple of 8), not a vocabulary of 3000
                is_vocab = (t == "Embedding" and i == 0) or (t == "Linear" and i == 1 and size >= VOCAB_MIN)
                k = VOCAB_MULTIPLE if is_vocab else HALF_MULTIPLE
                if size < HALF_MULTIPLE or size % k == 0:
                    continue
                what = "vocabulary size" if is_vocab else pname
                padded = padded_size(size, k)
                yield Hit.at(v, f"`{t}` {what} {size} is not a multiple of {k}: pad to {padded} for tensor cores",
                             f"use {padded} instead of {size}", padded=padded)
