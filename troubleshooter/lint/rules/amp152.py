"""AMP152 gradients-never-synchronised."""
from ..analysis import func_tail, is_false
from ._distributed import inside, reduces_by_hand, steps, unconditional_no_sync, unmanaged_backwards
from .base import Hit, Rule

class GradientsNeverSynchronised(Rule):
    id = "AMP152"
    name = "gradients-never-synchronised"
    severity = "error"
    summary = ("Every backward of the file runs inside `with model.no_sync():` (or FSDP2's "
               "`set_requires_gradient_sync(False)` is never undone), yet the optimizer steps: the gradients are "
               "never reduced across ranks.")
    why = ("`no_sync()` only postpones the all-reduce to the next backward that runs without it. When there is no "
           "such backward, each rank steps on its own gradients: the replicas drift apart from the first step, each "
           "rank's GradScaler checks different gradients (they disagree on skipping), and the run silently trains "
           "N different models.")
    example_bad = """
for i, (x, y) in enumerate(loader):
    with model.no_sync():
        loss = loss_fn(model(x), y) / accum_steps
        loss.backward()
    if (i + 1) % accum_steps == 0:
        optimizer.step()
        optimizer.zero_grad()
"""
    example_good = """
for i, (x, y) in enumerate(loader):
    last = (i + 1) % accum_steps == 0
    with model.no_sync() if not last else contextlib.nullcontext():
        loss = loss_fn(model(x), y) / accum_steps
        loss.backward()
    if last:
        optimizer.step()
        optimizer.zero_grad()
"""
    fix = ("Leave the last micro-batch before `optimizer.step()` outside `no_sync()` (or call "
           "`set_requires_gradient_sync(True)` before its backward): that backward reduces the accumulated gradients.")
    known_problems = ("Only backwards written in this file count: one in a helper called outside `no_sync()` is not "
                      "seen as synchronising, so the file is then not reported (a miss rather than a false error). "
                      "A file that all-reduces gradients itself (`dist.all_reduce`) is not reported.")
    references = ("https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html (no_sync)",
                  "https://github.com/pytorch/pytorch/blob/v2.13.0/torch/distributed/fsdp/_fully_shard/_fully_shard.py")

    def check(self, m):
        backwards = unmanaged_backwards(m)
        if not backwards or not steps(m) or reduces_by_hand(m):
            return
        blocks = unconditional_no_sync(m)
        if blocks and all(any(inside(b.node, w) for w in blocks) for b in backwards):
            first = min(blocks, key=lambda w: w.lineno)
            yield Hit(first.lineno, first.col_offset + 1,
                      "every backward in this file runs under `no_sync()`, so the optimizer steps on gradients that "
                      "were never all-reduced: each rank trains its own copy")
            return
        setters = [c for c in m.calls if func_tail(c) == "set_requires_gradient_sync"]
        if setters and all(c.args and is_false(c.args[0]) for c in setters):
            c = setters[0]
            yield Hit.at(c, "`set_requires_gradient_sync(False)` is never undone in this file: FSDP2 never "
                            "reduce-scatters the gradients, each rank steps on its own")

