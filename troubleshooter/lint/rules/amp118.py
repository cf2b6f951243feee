"""AMP118 private-scaler-api."""
import ast

from ..analysis import tail, text
from .base import Hit, Rule

PRIVATE = {"_scale", "_found_inf_per_device", "_per_optimizer_states", "_growth_tracker", "_init_scale",
           "_unscale_grads_", "_check_inf_per_device", "_maybe_opt_step", "_get_growth_tracker", "_lazy_init_scale_growth_tracker",
           "_growth_factor", "_backoff_factor", "_growth_interval", "_enabled"}


class PrivateScalerApi(Rule):
    id = "AMP118"
    name = "private-scaler-api"
    severity = "warning"
    summary = "Use of private GradScaler members (`_scale`, `_found_inf_per_device`, ...)."
    why = ("Private members change between PyTorch releases (they moved when `torch.cuda.amp` became `torch.amp`) "
           "and bypass the scaler's per-step state machine. The public API covers the common needs.")
    example_bad = """
if scaler._scale < 1.0:
    print("scale collapsed")
"""
    example_good = """
if scaler.get_scale() < 1.0:
    print("scale collapsed")
"""
    fix = ("Use `scaler.get_scale()`, `scaler.state_dict()`, `scaler.is_enabled()`, `get_growth_factor()`; to "
           "detect a skipped step compare `get_scale()` before and after `update()`.")

    known_problems = 'Private members may be read on purpose for logging; the warning is that they change between releases. Members of a class defined in the same file (a framework\'s own `LossScaler`) are not GradScaler members and are not reported.'
    references = ('https://pytorch.org/docs/stable/amp.html (GradScaler)',)

    def check(self, m):
        lines = set()
        if not (m.scaler_ctor or m.scaler_method_keys or m.may_name_part("scaler")):
            return  # no receiver below can be a scaler (`is_scaler` needs one of these)
        for n in m.of_class(ast.Attribute):
            if n.attr.startswith("_") and not n.attr.startswith("__"):
                k = tail(n.value) if isinstance(n.value, (ast.Name, ast.Attribute)) else None
                if k is None or k == "self" or k in m.classes:
                    continue  # `LossScaler._has_inf_or_nan`: a class of this file, not torch's GradScaler
                if (m.is_scaler(k) or "scaler" in k.lower()) and (n.attr in PRIVATE or m.is_scaler(k)):
                    if n.lineno not in lines:
                        lines.add(n.lineno)
                        yield Hit.at(n, f"`{text(n)}` is a private GradScaler member")
