"""AMP153 scaler-state-loaded-on-one-rank."""
from ..analysis import chain_base, func_tail, receiver, text
from ._distributed import inside, is_distributed, rank_ifs
from .base import Hit, Rule

_SHARES = {"broadcast_object_list", "broadcast", "scatter_object_list", "all_gather_object"}


class ScalerStateLoadedOnOneRank(Rule):
    id = "AMP153"
    name = "scaler-state-loaded-on-one-rank"
    severity = "error"
    summary = "`scaler.load_state_dict(...)` inside an `if` that only some ranks take (`if rank == 0:`)."
    why = ("Every rank's GradScaler must hold the same scale. A resumed run that restores it on rank 0 only leaves "
           "the others at 65536: each rank multiplies its loss by a different factor, the all-reduce (or "
           "reduce-scatter) sums gradients scaled differently, and each rank divides the sum by its own scale, so "
           "every rank applies a wrong gradient, and the overflow checks disagree. ShardedGradScaler does not "
           "help: it agrees on found_inf, not on the scale.")
    example_bad = """
if dist.get_rank() == 0:
    ckpt = torch.load("ckpt.pt")
    model.load_state_dict(ckpt["model"])
    scaler.load_state_dict(ckpt["scaler"])
"""
    example_good = """
ckpt = torch.load("ckpt.pt", map_location="cpu")  # on every rank
model.load_state_dict(ckpt["model"])
optimizer.load_state_dict(ckpt["optimizer"])
scaler.load_state_dict(ckpt["scaler"])
"""
    fix = ("Load the scaler state on every rank (read the checkpoint on every rank, or broadcast the state with "
           "`dist.broadcast_object_list` first).")
    known_problems = ("A rank test through a helper (`if is_main_process():`) gives a warning: the helper may be true "
                      "on every rank. A file that broadcasts objects (`broadcast_object_list`) is trusted to share the "
                      "state. Only scalers recognised in this file are judged.")
    references = ("https://pytorch.org/docs/stable/amp.html (GradScaler.load_state_dict)",)

    def check(self, m):
        if not is_distributed(m) or m.calls_named(*_SHARES):
            return
        ifs = rank_ifs(m)
        if not ifs:
            return
        for c in m.calls:
            if func_tail(c) != "load_state_dict" or not m.is_scaler(chain_base(receiver(c))):
                continue
            guard = [(n, kind) for n, kind in ifs if inside(c, n)]
            if not guard:
                continue
            node, kind = guard[-1]  # the innermost rank test
            hit = Hit.at(c, f"`{text(c.func)}(...)` runs only on the ranks where `{text(node.test)}` holds: the other "
                            "ranks keep their initial loss scale, so the ranks scale their losses differently and "
                            "their reduced gradients are wrong")
            yield hit if kind == "compare" else hit.lowered("warning")
