"""AMP101 clip-before-unscale."""
import ast

from ..analysis import BACKWARD, CLIP, SCALER_STEP, UNSCALE, compatible, text
from ._steps import scaler_key_for
from .base import Hit, Rule


def optimizer_text(scope) -> str | None:
    """The optimizer the scaler steps in this scope, when there is exactly one."""
    opts = {text(e.arg) for e in scope.of(SCALER_STEP, UNSCALE) if e.arg is not None and not e.via_call}
    return opts.pop() if len(opts) == 1 else None


class ClipBeforeUnscale(Rule):
    id = "AMP101"
    needs_events = True
    name = "clip-before-unscale"
    severity = "error"
    summary = "Gradient clipping after `scaler.scale(loss).backward()` without `scaler.unscale_(optimizer)` first."
    why = ("After a scaled backward the gradients are multiplied by the loss scale (65536 at the start). "
           "`clip_grad_norm_` then measures and clips the scaled norm, so the threshold is effectively divided "
           "by the scale: clipping either never happens or crushes every update.")
    example_bad = """
scaler.scale(loss).backward()
torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
scaler.step(optimizer)
scaler.update()
"""
    example_good = """
scaler.scale(loss).backward()
scaler.unscale_(optimizer)
torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
scaler.step(optimizer)
scaler.update()
"""
    fix = "Call `scaler.unscale_(optimizer)` right before clipping; `scaler.step` then knows not to unscale again."

    known_problems = "A clip in a helper defined in another file, or inside a framework's optimizer wrapper, is not seen. When the scaled backward and the clip sit in different methods the rule reports only if no caller unscales first."
    fix_safety = "Safe: `scaler.unscale_(optimizer)` is inserted on the line before the clip only when the optimizer's name is known and the clip is a statement on its own line."
    references = ('https://pytorch.org/docs/stable/notes/amp_examples.html (Gradient clipping)', 'https://pytorch.org/docs/stable/amp.html (GradScaler.unscale_)')

    def apply_fix(self, fixer, hit) -> bool:
        call = fixer.node(hit, ast.Call)
        opt = hit.data.get("optimizer_known")
        scaler = hit.data.get("scaler")
        if call is None or not opt or not scaler:
            return False
        st = fixer.own_line_stmt(call)
        if st is None:
            return False
        pos = fixer.src.line_start(st.lineno)
        return fixer.add(pos, pos, f"{fixer.src.indent(st.lineno)}{scaler}.unscale_({opt})\n")

    def check(self, m):
        yield from self._same_scope(m)
        yield from self._step_helper(m)

    def _step_helper(self, m):
        """`def step(self): clip(...); self.scaler.step(opt)` with the scaled backward in another method."""
        if not any(e.kind == BACKWARD and e.scaled and not e.managed for s in m.event_scopes for e in s.events):
            return
        for s in m.event_scopes:
            if s.of(BACKWARD):
                continue
            steps = [e for e in s.of(SCALER_STEP) if not e.via_call and m.scaler_enabled(e.recv)]
            for c in s.of(CLIP):
                if not any(st.order > c.order and compatible(c, st) for st in steps):
                    continue
                if any(e.kind in (UNSCALE, SCALER_STEP) and e.order < c.order for e in s.events):
                    continue
                if any(caller.of(UNSCALE) for caller in m.callers(s)):
                    continue
                scaler = scaler_key_for(s, m)
                known = optimizer_text(s)
                yield Hit.at(c.node, f"gradients are clipped before `{scaler}.step()` without `{scaler}.unscale_(...)`: "
                                     "they are still scaled from the scaled backward",
                             f"add `{scaler}.unscale_({known or 'optimizer'})` on the line before the clip",
                             scaler=scaler, optimizer=known or "optimizer", optimizer_known=known)

    def _same_scope(self, m):
        for s in m.event_scopes:
            bws = [e for e in s.events if e.kind == BACKWARD and e.scaled and not e.managed
                   and m.scaler_enabled(e.recv)]
            for c in s.of(CLIP):
                prior = [b for b in bws if b.order < c.order and compatible(b, c)]
                if not prior:
                    continue
                b = prior[-1]
                if any(e.kind in (UNSCALE, SCALER_STEP) and b.order < e.order < c.order for e in s.events):
                    continue
                scaler = scaler_key_for(s, m)
                known = optimizer_text(s)
                opt = known or "optimizer"
                yield Hit.at(c.node, f"gradients are clipped while still scaled (scaled backward on line {b.line}, "
                                     f"no `{scaler}.unscale_(...)` before this clip)",
                             f"add `{scaler}.unscale_({opt})` on the line before the clip",
                             scaler=scaler, optimizer=opt, optimizer_known=known)
