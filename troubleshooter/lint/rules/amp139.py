"""AMP139 hf-trainer-removed-amp-attribute."""
import ast

from ..frameworks import hf_trainer
from .base import Hit, Rule


class HfTrainerRemovedAmpAttribute(Rule):
    id = "AMP139"
    name = "hf-trainer-removed-amp-attribute"
    severity = "warning"
    summary = ("A `Trainer` subclass (`training_step`, `compute_loss` overrides) reading AMP attributes the Hugging Face "
               "Trainer no longer has: `self.scaler`, `self.use_apex`, `self.do_grad_scaling`, `self.use_cuda_amp`, "
               "`self.use_cpu_amp`, `self.amp_dtype`.")
    why = ("Since the Trainer hands mixed precision to accelerate, these attributes are gone (none exists in "
           "transformers 5.24): the override raises AttributeError, or, behind `getattr(self, ..., False)`, silently "
           "skips loss scaling, so an fp16 run backpropagates an unscaled loss that the accelerator's GradScaler then "
           "unscales (divides) anyway.")
    example_bad = """
class MyTrainer(Trainer):
    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = self.compute_loss(model, inputs)
        if self.do_grad_scaling:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()
        return loss.detach()
"""
    example_good = """
class MyTrainer(Trainer):
    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = self.compute_loss(model, inputs)
        self.accelerator.backward(loss)
        return loss.detach()
"""
    fix = "Run the loss through `self.accelerator.backward(loss)`; it scales under fp16 and nothing else is needed."
    known_problems = ("A subclass pinned to an old transformers release (where these existed) is still reported. "
                      "Attributes the subclass sets itself are not reported.")
    references = ("https://github.com/huggingface/transformers/blob/main/src/transformers/trainer.py (training_step)",)

    def check(self, m):
        subs = hf_trainer.trainer_subclasses(m)
        for name in sorted(subs):
            cls = m.classes[name]
            nodes = m.walk(cls)
            own = {t.attr for n in nodes if isinstance(n, (ast.Assign, ast.AnnAssign))
                   for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                   if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}
            seen = set()
            for n in nodes:
                attr = None
                if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self" \
                        and isinstance(n.ctx, ast.Load):
                    attr = n.attr
                elif isinstance(n, ast.Call) and getattr(n.func, "id", None) in {"getattr", "hasattr"} and len(n.args) >= 2 \
                        and isinstance(n.args[0], ast.Name) and n.args[0].id == "self" and isinstance(n.args[1], ast.Constant):
                    attr = n.args[1].value
                if attr in hf_trainer.REMOVED_ATTRS and attr not in own and attr not in seen:
                    seen.add(attr)
                    yield Hit.at(n, f"`self.{attr}` in `{name}` (a {', '.join(sorted(b.attr if isinstance(b, ast.Attribute) else getattr(b, 'id', '?') for b in cls.bases))} "
                                    "subclass): the Trainer has no such attribute since its AMP moved to accelerate "
                                    "(absent in transformers 5.24)",
                                 "use `self.accelerator.backward(loss)` (and `self.accelerator.scaler` if the scaler "
                                 "itself is needed)", framework="hf_trainer", attribute=attr)
