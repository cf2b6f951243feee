"""AMP130 framework-grads-before-unscale."""
import ast

from ..analysis import CLIP, FW_CLIP, GRAD, HELPER_OPT_STEP, OPT_STEP, SCALER_STEP, UNSCALE, compatible, func_tail
from ..frameworks import lightning
from ._frameworks import after, framework_backwards, framework_name, is_framework_call, precision_note, severity
from .base import Hit, Rule

_FIX = {
    "accelerate": "clip with `accelerator.clip_grad_norm_(model.parameters(), max_norm)` (it unscales first), or call "
                  "`accelerator.unscale_gradients(optimizer)` before reading or clipping `.grad`",
    "hf_trainer": "let the Trainer clip (`max_grad_norm`), or use `self.accelerator.clip_grad_norm_(...)` after "
                  "`self.accelerator.backward(loss)`",
    "fabric": "clip with `fabric.clip_gradients(model, optimizer, max_norm=...)` (it unscales first)",
    "lightning": "clip in `configure_gradient_clipping` / `Trainer(gradient_clip_val=...)`, or read gradients in "
                 "`on_before_optimizer_step`: Lightning has unscaled them by then",
    "lightning_manual": "under 16-mixed, call `self.trainer.precision_plugin.scaler.unscale_(opt)` before clipping, or "
                        "clip in `on_before_optimizer_step` (it runs inside `opt.step()`, after the unscale)",
    "deepspeed": "set `\"gradient_clipping\"` in the DeepSpeed config: `engine.step()` unscales and clips there",
}


class FrameworkGradsBeforeUnscale(Rule):
    id = "AMP130"
    name = "framework-grads-before-unscale"
    severity = "error"
    summary = ("Gradients clipped, read or logged after a framework's scaled backward (`accelerator.backward`, "
               "`fabric.backward`, `self.manual_backward`, a DeepSpeed engine, Lightning's `on_after_backward`) "
               "before the framework unscaled them.")
    why = ("Under float16 the framework's backward is `scaler.scale(loss).backward()`: until its own unscale "
           "(`accelerator.clip_grad_norm_`/`unscale_gradients`, `fabric.clip_gradients`, Lightning's optimizer "
           "step) every `.grad` is multiplied by the loss scale (65536 at the start). torch's `clip_grad_norm_` "
           "then clips the scaled norm, so the threshold is divided by the scale, and logged gradient norms are "
           "off by it. Lightning calls `on_after_backward` before it unscales (Lightning #4151), and in manual "
           "optimization `self.clip_gradients` runs before the unscale inside `opt.step()` (Lightning #18089, "
           "open in 2.6.6).")
    example_bad = """
accelerator = Accelerator(mixed_precision="fp16")
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    loss = model(**batch).loss
    accelerator.backward(loss)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad()
"""
    example_good = """
accelerator = Accelerator(mixed_precision="fp16")
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    loss = model(**batch).loss
    accelerator.backward(loss)
    accelerator.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad()
"""
    fix = ("Use the framework's clip, which unscales first: `accelerator.clip_grad_norm_`, "
           "`fabric.clip_gradients`, Lightning's `gradient_clip_val` / `configure_gradient_clipping`, DeepSpeed's "
           "`gradient_clipping`; read gradients after the framework's unscale (Lightning: `on_before_optimizer_step`).")
    known_problems = ("An error needs float16 written in the file (`mixed_precision=\"fp16\"`, `precision=\"16-mixed\"`); "
                      "a precision from a default, a config file or the launcher gives a warning that says so, and a "
                      "precision known to be bf16/fp32 gives nothing. A `.grad` read that divides by the scale itself is "
                      "still reported. Clipping in a helper of another file is not seen.")
    references = ("https://huggingface.co/docs/accelerate/usage_guides/gradient_accumulation",
                  "https://github.com/huggingface/accelerate/blob/v1.15.0/src/accelerate/accelerator.py (backward, clip_grad_norm_)",
                  "https://github.com/Lightning-AI/pytorch-lightning/issues/18089",
                  "https://github.com/Lightning-AI/pytorch-lightning/issues/4151")

    def check(self, m):
        seen: set[int] = set()
        for s in m.event_scopes:
            if s.is_eval:
                continue
            for b, setup in framework_backwards(m, s):
                sev = severity(setup)
                if sev is None:
                    continue
                manual = setup.framework == "lightning"
                ends: list = []  # unscales and steps after the backward: they end its scaled gradients
                for e in after(s, b):
                    if e.kind in (OPT_STEP, SCALER_STEP, HELPER_OPT_STEP, UNSCALE) or \
                            (is_framework_call(m, e) and not (manual and e.recv == "self")):
                        ends.append(e)  # accelerator.clip_grad_norm_ / fabric.clip_gradients unscale first
                        continue
                    if e.kind not in (CLIP, GRAD, FW_CLIP) or e.line in seen:
                        continue
                    if any(compatible(x, e) for x in ends):
                        continue  # on this path the gradients were already unscaled (or stepped)
                    if e.kind == GRAD and not value_read(m, s, e.node):
                        continue  # `torch.isnan(p.grad)`, `g = p.grad` then zeroing rows: no value that the scale changes
                    seen.add(e.line)
                    yield self._hit(e, b, setup, sev, "lightning_manual" if manual else setup.framework)
        yield from self._on_after_backward(m, seen)

    def _hit(self, e, b, setup, sev, fix_key):
        what = {CLIP: "clips", FW_CLIP: "`self.clip_gradients` clips", GRAD: "reads `.grad` of"}[e.kind]
        if e.kind == GRAD:
            sev = "warning" if sev else None
        scaled = ("the engine's gradients (scaled under fp16; under ZeRO not in `.grad` at all)"
                  if setup.framework == "deepspeed" else "gradients still multiplied by the loss scale")
        msg = (f"{what} {scaled} after {framework_name(setup)}'s backward on line {b.line}, before the framework "
               f"unscaled them ({precision_note(setup)})")
        if setup.framework == "deepspeed" and sev == "error":
            sev = "warning"
        return Hit(e.line, e.col + 1, msg, _FIX[fix_key], {"framework": setup.framework, "backward_line": b.line},
                   None if sev == self.severity else sev)

    def _on_after_backward(self, m, seen):
        if "on_after_backward" not in m.by_name:
            return  # the only scopes read below: the Lightning classes need not be searched
        classes = lightning.module_classes(m) | lightning.callback_classes(m)
        if not classes:
            return
        setups = lightning.setups(m)
        setup = setups[0] if setups else None
        sev = severity(setup) if setup is not None else "warning"
        if sev is None:
            return
        for s in m.scopes:
            if s.name != "on_after_backward" or s.cls not in classes:
                continue
            reads = [e for e in s.events if e.kind in (CLIP, GRAD, FW_CLIP) and e.line not in seen
                     and (e.kind != GRAD or value_read(m, s, e.node))]
            reads += [_CallEvent(n) for n in m.subtree(s.node)
                      if isinstance(n, ast.Call) and func_tail(n) in {"grad_norm", "grad_norms"}]
            for e in sorted(reads, key=lambda x: x.line):
                if e.line in seen:
                    continue
                seen.add(e.line)
                clip = e.kind in (CLIP, FW_CLIP)
                level = sev if clip else "warning"
                note = precision_note(setup) if setup is not None else "whenever the Trainer runs 16-mixed"
                yield Hit(e.line, e.col + 1,
                          f"{'clips' if clip else 'reads'} gradients in `on_after_backward`, where Lightning has not yet "
                          f"unscaled them ({note})", _FIX["lightning"], {"framework": "lightning"},
                          None if level == self.severity else level)


