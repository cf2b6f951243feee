"""Model families pretrained in bfloat16, recognised by their hub names.

These families were trained in bfloat16 and publish bfloat16 weights (their configs' `torch_dtype`
is "bfloat16": Llama 3.x, Code Llama, Mistral/Mixtral, Qwen 1.5-3, Gemma 1-3, Falcon, Phi-3/Phi-4,
DeepSeek, Yi, InternLM, MPT, Baichuan 2); T5 v1.1 / Flan-T5 / mT5 / ByT5 / UL2 and BLOOM were trained in
bfloat16 on TPUs, and T5's activations are known to overflow float16 (transformers issue #10830,
"T5 fp16 nan"). Llama 1/2 publish float16 configs and are fine-tuned in float16 widely: not listed.
Quantised builds (GPTQ, AWQ, GGUF, bitsandbytes) compute in float16 by design: not judged. Their activations use bfloat16's range: fine-tuned in float16 they can overflow to
inf/NaN or lose many steps to loss-scale skips, where bfloat16 does not.
"""
from __future__ import annotations

import ast
import re

from ..analysis import func_tail, kwarg
from ..lazy_re import lazy

BF16_PRETRAINED = re.compile(
    r"llama-?3|codellama|code-llama|mistral|mixtral|qwen|gemma|falcon|zephyr|phi-?[34]|deepseek|(^|[/_-])yi-|internlm|(^|[/_-])mpt-|baichuan"
    r"|(^|[/_-])(flan-|m|by)?t5([-_.]|$)|t5-v1_1|(^|[/_-])ul2|bloom", re.I)
_HALF_BUILDS = lazy(r"gptq|awq|gguf|ggml|exl2|int4|int8|4bit|8bit|bnb|-fp16|_fp16", re.I)
_NAME_HINTS = lazy(r"model|checkpoint|base|pretrained|repo|hub|ckpt|name", re.I)


def bf16_family(name: str) -> str | None:
    """The family a hub id or model name belongs to ('google/flan-t5-base' -> 'flan-t5'), or None."""
    if not isinstance(name, str) or len(name) > 200 or " " in name.strip():
        return None
    if _HALF_BUILDS.search(name):
        return None  # a quantised or float16 build (GPTQ kernels compute in float16): float16 is its format
    mt = BF16_PRETRAINED.search(name)
    return mt.group(0).strip("/_-") if mt else None


def model_names(m, bf16: bool = True) -> list[tuple[str, int | None, str]]:
    """(model name, line, how it is given) for string model names in the file: the first argument of a
    `from_pretrained` call, a default of an argument or dataclass field whose name says model, a
    constant with such a name, or `model_name_or_path` in a config file beside the script."""
    def compute():
        out = []
        seen = set()
        for value, line, how in _named_strings(m):
            if bool(bf16_family(value)) == bf16 and (value, line) not in seen:
                seen.add((value, line))
                out.append((value, line, how))
        return out
    return m.memo.get(("model_names", bf16), compute)


def _named_strings(m) -> list[tuple[str, int | None, str]]:
    """Every candidate of `model_names` (non-blank strings in the places it reads), in its order, found once
    for both of its questions (bfloat16 families, and the others)."""
    def compute():
        out = []

        def add(value, line, how):
            if isinstance(value, str) and value.strip():
                out.append((value, line, how))

        for c in m.calls_named("from_pretrained", "add_argument", "option"):
            t = func_tail(c) or ""
            if t == "from_pretrained" and c.args and isinstance(c.args[0], ast.Constant):
                add(c.args[0].value, c.lineno, "from_pretrained")
            elif t in {"add_argument", "option"}:
                names = " ".join(a.value for a in c.args if isinstance(a, ast.Constant) and isinstance(a.value, str))
                d = kwarg(c, "default")
                if _NAME_HINTS.search(names) and isinstance(d, ast.Constant):
                    add(d.value, c.lineno, f"`{names.split()[0] if names else '?'}` default")
        # only an assignment to a name that says model can add one (most of a file's are not): the others are
        # left out before the walk-order merge, which then seldom has two lists to interleave
        hinted = _NAME_HINTS.search
        fields = [n for n in m.of_class(ast.AnnAssign) if n.target.__class__ is ast.Name and hinted(n.target.id)]
        constants = [n for n in m.of_class(ast.Assign) if n.value.__class__ is ast.Constant and any(
            t.__class__ is ast.Name and hinted(t.id) for t in n.targets)]
        for node in m.in_walk_order(fields, constants):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and _NAME_HINTS.search(node.target.id):
                v = node.value
                if isinstance(v, ast.Call) and func_tail(v) == "field":
                    v = kwarg(v, "default")
                if isinstance(v, ast.Constant):
                    add(v.value, node.lineno, f"`{node.target.id}` default")
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and any(
                    isinstance(t, ast.Name) and _NAME_HINTS.search(t.id) for t in node.targets):
                add(node.value.value, node.lineno, f"`{node.targets[0].id}`" if isinstance(node.targets[0], ast.Name) else "")
        from . import setups
        from .configs import configs_of
        configs = configs_of(m)  # a framework script's folder only; the folder's listing first (no setup search)
        for cfg in (configs.beside() if configs.may_have_beside() and setups(m) else []):
            for key in ("model_name_or_path", "model_name", "base_model", "pretrained_model_name_or_path"):
                v = cfg.get(key)
                if isinstance(v, str):
                    add(v, None, f"{cfg.where(key)}: {key}")
        return out
    return m.memo.get(("model_named_strings",), compute)
