"""AMP142 half-trainable-params-with-scaler."""
import ast

from ..analysis import chain_base, cond_key, func_tail, kwarg, receiver, text
from .. import frameworks
from ._frameworks import framework_name, precision_note
from .base import Hit, Rule

_ADAPTERS = {"add_adapter", "get_peft_model", "inject_adapter_in_model", "add_lora", "load_adapter"}
_UPCASTS = {"cast_training_params"}


class HalfTrainableParamsWithScaler(Rule):
    id = "AMP142"
    name = "half-trainable-params-with-scaler"
    severity = "warning"
    summary = ("Trainable adapter (LoRA) parameters left in float16 (the model cast with `.to(dtype=weight_dtype)` "
               "before or after `add_adapter` / `get_peft_model`) while float16 loss scaling runs: Accelerate's "
               "`mixed_precision=\"fp16\"` or a GradScaler.")
    why = ("GradScaler refuses float16 gradients: its unscale raises \"Attempting to unscale FP16 gradients.\" "
           "(torch/amp/grad_scaler.py, `allow_fp16=False`) at the first optimizer step. LoRA weights created on or "
           "cast to a float16 base model are float16, so their gradients are too; they also have no float32 master "
           "copy, so small updates round away. The diffusers training scripts fixed this repeatedly (PRs #6119, "
           "#6231, #6245) by upcasting the trainable parameters after adding the adapter.")
    example_bad = """
weight_dtype = torch.float16 if accelerator.mixed_precision == "fp16" else torch.float32
unet.requires_grad_(False)
unet.to(accelerator.device, dtype=weight_dtype)
unet.add_adapter(LoraConfig(r=4, target_modules=["to_k", "to_q", "to_v", "to_out.0"]))
optimizer = torch.optim.AdamW(filter(lambda p: p.requires_grad, unet.parameters()), lr=1e-4)
"""
    example_good = """
weight_dtype = torch.float16 if accelerator.mixed_precision == "fp16" else torch.float32
unet.requires_grad_(False)
unet.to(accelerator.device, dtype=weight_dtype)
unet.add_adapter(LoraConfig(r=4, target_modules=["to_k", "to_q", "to_v", "to_out.0"]))
if accelerator.mixed_precision == "fp16":
    cast_training_params(unet, dtype=torch.float32)  # only the trainable (LoRA) parameters
optimizer = torch.optim.AdamW(filter(lambda p: p.requires_grad, unet.parameters()), lr=1e-4)
"""
    fix = ("Upcast the trainable parameters after adding the adapter: `diffusers.training_utils.cast_training_params"
           "(model, dtype=torch.float32)`, or `for p in model.parameters(): if p.requires_grad: p.data = "
           "p.to(torch.float32)`; keep the frozen base in float16.")
    known_problems = ("A warning needs float16 named in the file, a default or a config beside it (or a GradScaler); "
                      "float16 chosen only at launch gives info. Recognises the cast through a dtype variable that is float16 on some path (`weight_dtype`) and "
                      "adapters added with peft/diffusers calls in this file; an upcast done in a helper of another "
                      "file is not seen (a false warning). peft's `get_peft_model(..., autocast_adapter_dtype=True)` "
                      "upcasts adapters it creates, but not a later `.to(float16)`. A function of this file named like an adapter call "
                      "(`def add_lora(model)`) is the user's own: the peft/diffusers calls inside it are checked, not its callers.")
    references = ("https://github.com/huggingface/diffusers/pull/6119",
                  "https://github.com/pytorch/pytorch/blob/v2.13.0/torch/amp/grad_scaler.py (_unscale_grads_)")

    def check(self, m):
        if m.calls_named(*_UPCASTS) or _upcast_loop(m):
            return
        scaling, sure = self._scaling(m)
        if scaling is None:
            return
        half_vars = {k for k, vs in m.assigns.items() if any(_is_fp16(m, v) for v in vs)}
        cast: dict[str, ast.Call] = {}
        for c in m.calls_named("to"):
            if receiver(c) is None:
                continue
            dtypes = list(c.args) + [k.value for k in c.keywords if k.arg == "dtype"]
            if any((isinstance(d, ast.Name) and d.id in half_vars) or m.dtype_of(d) == "fp16" for d in dtypes):
                base = chain_base(receiver(c))
                if base:
                    cast.setdefault(base, c)
        if not cast:
            return
        own = {f.name for cls in (ast.FunctionDef, ast.AsyncFunctionDef) for f in m.of_class(cls)}
        for c in sorted(m.calls, key=lambda n: (n.lineno, n.col_offset)):
            t = func_tail(c)
            if t not in _ADAPTERS or t in own:  # this file's own `add_lora`: its body decides the dtypes
                continue
            target = chain_base(receiver(c)) if t in {"add_adapter", "add_lora", "load_adapter"} and receiver(c) is not None \
                else next((chain_base(a) for a in c.args if chain_base(a) in cast), None)
            if target in cast and self._trained(m, target) and not _exclusive(m, cast[target], c):
                yield Hit.at(c, f"`{text(c.func)}(...)` gives `{target}` trainable adapter weights, but `{target}` is cast "
                                f"to float16 (line {cast[target].lineno}) and nothing upcasts the trainable parameters: "
                                f"under float16 loss scaling ({scaling}) the first step fails with \"Attempting to unscale "
                                "FP16 gradients.\"",
                             f"after the adapter, `cast_training_params({target}, dtype=torch.float32)` (diffusers) or "
                             "upcast every `p` with `p.requires_grad` to float32").lowered("warning" if sure else "info")
                return

    def _scaling(self, m) -> tuple[str | None, bool]:
        """What scales the loss in float16 here (None: nothing that refuses float16 gradients), and whether
        float16 is named in the file, a default or a config (False: only a launcher could choose it)."""
        if any(m.scaler_enabled(k) for k in m.scaler_ctor):
            return "a GradScaler", True
        for st in frameworks.of(m, "accelerate", "fabric", "hf_trainer", "lightning"):
            if st.fp16 != "no":
                return f"{framework_name(st)}, {precision_note(st)}", st.precision.may(frameworks.FP16)
        return None, False

    def _trained(self, m, key: str) -> bool:
        """The model's parameters reach an optimizer built in this file."""
        for ctors in m.optimizer_ctor.values():
            for c in ctors:
                if any(key in _names(a) or _names(a) & _derived(m, key) for a in list(c.args) + [k.value for k in c.keywords]):
                    return True
        return False


