"""AMP113 step-without-update."""
import ast

from ..analysis import SCALE, SCALER_STEP, UPDATE, text
from .base import Hit, Rule


class StepWithoutUpdate(Rule):
    id = "AMP113"
    name = "step-without-update"
    severity = "error"
    summary = "`scaler.step()` without `scaler.update()` (or `update()` without `step()`)."
    why = ("`scaler.update()` adjusts the scale and resets the per-step state. Without it the scale never grows "
           "or backs off, and the next `unscale_`/`step` in the same scaler state raises or reuses stale inf "
           "checks; `update()` without `step()` means the optimizer never steps through the scaler.")
    example_bad = """
scaler.scale(loss).backward()
scaler.step(optimizer)
optimizer.zero_grad()
"""
    example_good = """
scaler.scale(loss).backward()
scaler.step(optimizer)
scaler.update()
optimizer.zero_grad()
"""
    fix = "Call `scaler.update()` once per iteration, right after `scaler.step(optimizer)`."

    known_problems = "A scaler handed to code in another file may be updated there; such scalers are skipped. Loss scalers that are not torch's GradScaler (fairseq's DynamicLossScaler, Megatron's) are recognised by their constructor and left alone."
    fix_safety = 'Safe: `scaler.update()` is inserted after a `scaler.step(...)` statement on its own line.'
    references = ('https://pytorch.org/docs/stable/notes/amp_examples.html (Typical mixed precision training)',)

    def apply_fix(self, fixer, hit) -> bool:
        call = fixer.node(hit, ast.Call)
        if call is None or getattr(call.func, "attr", None) != "step" or not isinstance(call.func, ast.Attribute):
            return False
        st = fixer.own_line_stmt(call)
        if st is None or not isinstance(st, ast.Expr) or st.value is not call:
            return False
        pos = fixer.src.line_end(st.end_lineno)  # at the end of the step's line: it stays in its notebook cell
        newline = fixer.src.newline(st.end_lineno)
        return fixer.add(pos, pos, f"{newline}{fixer.src.indent(st.lineno)}{text(call.func.value)}.update()")

    def check(self, m):
        by_key: dict[str, dict[str, list]] = {}
        for s in m.event_scopes:
            for e in s.of(SCALER_STEP, UPDATE, SCALE):
                if e.via_call or not e.recv:
                    continue
                by_key.setdefault(e.recv, {}).setdefault(e.kind, []).append(e)
        # A scaler may travel under two names (`self.grad_scaler` here, a `scaler` argument there):
        # only a file with no update (or no step) on any scaler at all is certainly wrong.
        any_update = any(kinds.get(UPDATE) for kinds in by_key.values())
        any_step = any(kinds.get(SCALER_STEP) for kinds in by_key.values())
        for key, kinds in by_key.items():
            if key in m.scaler_passed or not m.scaler_enabled(key):
                continue
            steps = kinds.get(SCALER_STEP, []) if not any_update else []
            updates = kinds.get(UPDATE, []) if not any_step else []
            if steps and not updates:
                e = steps[0]
                yield Hit.at(e.node, f"`{key}.step()` is never followed by `{key}.update()`: the loss scale never "
                                     "adapts", f"add `{key}.update()` right after this line", scaler=key)
            elif updates and not steps and kinds.get(SCALE):
                e = updates[0]
                yield Hit.at(e.node, f"`{key}.update()` without `{key}.step(optimizer)`: the optimizer steps on "
                                     "scaled gradients", f"replace `optimizer.step()` by `{key}.step(optimizer)`")
