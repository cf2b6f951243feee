"""AMP135 fsdp-grad-scaler."""
from ..analysis import BACKWARD
from .. import frameworks
from ..frameworks import fsdp
from .base import Hit, Rule


class FsdpGradScaler(Rule):
    id = "AMP135"
    name = "fsdp-grad-scaler"
    severity = "warning"
    summary = ("FSDP1 (`FullyShardedDataParallel`) trained in float16 with a plain `torch.amp.GradScaler` instead of "
               "`ShardedGradScaler`, or FSDP float16 parameters (`param_dtype=torch.float16`) with no loss scaling.")
    why = ("FSDP1 shards the gradients: a plain GradScaler checks only this rank's shard for inf/NaN, so one rank "
           "skips a step the others take, and their parameters and loss scales drift apart silently. "
           "`ShardedGradScaler` all-reduces the inf flag. (FSDP2's `fully_shard` gives DTensor gradients whose inf "
           "check is reduced over the mesh, so a plain GradScaler is right there.) float16 parameters without any "
           "loss scaling flush small gradients to zero, as with float16 autocast.")
    example_bad = """
mp = MixedPrecision(param_dtype=torch.float16, reduce_dtype=torch.float16)
model = FSDP(model, mixed_precision=mp)
scaler = torch.amp.GradScaler("cuda")
"""
    example_good = """
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

mp = MixedPrecision(param_dtype=torch.float16, reduce_dtype=torch.float16)
model = FSDP(model, mixed_precision=mp)
scaler = ShardedGradScaler()
"""
    fix = ("FSDP1: `from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler`; FSDP2 with "
           "`param_dtype=torch.float16`: `torch.amp.GradScaler(\"cuda\")`; or use bfloat16 (no scaler needed).")
    known_problems = ("Only FSDP wrapping done in this file is seen. A single-rank FSDP1 run does not suffer from the "
                      "plain scaler (one shard is the whole model): a warning, not an error.")
    references = ("https://github.com/pytorch/pytorch/blob/v2.13.0/torch/distributed/fsdp/sharded_grad_scaler.py",
                  "https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html")

    def check(self, m):
        setups = frameworks.of(m, "fsdp1", "fsdp2")
        if not setups:
            return
        fp16_autocast = any(ac.fp16 for s in m.scopes for ac, _, nograd in s.regions if not nograd)
        trains = any(e.kind == BACKWARD for s in m.event_scopes for e in s.events)
        plain = fsdp.plain_scalers(m)
        sharded = fsdp.sharded_scalers(m)
        told_no_scaler = False
        for st in setups:
            half_params = st.precision.may(frameworks.FP16)
            if st.framework == "fsdp1" and (half_params or fp16_autocast) and plain and not sharded:
                key, ctor = plain[0]
                why = st.precision.evidence if half_params else "float16 autocast"
                yield Hit.at(ctor, f"`{key}` is a plain GradScaler on an FSDP1 model ({st.label}, {why}): each rank "
                                   "checks only its own gradient shard for inf/NaN, so ranks disagree on skipping and "
                                   "their weights and loss scales drift apart",
                             "use `ShardedGradScaler()` (torch.distributed.fsdp.sharded_grad_scaler): it all-reduces "
                             "the inf check", framework="fsdp1")
            elif half_params and not plain and not sharded and trains and not m.any_scaler and not told_no_scaler:
                told_no_scaler = True  # one finding for the file, not one per wrapped layer
                yield Hit.at(st.node, f"{st.label} computes in float16 ({st.precision.evidence}) with no loss scaling in "
                                      "this file: small gradients flush to zero",
                             "add `ShardedGradScaler()` (FSDP1) or `torch.amp.GradScaler(\"cuda\")` (FSDP2) with "
                             "scale/step/update, or use `param_dtype=torch.bfloat16`", framework=st.framework)
