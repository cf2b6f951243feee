"""AMP134 framework-checkpoint-drops-scaler."""
import ast

from ..analysis import SAVE, func_tail, receiver, tail
from .. import frameworks
from ._frameworks import framework_name, precision_note, severity
from .amp110 import checkpoint_contents, state_owners
from .base import Hit, Rule

_OWN_CHECKPOINT = {"accelerate": ("save_state",), "deepspeed": ("save_checkpoint",), "fabric": ()}
_FIX = {"accelerate": "save with `accelerator.save_state(output_dir)` and resume with `accelerator.load_state(...)`: "
                      "they keep the GradScaler (scaler.pt); or add `\"scaler\": accelerator.scaler.state_dict()`",
        "fabric": "add the scaler to the state: `state[\"scaler\"] = fabric.strategy.precision.scaler` (Fabric saves "
                  "and restores any object with state_dict/load_state_dict)",
        "deepspeed": "save with `model_engine.save_checkpoint(dir)` / `load_checkpoint(dir)`: the engine keeps its "
                     "loss scaler with the optimizer state"}


class FrameworkCheckpointDropsScaler(Rule):
    id = "AMP134"
    needs_events = True
    name = "framework-checkpoint-drops-scaler"
    severity = "warning"
    summary = ("A hand-written resumable checkpoint (model + optimizer state) under Accelerate, Fabric or DeepSpeed "
               "float16 that leaves out the framework's loss-scaler state.")
    why = ("The framework's GradScaler (or DeepSpeed's loss scaler) is training state: `accelerator.save_state`, the "
           "Lightning Trainer's checkpoint and `engine.save_checkpoint` keep it. A hand-written `torch.save` / "
           "`accelerator.save` / `fabric.save` of the model and optimizer does not (Fabric adds nothing by itself), "
           "so a resumed run restarts the scale at 65536 and skips steps again, or overflows from a low calibrated "
           "scale.")
    example_bad = """
accelerator = Accelerator(mixed_precision="fp16")
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
...
accelerator.save({"model": accelerator.unwrap_model(model).state_dict(),
                  "optimizer": optimizer.state_dict(), "step": step}, "ckpt.pt")
"""
    example_good = """
accelerator = Accelerator(mixed_precision="fp16")
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
...
accelerator.save_state("checkpoints/step_1000")
"""
    fix = "Save with the framework's checkpoint (`accelerator.save_state`, `engine.save_checkpoint`) or add its scaler."
    known_problems = ("Weights-only saves (no optimizer state) are not resumable checkpoints and are not reported. A file "
                      "that also calls the framework's own checkpoint (`save_state`) is not reported. The warning needs "
                      "float16 in the file, a default or a config beside it; a precision chosen only at launch gives info.")
    references = ("https://huggingface.co/docs/accelerate/usage_guides/checkpoint",
                  "https://lightning.ai/docs/fabric/stable/guide/checkpoint/checkpoint.html",
                  "https://www.deepspeed.ai/getting-started/#model-checkpointing")

    def check(self, m):
        for fw in ("accelerate", "fabric", "deepspeed"):
            setups = frameworks.of(m, fw)
            if not setups:
                continue
            setup = setups[0]
            sev = severity(setup, "warning", "warning" if setup.precision.may(frameworks.FP16) else "info")
            if sev is None:
                continue
            own = _OWN_CHECKPOINT[fw]
            if own and any(func_tail(c) in own for c in m.calls):
                continue
            for s in m.event_scopes:
                for e in s.of(SAVE):
                    obj = e.arg
                    if func_tail(e.node) == "save" and receiver(e.node) is not None and \
                            tail(receiver(e.node)) in setup.keys and fw == "fabric":
                        obj = e.node.args[1] if len(e.node.args) > 1 else None
                    contents = checkpoint_contents(m, s, obj, before=e.line)
                    if contents is None:
                        continue
                    keys, values = contents
                    owners = state_owners(values)
                    names = {n.id if isinstance(n, ast.Name) else n.attr for v in values for n in ast.walk(v)
                             if isinstance(n, (ast.Name, ast.Attribute))}
                    has_opt = any(m.is_optimizer(o) for o in owners) or any("optim" in k.lower() for k in keys) or \
                        (fw == "fabric" and any(m.is_optimizer(n) for n in names))
                    has_scaler = any("scal" in k.lower() for k in keys) or any("scaler" in n.lower() for n in names)
                    if has_opt and not has_scaler:
                        yield Hit(e.line, e.col + 1,
                                  f"checkpoint saves optimizer state but not {framework_name(setup)}'s loss-scaler state: "
                                  f"a resumed run restarts the loss scale ({precision_note(setup)})",
                                  _FIX[fw], {"framework": fw}, None if sev == self.severity else sev)