# Reads of a gradient whose result does not depend on the loss scale (a NaN/inf test, zeroing) ...
_SCALE_FREE = {"isnan", "isinf", "isfinite", "isneginf", "isposinf", "nan_to_num", "fill_", "zero_", "any", "all",
               "is_nonzero", "requires_grad_", "detach_"}
# ... and reads whose value does (norms and statistics, logging them, updating the gradient by hand).
_SCALE_BOUND = {"norm", "abs", "sum", "mean", "max", "min", "std", "var", "pow", "item", "sqrt", "square", "clamp",
                "clamp_", "mul", "mul_", "div", "div_", "add", "add_", "sub", "sub_", "copy_", "dot", "vector_norm",
                "get_total_norm", "log", "log10", "tolist", "numpy", "histc", "abs_", "sign", "topk", "median",
                "quantile", "amax", "amin", "cpu", "float"}


def value_read(m, scope, node) -> bool:
    """The `.grad` read takes a value the loss scale changes: a norm, a statistic, arithmetic, an
    in-place update. A bare reference (`g = p.grad`, `grads.append(p.grad)`), a NaN/inf test or a
    zeroing is not reported."""
    parents = m.memo.get(("amp130_parents", id(scope.node)), lambda: _parents(m, scope.node))
    cur = node
    for _ in range(6):
        parent = parents.get(id(cur))
        if parent is None:
            return False
        if isinstance(parent, ast.Call):
            t = func_tail(parent)
            if t in _SCALE_FREE:
                return False
            if t in _SCALE_BOUND:
                return True
        elif isinstance(parent, ast.Attribute) and parent.attr in _SCALE_FREE:
            return False
        elif isinstance(parent, (ast.BinOp, ast.AugAssign, ast.UnaryOp)):
            return True
        elif isinstance(parent, (ast.stmt, ast.comprehension)) and not isinstance(parent, ast.AugAssign):
            return False
        cur = parent
    return False


def _parents(m, root) -> dict[int, ast.AST]:
    out: dict[int, ast.AST] = {}
    for n in m.subtree(root):
        for child in ast.iter_child_nodes(n):
            out[id(child)] = n
    return out


class _CallEvent:
    """A `grad_norm(...)` call seen as a gradient read."""

    kind = GRAD

    def __init__(self, node):
        self.node, self.line, self.col = node, node.lineno, node.col_offset
