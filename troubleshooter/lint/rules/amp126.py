"""AMP126 backward-before-other-optimizer-steps."""
import ast

from ..analysis import BACKWARD, OPT_STEP, SCALER_STEP, ZERO_GRAD, compatible, tail, text
from .base import Hit, Rule


class BackwardBeforeOtherOptimizerSteps(Rule):
    id = "AMP126"
    needs_events = True
    name = "backward-before-other-optimizer-steps"
    severity = "warning"
    summary = ("A second backward (another model's loss, e.g. a GAN generator's) runs before the optimizer of the "
               "first loss has stepped, and writes into that optimizer's gradients.")
    why = ("`opt_d.zero_grad(); loss_d.backward(); opt_g.zero_grad(); loss_g.backward(); opt_d.step()`: the "
           "generator's loss is computed through the discriminator, so its backward adds gradients to the "
           "discriminator's `.grad` before `opt_d` steps. The discriminator is then updated on both losses, "
           "pulling it the generator's way. Under a GradScaler it is worse: `scaler.unscale_(opt_d)` already ran, "
           "so the added gradients are multiplied by the loss scale (65536) and dominate the update. The "
           "`zero_grad` of the second optimizer between the two backwards shows each loss is meant for its own "
           "optimizer. A GAN trained this way drifts away from the data (issue 26: the ring of radius 2 was "
           "learnt at radius 5.8 in fp16 and 14.7 in fp32).")
    example_bad = """
opt_d.zero_grad()
scaler.scale(loss_d).backward()
opt_g.zero_grad()
loss_g = gan_loss(discriminator(fake), True)
scaler.scale(loss_g).backward()
scaler.step(opt_d)
scaler.step(opt_g)
scaler.update()
"""
    example_good = """
opt_d.zero_grad()
scaler.scale(loss_d).backward()
scaler.step(opt_d)  # the discriminator steps before the generator's backward
opt_g.zero_grad()
discriminator.requires_grad_(False)
loss_g = gan_loss(discriminator(fake), True)
scaler.scale(loss_g).backward()
discriminator.requires_grad_(True)
scaler.step(opt_g)
scaler.update()
"""
    fix = ("Step the first optimizer (`scaler.step(opt_d)` / `opt_d.step()`) before the second backward, and "
           "freeze the first model during that backward (`discriminator.requires_grad_(False)`, then `True` "
           "again); `python -m troubleshooter recipe --model gan` writes this order.")
    known_problems = ("Only the interleaved form is recognised: a `zero_grad()` of another optimizer (or model) "
                      "between the two backwards. Two losses backpropagated together and both optimizers stepped "
                      "afterwards, as in PyTorch's multi-loss AMP example, are left alone: there both losses are "
                      "meant to reach both models. A second loss that does not pass through the first model "
                      "(detached inputs) writes nothing there; the rule cannot see that and says `warning`.")
    references = ("https://pytorch.org/docs/stable/notes/amp_examples.html (Working with multiple models, losses, "
                  "and optimizers)",
                  "https://github.com/pytorch/examples/blob/main/dcgan/main.py (the discriminator steps before the "
                  "generator's backward)")

    def check(self, m):
        if not any(s.of(ZERO_GRAD) for s in m.event_scopes):
            return  # no zero_grad: the optimizers' owners (a role table, roles.py) are not asked for
        owner = self._owners(m)
        for s in m.event_scopes:
            events = s.events
            for i, z1 in enumerate(events):
                if z1.kind != ZERO_GRAD or not z1.recv:
                    continue
                first = owner(z1.recv)
                hit = self._after(events[i + 1:], first, owner, m)
                if hit is not None:
                    step, b2, z2 = hit
                    yield Hit.at(step.node, f"`{text(step.node)}` steps on gradients that the backward on line "
                                            f"{b2.line} also wrote into: that backward ran after "
                                            f"`{text(z2.node)}` (another model's loss) but before this optimizer "
                                            "stepped" + (", and under the GradScaler those gradients are still "
                                                         "multiplied by the loss scale" if b2.scaled else ""),
                                 f"move this step above `{text(z2.node)}` (line {z2.line}) and freeze the first "
                                 "model during the second backward (`model.requires_grad_(False)`)")

    @staticmethod
    def _after(events, first, owner, m):
        """(the late step, the second backward, the other zero_grad) for the sequence
        backward -> other.zero_grad -> backward -> step(first), nothing of `first` stepped or zeroed between."""
        b1 = z2 = b2 = None
        for e in events:
            if e.kind == ZERO_GRAD and e.recv and owner(e.recv) == first:
                return None  # zeroed again: a new iteration of the first model
            if e.kind in (OPT_STEP, SCALER_STEP) and owner(_stepped(e)) == first:
                if b2 is not None and compatible(b2, e) and e.loops == b2.loops:
                    return e, b2, z2
                return None  # stepped before any second backward: the right order
            if e.kind == BACKWARD and not e.managed:
                if b1 is None:
                    b1 = e
                elif z2 is not None and b2 is None and compatible(b1, e):
                    if _frozen_between(m, z2, e, first):
                        return None
                    b2 = e
            elif e.kind == ZERO_GRAD and e.recv and b1 is not None and b2 is None and owner(e.recv) != first:
                z2 = e
        return None

    @staticmethod
    def _owners(m):
        """Key -> the model an optimizer (or model) key zeroes and steps: `opt_d` made from
        `discriminator.parameters()` and `discriminator.zero_grad()` both mean `discriminator`."""
        models = {}
        for key, ctors in m.optimizer_ctor.items():
            for c in ctors:
                arg = c.args[0] if c.args else next((k.value for k in c.keywords if k.arg == "params"), None)
                base = arg.func.value if (isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute)
                                          and arg.func.attr in ("parameters", "named_parameters")) else None
                if base is not None and tail(base):
                    models[key] = tail(base)
        return lambda key: models.get(key, key) if key else None


def _stepped(e) -> str | None:
    """The optimizer key a step event steps: `opt.step()` or `scaler.step(opt)`."""
    if e.kind == OPT_STEP:
        return e.recv
    return tail(e.arg) if isinstance(e.arg, (ast.Name, ast.Attribute)) else None


def _frozen_between(m, start, end, model: str | None) -> bool:
    """`model.requires_grad_(False)` (or `p.requires_grad = False` over its parameters) between two events:
    the second backward then writes nothing into the first model's gradients."""
    for n in m.calls:
        if start.line <= n.lineno <= end.line and isinstance(n.func, ast.Attribute) \
                and n.func.attr == "requires_grad_" and (model is None or tail(n.func.value) == model) \
                and n.args and isinstance(n.args[0], ast.Constant) and n.args[0].value is False:
            return True
    for n in m.of_class(ast.Assign):
        if start.line <= n.lineno <= end.line and any(isinstance(t, ast.Attribute) and t.attr == "requires_grad"
                                                      for t in n.targets) \
                and isinstance(n.value, ast.Constant) and n.value.value is False:
            return True
    return False
