"""AMP151 ddp-accumulation-without-no-sync."""
from ..analysis import text
from ._distributed import ddp_calls, mentions_sync_control
from ._steps import accumulations
from .base import Hit, Rule


class DdpAccumulationWithoutNoSync(Rule):
    id = "AMP151"
    needs_events = True
    name = "ddp-accumulation-without-no-sync"
    severity = "warning"
    summary = ("Gradient accumulation on a DDP model where no micro-step runs under `model.no_sync()`: every "
               "micro-batch's backward all-reduces the gradients.")
    why = ("DDP all-reduces in backward unless `no_sync()` is active. Accumulating over N micro-batches without it "
           "costs N full all-reduces per optimizer step where one is enough (the last, which reduces the "
           "accumulated sum), and under float16 each of them moves scaled gradients that the next micro-batch "
           "adds to. The result is the same; the communication is N times what it needs to be.")
    example_bad = """
model = DDP(model)
for i, (x, y) in enumerate(loader):
    with torch.autocast("cuda", dtype=torch.float16):
        loss = loss_fn(model(x), y) / accum_steps
    scaler.scale(loss).backward()
    if (i + 1) % accum_steps == 0:
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
"""
    example_good = """
model = DDP(model)
for i, (x, y) in enumerate(loader):
    last = (i + 1) % accum_steps == 0
    with model.no_sync() if not last else contextlib.nullcontext():
        with torch.autocast("cuda", dtype=torch.float16):
            loss = loss_fn(model(x), y) / accum_steps
        scaler.scale(loss).backward()
    if last:
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
"""
    fix = ("Run the micro-batches before the last under `with model.no_sync():` (the forward and the backward), and "
           "the last one without it.")
    known_problems = ("Only a DDP wrapper built in this file is seen; a file that mentions `no_sync`, "
                      "`require_backward_grad_sync` or `set_requires_gradient_sync` anywhere is trusted to handle it. "
                      "FSDP is not reported: its `no_sync()` keeps unsharded gradients, a memory trade-off.")
    references = ("https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html (no_sync)",)

    def check(self, m):
        if not ddp_calls(m) or mentions_sync_control(m):
            return
        for s in m.event_scopes:
            for acc in accumulations(s):
                bw = next((b for b in acc.backwards if not b.managed), None)
                if bw is None:
                    continue
                n = text(acc.count) if acc.count is not None else "N"
                yield Hit.at(bw.node, f"gradients are accumulated over `{n}` micro-batches of a DDP model without "
                                      "`no_sync()`: every micro-batch's backward all-reduces them, where only the last "
                                      "one needs to")
