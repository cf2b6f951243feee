"""AMP120 custom-function-without-custom-fwd."""
import ast

from ..analysis import tail
from .base import Hit, Rule


class CustomFunctionWithoutCustomFwd(Rule):
    id = "AMP120"
    name = "custom-function-without-custom-fwd"
    severity = "info"
    summary = "A `torch.autograd.Function` subclass in an autocast script without `torch.amp.custom_fwd`/`custom_bwd`."
    why = ("Autocast does not know a custom Function: its forward sees whatever dtypes arrive, and its backward "
           "runs outside autocast with a different dtype than the forward. `custom_fwd`/`custom_bwd` make the "
           "backward run in the forward's autocast state (and can cast inputs to float32).")
    example_bad = """
class MyOp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x): ...
    @staticmethod
    def backward(ctx, g): ...
"""
    example_good = """
class MyOp(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(ctx, x): ...
    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, g): ...
"""
    fix = 'Decorate `forward` with `@torch.amp.custom_fwd(device_type="cuda")` and `backward` with `@torch.amp.custom_bwd(device_type="cuda")`.'

    known_problems = 'Functions whose forward and backward are dtype-agnostic need no decorators; the note is informational.'
    references = ('https://pytorch.org/docs/stable/notes/amp_examples.html (Autocast and custom autograd functions)',)

    def check(self, m):
        functions = [cls for cls in m.classes.values() if any(
            (m.names.qual(b) or "").endswith("autograd.Function") or
            ((m.names.qual(b) or "") == "Function" and tail(b) == "Function") for b in cls.bases)]
        # asked second: autocast variables are a role table (roles.py), built only for the files that need one
        if not functions or not (any(s.regions for s in m.scopes) or m.autocast_vars or m.autocast_factories):
            return
        for cls in functions:
            methods = {d.name: d for d in cls.body if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))}
            missing = [name for name, deco in (("forward", "custom_fwd"), ("backward", "custom_bwd"))
                       if name in methods and not any(deco in (m.names.qual(d.func if isinstance(d, ast.Call) else d) or "")
                                                      for d in methods[name].decorator_list)]
            if missing:
                yield Hit.at(cls, f"autograd Function `{cls.name}` has no `{'/'.join('custom_fwd' if x == 'forward' else 'custom_bwd' for x in missing)}` "
                                  "decorator in a script that uses autocast")