def _conditions(m, node: ast.AST) -> dict[str, bool]:
    """Condition key -> polarity of every `if` around `node` (`if not args.train_text_encoder:` body: False)."""
    out: dict[str, bool] = {}
    for st in m.of_class(ast.If):
        lo, hi = st.lineno, getattr(st, "end_lineno", st.lineno)
        if not lo <= node.lineno <= hi:
            continue
        key, pol = cond_key(st.test)
        in_body = any(b.lineno <= node.lineno <= getattr(b, "end_lineno", b.lineno) for b in st.body)
        out[key] = pol if in_body else not pol
    return out


def _exclusive(m, a: ast.AST, b: ast.AST) -> bool:
    """a and b sit in branches of the same condition that exclude each other."""
    ca, cb = _conditions(m, a), _conditions(m, b)
    return any(k in cb and cb[k] != pol for k, pol in ca.items())


def _is_fp16(m, value) -> bool:
    if isinstance(value, ast.IfExp):
        return _is_fp16(m, value.body) or _is_fp16(m, value.orelse)
    return m.dtype_of(value) == "fp16"


def _names(node) -> set[str]:
    return {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node) if isinstance(n, (ast.Name, ast.Attribute))}


def _derived(m, key: str) -> set[str]:
    """Names assigned, directly or through each other, from expressions that mention `key`
    (`lora_layers = filter(..., unet.parameters())`, `params = [{"params": lora_layers}]`)."""
    def compute():
        found = {key}
        for _ in range(4):
            more = {k for k, vs in m.assigns.items() if k not in found and any(_names(v) & found for v in vs)}
            if not more:
                break
            found |= more
        return found - {key}
    return m.memo.get(("amp142_derived", key), compute)


def _upcast_loop(m) -> bool:
    """`p.data = p.to(torch.float32)` / `p.data = p.data.float()`: trainable parameters upcast by hand."""
    if not m.may_name("data"):  # no name or attribute `data` anywhere: no `.data` target in this file
        return False
    for node in m.of_class(ast.Assign):
        if any(isinstance(t, ast.Attribute) and t.attr == "data" for t in node.targets) and isinstance(node.value, ast.Call):
            v = node.value
            if func_tail(v) == "float" or (func_tail(v) == "to" and any(m.dtype_of(a) == "fp32" for a in
                                                                          list(v.args) + [kwarg(v, "dtype")] if a is not None)):
                return True
    return False



