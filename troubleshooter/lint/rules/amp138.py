"""AMP138 legacy-precision-flag."""
from ..analysis import kwarg, text
from ..frameworks import accelerate, fabric, hf_trainer, lightning
from ..frameworks.values import resolve
from .base import Hit, Rule


class LegacyPrecisionFlag(Rule):
    id = "AMP138"
    name = "legacy-precision-flag"
    severity = "warning"
    summary = ("A framework precision setting in an old spelling: Lightning `precision=16` / `\"bf16\"`, "
               "`amp_backend=` / `amp_level=`; `TrainingArguments(fp16_backend=..., half_precision_backend=..., "
               "fp16_opt_level=...)`; `Accelerator(fp16=True)`; apex `amp.initialize`.")
    why = ("Lightning 2.x still takes `precision=16` but warns \"`precision=16` is supported for historical reasons but "
           "its usage is discouraged. Please set your precision to 16-mixed instead!\"; `amp_backend`/`amp_level` "
           "(apex) are not Trainer arguments since 2.0 (TypeError). transformers 5.24's TrainingArguments has no "
           "`fp16_backend`, `half_precision_backend` or `fp16_opt_level` (TypeError), and accelerate 1.x's Accelerator "
           "no `fp16` argument. apex's `amp.initialize` is deprecated by NVIDIA in favour of torch.amp.")
    example_bad = """
trainer = pl.Trainer(accelerator="gpu", precision=16, amp_backend="native")
"""
    example_good = """
trainer = pl.Trainer(accelerator="gpu", precision="16-mixed")
"""
    fix = ('Lightning: `precision="16-mixed"` / `"bf16-mixed"`, no `amp_backend`; Hugging Face: `fp16=True` / `bf16=True` '
           'only; Accelerate: `mixed_precision="fp16"`; apex: `torch.autocast` + `torch.amp.GradScaler`.')
    known_problems = ("A file written for Lightning 1.x or an old transformers, pinned on purpose, is still reported. The "
                      "Lightning aliases still work (Lightning itself warns about them); removed arguments fail. apex's "
                      "`amp.initialize` is info.")
    references = ("https://lightning.ai/docs/pytorch/stable/common/precision_basic.html",
                  "https://lightning.ai/docs/pytorch/stable/upgrade/from_1_9.html",
                  "https://huggingface.co/docs/transformers/main_classes/trainer#transformers.TrainingArguments")

    def check(self, m):
        for c in lightning.trainer_calls(m) + [s.node for s in fabric.setups(m)]:
            kw = kwarg(c, "precision")
            if kw is not None:
                v = resolve(m, kw)
                for o in v.options:
                    if o in lightning.LEGACY_ALIASES and v.how == "literal":
                        yield Hit.at(kw, f"`precision={text(kw)}` is the Lightning 1.x spelling: 2.x warns that it is "
                                         "\"supported for historical reasons but its usage is discouraged\"",
                                     f'write `precision="{lightning.LEGACY_ALIASES[o]}"`')
                        break
            for name in lightning.REMOVED_TRAINER_ARGS:
                kw = kwarg(c, name)
                if kw is not None:
                    yield Hit.at(kw, f"`{name}=` is not a Lightning 2.x argument (apex support and the AMP backend "
                                     "choice were removed in 2.0): `Trainer(...)` raises TypeError",
                                 'drop it; native AMP is chosen with `precision="16-mixed"`')
        for c in hf_trainer.args_calls(m):
            for name in sorted(hf_trainer.REMOVED_ARGS):
                kw = kwarg(c, name)
                if kw is not None:
                    yield Hit.at(kw, f"`{name}=` is not a field of TrainingArguments in transformers 5.x (the apex "
                                     "options are gone): the call raises TypeError",
                                 "drop it: `fp16=True` (native AMP through accelerate) or `bf16=True`")
        for s in accelerate.setups(m):
            kw = kwarg(s.node, "fp16") if s.node is not None else None
            if kw is not None:
                yield Hit.at(kw, "`Accelerator(fp16=...)` is the accelerate 0.x spelling; 1.x has no `fp16` argument "
                                 "(TypeError)", 'write `Accelerator(mixed_precision="fp16")`')
        for c, q in m.calls_resolving(lambda last: last == "initialize"):
            if q.startswith("apex.amp.") and q.endswith(".initialize"):
                yield Hit.at(c, "apex `amp.initialize` is deprecated (NVIDIA points to torch.amp); its opt levels "
                                "map to `torch.autocast` + `torch.amp.GradScaler`",
                             'use `torch.autocast("cuda", dtype=torch.float16)` with `torch.amp.GradScaler("cuda")`, '
                             'or the framework\'s precision flag').lowered("info")
