"""The tensor-core size facts the linter needs (AMP121), apart from `troubleshooter.hardware`: importing
that module (its GPU tables and dataclasses) cost the lint command ~4 ms of its ~60 ms start-up above a
bare interpreter. `troubleshooter.hardware` re-exports these names; both spellings are the same objects."""
from __future__ import annotations

# Tensor cores want GEMM dimensions in multiples of 16 bytes: 8 float16/bfloat16 elements.
# Vocabulary sizes (embedding rows, LM heads) do best as multiples of 64.
HALF_MULTIPLE = 8
VOCAB_MULTIPLE = 64


def padded_size(value: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is >= value: the size to pad a dimension to."""
    return -(-int(value) // multiple) * multiple
