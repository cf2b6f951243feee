"""AMP131 framework-unscale-twice."""
import ast

from ..analysis import CLIP, FW_CLIP, HELPER_OPT_STEP, OPT_STEP, SCALER_STEP, compatible, func_tail, receiver, tail, text
from .. import frameworks
from ._frameworks import framework_keys, framework_name, is_framework_call, precision_note, severity
from ._steps import accumulations
from .base import Hit, Rule

_UNSCALING = {"clip_grad_norm_", "clip_grad_value_", "unscale_gradients", "clip_gradients"}


def _sync_guarded(e) -> bool:
    return any("sync_grad" in text(g.node.test) for g in e.guards) or \
        any("sync_grad" in k for _, _, k, _ in e.branches)


class FrameworkUnscaleTwice(Rule):
    id = "AMP131"
    needs_events = True
    name = "framework-unscale-twice"
    severity = "error"
    summary = ("A framework's unscale or clip (`accelerator.clip_grad_norm_`, `accelerator.unscale_gradients`, "
               "`fabric.clip_gradients`) runs more than once per optimizer step: on every micro-batch of a "
               "gradient-accumulation loop, or twice in one step.")
    why = ("Each of these calls `scaler.unscale_(optimizer)`. Until the optimizer steps (and the scaler updates) "
           "a second call raises \"unscale_() has already been called on this optimizer since the last update()\" "
           "under float16. Inside `with accelerator.accumulate(model):` the prepared optimizer only steps when "
           "`accelerator.sync_gradients` is True, so a clip on every micro-batch fails on the second one "
           "(accelerate issue #641); clipping partial, not yet synchronised gradients is wrong in any precision "
           "(diffusers PR #721).")
    example_bad = """
accelerator = Accelerator(mixed_precision="fp16", gradient_accumulation_steps=4)
for batch in loader:
    with accelerator.accumulate(model):
        accelerator.backward(model(**batch).loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
"""
    example_good = """
accelerator = Accelerator(mixed_precision="fp16", gradient_accumulation_steps=4)
for batch in loader:
    with accelerator.accumulate(model):
        accelerator.backward(model(**batch).loss)
        if accelerator.sync_gradients:
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
"""
    fix = ("Clip once per optimizer step: under `if accelerator.sync_gradients:` (Accelerate), inside the branch "
           "that steps the optimizer (Fabric, manual accumulation), and do not call `unscale_gradients` before "
           "`clip_grad_norm_` (it unscales itself).")
    known_problems = ("An error needs float16 and an accumulation count above 1 written in the file; a count or "
                      "precision from arguments or a launcher config gives a warning. Clipping in a helper of another "
                      "file is not seen.")
    references = ("https://github.com/huggingface/accelerate/issues/641",
                  "https://github.com/huggingface/diffusers/pull/721",
                  "https://pytorch.org/docs/stable/amp.html (GradScaler.unscale_)")

    def check(self, m):
        if not frameworks.of(m, "accelerate", "fabric", "hf_trainer"):
            return
        for s in m.event_scopes:
            clips = [e for e in s.of(FW_CLIP, CLIP) if is_framework_call(m, e) and func_tail(e.node) in _UNSCALING
                     and e.recv != "self"]
            if not clips:
                continue
            reported: set[int] = set()
            accumulate_blocks = self._accumulate_blocks(m, s)
            micro = accumulations(s)
            for e in clips:
                setup = frameworks.owner(m, e.recv, s)
                if setup is None or e.line in reported:
                    continue
                sev = severity(setup)
                if sev is None:
                    continue
                block = next((w for w in accumulate_blocks if w.lineno <= e.line <= w.end_lineno), None)
                if block is not None and not _sync_guarded(e):
                    accum = setup.data.get("accum")
                    if accum is not None and accum.certain and accum.options == (1,):
                        continue  # accumulate() with one step per optimizer step: nothing accumulates
                    certain = accum is not None and accum.certain and sev == "error"
                    reported.add(e.line)
                    yield self._hit(e, setup, "error" if certain else "warning",
                                    f"runs on every micro-batch of `with {text(block.items[0].context_expr)}:` "
                                    f"(line {block.lineno}) but the optimizer steps only when gradients sync")
                    continue
                acc = None if _sync_guarded(e) else next(
                    (a for a in micro if a.per_micro(e) or (a.kind == "guard" and e.loops == a.backwards[0].loops
                                                            and all(g.node is not a.node for g in e.guards))), None)
                if acc is not None:
                    reported.add(e.line)
                    yield self._hit(e, setup, sev, f"runs on every micro-batch while the optimizer steps once per "
                                                   f"accumulation (line {acc.node.lineno})")
                    continue
                prior = [c for c in clips if c.order < e.order and compatible(c, e) and c.loops == e.loops
                         and not any(x.kind in (OPT_STEP, SCALER_STEP, HELPER_OPT_STEP) and c.order < x.order < e.order
                                     for x in s.events)]
                if prior and frameworks.owner(m, prior[-1].recv, s) is setup:
                    reported.add(e.line)
                    yield self._hit(e, setup, sev, f"unscales again after `{func_tail(prior[-1].node)}` on line "
                                                   f"{prior[-1].line} with no optimizer step in between")

    def _accumulate_blocks(self, m, s) -> list[ast.With]:
        out = []
        for n in m.subtree(s.node):
            if isinstance(n, (ast.With, ast.AsyncWith)):
                for item in n.items:
                    c = item.context_expr
                    if isinstance(c, ast.Call) and func_tail(c) == "accumulate" and receiver(c) is not None \
                            and ("accelerat" in (tail(receiver(c)) or "").lower() or tail(receiver(c)) in framework_keys(m)):
                        out.append(n)
        return out

    def _hit(self, e, setup, sev, where):
        call = func_tail(e.node)
        return Hit(e.line, e.col + 1,
                   f"`{text(e.node.func)}` unscales the gradients (`scaler.unscale_`) and {where}: under float16 the "
                   "second call raises \"unscale_() has already been called on this optimizer since the last update()\" "
                   f"({framework_name(setup)}; {precision_note(setup)})",
                   "clip once per optimizer step: under `if accelerator.sync_gradients:`" if setup.framework in
                   ("accelerate", "hf_trainer") else "clip once per optimizer step, in the branch that steps the optimizer",
                   {"framework": setup.framework, "call": call}, None if sev == self.severity else sev)
