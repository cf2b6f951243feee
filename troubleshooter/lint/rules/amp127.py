"""AMP127 scaler-never-scales."""
import ast

from ..analysis import BACKWARD, SCALE, UNSCALE, UPDATE, peel, tail, text
from .base import Hit, Rule


class ScalerNeverScales(Rule):
    id = "AMP127"
    needs_events = True
    name = "scaler-never-scales"
    severity = "error"
    summary = ("A GradScaler whose `update()` or `unscale_()` runs although nothing in the file scales a loss with "
               "it (`loss.backward()`, `optimizer.step()`, `scaler.update()`).")
    why = ("A GradScaler gets its scale on the first `scaler.scale(loss)`. `update()` and `unscale_()` on a scaler "
           "that never scaled raise `AssertionError: Attempted update but _scale is None` (or `unscale_`) on the "
           "first training step (torch/amp/grad_scaler.py, checked on torch 2.13; earlier releases assert the "
           "same). They do nothing only where the scaler is off: `enabled=False`, or a \"cuda\" scaler on a "
           "machine without CUDA, which disables itself with a warning.")
    example_bad = """
scaler = torch.amp.GradScaler("cuda")
with torch.autocast("cuda", dtype=torch.float16):
    loss = model(x)
loss.backward()
optimizer.step()
scaler.update()
"""
    example_good = """
scaler = torch.amp.GradScaler("cuda")
with torch.autocast("cuda", dtype=torch.float16):
    loss = model(x)
scaler.scale(loss).backward()
scaler.step(optimizer)
scaler.update()
"""
    fix = ("Scale the loss and step through the scaler: `scaler.scale(loss).backward()`, `scaler.step(optimizer)`, "
           "then `scaler.update()`; with bfloat16 or float32, drop the scaler instead.")
    known_problems = ("Only scalers built with `GradScaler(...)` in this file are judged, and the file is skipped "
                      "when it scales or steps through any scaler (a scaler may travel under two names) or hands "
                      "the scaler to code in another file. A scaler enabled by a flag (`enabled=use_amp`) or built "
                      "only on one branch is reported as a warning: it crashes only when enabled.")
    references = ("https://pytorch.org/docs/stable/amp.html (GradScaler)",
                  "https://pytorch.org/docs/stable/notes/amp_examples.html (Typical mixed precision training)")

    def check(self, m):
        if _scales_anywhere(m) or not any(e.kind == BACKWARD and not e.managed for s in m.event_scopes for e in s.events):
            return
        for key in m.scaler_ctor:
            state = m.scaler_enabled_state(key)
            if key in m.scaler_passed or state == "no":
                continue
            calls = sorted((e for s in m.event_scopes for e in s.of(UPDATE, UNSCALE) if e.recv == key and not e.via_call),
                           key=lambda e: (e.line, e.col))
            if not calls:
                continue
            e = calls[0]
            who = text(e.node.func.value)
            method = "update" if e.kind == UPDATE else "unscale_"
            hit = Hit.at(e.node, f"`{who}.{method}()` runs, but `{who}` never scales a loss in this file (no "
                                 f"`{who}.scale(loss)`): on the first step it raises `AssertionError: Attempted "
                                 f"{method} but _scale is None`, and the backward and optimizer step bypass the scaler",
                         f"use `{who}.scale(loss).backward()` and `{who}.step(optimizer)` before `{who}.update()`, "
                         "or drop the scaler for bfloat16/float32", scaler=key)
            if state == "dynamic" or _built_on_one_branch(m, key):
                hit.message += " (when the scaler is enabled)"
                hit.lowered()
            yield hit


def _scales_anywhere(m) -> bool:
    """Any scaled backward, `*.scale` or scaler `.step` in the file: a scaler may travel under another name."""
    if any(e.kind == SCALE or (e.kind == BACKWARD and e.scaled) for s in m.event_scopes for e in s.events):
        return True
    # a `.step` counts only on a scaler, and no name of a file with no scaler name (`may_hold_scaler`) is one
    looked_for = {"scale", "step"} if m.may_hold_scaler else {"scale"}
    attributes = m.of_class(ast.Attribute) if any(map(m.may_name, looked_for)) else ()
    for n in [n for n in attributes if n.attr in looked_for]:  # picked at C speed, in walk order
        base = tail(n.value) or ""
        if n.attr == "scale" and ("scal" in base.lower() or m.is_scaler(base)):
            return True
        if n.attr == "step" and m.is_scaler(base):
            return True  # step through a scaler with no scale: AMP115 reports the unscaled backward
    return False


def _built_on_one_branch(m, key: str) -> bool:
    """`scaler = GradScaler() if use_amp else None`: the scaler exists only in one configuration."""
    return any(isinstance(peel(v), ast.IfExp) for v in m.assigns.get(key, []))
