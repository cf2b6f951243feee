"""AMP140 fp16-for-bf16-pretrained-model."""
from .. import frameworks
from ..frameworks.models import bf16_family, model_names
from ..frameworks.values import CONFIG, DEFAULT, LITERAL
from ._frameworks import framework_name
from ._steps import training_regions
from .base import Hit, Rule


class Fp16ForBf16PretrainedModel(Rule):
    id = "AMP140"
    name = "fp16-for-bf16-pretrained-model"
    severity = "warning"
    summary = ("float16 mixed precision chosen (in code, an argument default or a config file) to fine-tune a model "
               "family pretrained in bfloat16: Llama, Mistral, Qwen, Gemma, Falcon, Phi-3, T5/Flan-T5, BLOOM, ...")
    why = ("These models were trained in bfloat16, whose range equals float32's; their activations and weights use "
           "it. In float16 (max 65504) they overflow to inf/NaN (T5's feed-forward activations are the known case) "
           "or the GradScaler skips step after step. bfloat16 keeps the pretraining numerics and needs no loss "
           "scaling, on every GPU that has it (Ampere and newer).")
    example_bad = """
model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B")
args = TrainingArguments(output_dir="out", fp16=True)
"""
    example_good = """
model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B")
args = TrainingArguments(output_dir="out", bf16=True)
"""
    fix = ("Use bfloat16 (`bf16=True`, `mixed_precision=\"bf16\"`, `precision=\"bf16-mixed\"`, `\"bf16\": {\"enabled\": "
           "true}`) on a GPU that supports it; on one that does not (V100, T4), expect skipped steps and watch for "
           "inf/NaN.")
    known_problems = ("Models are recognised by name (the hub id or a name default), so a renamed local checkpoint is "
                      "not seen and a name that only mentions a family (a tokenizer) may be. float16 chosen only on "
                      "the command line is not seen.")
    references = ("https://huggingface.co/docs/transformers/perf_train_gpu_one#bf16",
                  "https://github.com/huggingface/transformers/issues/10830")

    def check(self, m):
        if not frameworks.setups(m) and not any(s.regions for s in m.scopes):
            return  # no setup and no autocast region (most files): no model name is asked for
        names = model_names(m)
        if not names:
            return
        others = [line for _, line, _ in model_names(m, bf16=False) if line]

        def model_for(line: int):
            """The bf16 model a setup on `line` trains: the file's, unless another model is named too; then
            only one named in the same function (and no other model there)."""
            if not others:
                return names[0]
            lo, hi = _scope_lines(m, line)
            mine = [n for n in names if n[1] and lo <= n[1] <= hi]
            return mine[0] if mine and not any(lo <= o <= hi for o in others) and (lo, hi) != (1, len(m.lines)) else None

        for st in frameworks.setups(m):
            p = st.precision
            if p.how in (LITERAL, DEFAULT, CONFIG) and p.may(frameworks.FP16) and st.node is not None:
                found = model_for(st.node.lineno)
                if found is None:
                    continue
                where = p.line or st.node.lineno
                yield Hit(where, 1 if where != st.node.lineno else st.node.col_offset + 1,
                          f"float16 chosen for {framework_name(st)} ({p.evidence}) to train {_model(found)}, a "
                          f"{bf16_family(found[0])} model pretrained in bfloat16: its activations may overflow float16",
                          "train in bfloat16 where the GPU has it", {"framework": st.framework, "model": found[0]})
        for s, ac, node in training_regions(m, ("fp16",)):
            found = model_for(node.lineno)
            if found is None:
                continue
            yield Hit.at(node, f"float16 autocast (line {ac.line}) trains {_model(found)}, a {bf16_family(found[0])} model "
                               "pretrained in bfloat16: its activations may overflow float16",
                         'use `torch.autocast("cuda", dtype=torch.bfloat16)` where the GPU has it', model=found[0])
            break


def _model(found) -> str:
    name, line, how = found
    return f"`{name}`" + (f" ({how}, line {line})" if line else f" ({how})")


def _scope_lines(m, line: int) -> tuple[int, int]:
    """Lines of the innermost function holding `line` (the whole file at module level)."""
    best = (1, len(m.lines))
    for s in m.scopes[1:]:
        lo, hi = s.node.lineno, getattr(s.node, "end_lineno", s.node.lineno)
        if lo <= line <= hi and hi - lo < best[1] - best[0]:
            best = (lo, hi)
    return best
