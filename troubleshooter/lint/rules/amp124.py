"""AMP124 half-checkpoint."""
from ..analysis import SAVE
from .amp110 import checkpoint_contents, state_owners
from .amp111 import trained_half_models
from .base import Hit, Rule


class HalfCheckpoint(Rule):
    id = "AMP124"
    needs_events = True
    name = "half-checkpoint"
    severity = "warning"
    summary = "Saving a half-precision state dict (after `.half()`) as a training checkpoint."
    why = ("A training checkpoint should hold the float32 master weights: a float16/bfloat16 copy has lost the low "
           "bits, so resuming from it changes the model, and small updates accumulated since are gone.")
    example_bad = """
model.half()
torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, "ckpt.pt")
"""
    example_good = """
# keep the model in float32 and use autocast; save the float32 weights
torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, "ckpt.pt")
"""
    fix = "Keep float32 master weights (autocast instead of `.half()`) and checkpoint those; export a half copy separately for inference."

    known_problems = 'Exports for inference (a separate half copy) are fine; the rule looks for a half state dict saved with optimizer state. A checkpoint name is read through what is written to it above the save, so a dict completed further down belongs to a later save.'
    references = ('https://pytorch.org/docs/stable/notes/amp_examples.html (Saving/resuming)',)

    def check(self, m):
        if not any(s.of(SAVE) for s in m.event_scopes) or not m.halved:
            return  # nothing saved (most files): the half models, a role table (roles.py), are not asked for
        trained = trained_half_models(m)
        for s in m.event_scopes:
            for e in s.of(SAVE):
                if e.arg is None:
                    continue
                contents = checkpoint_contents(m, s, e.arg, before=e.line)
                values = contents[1] if contents else [e.arg]
                owners = state_owners(values)
                has_opt = any(m.is_optimizer(o) for o in owners)
                half = [o for o in owners if o in trained or
                        (has_opt and o in m.halved and m.halved[o].lineno < e.line and m.scope_of(m.halved[o]) is s)]
                if half:
                    yield Hit.at(e.node, f"checkpoint stores the half-precision weights of `{half[0]}` "
                                         "(no float32 master copy)")
