"""Shared queries for the torch.distributed rules (AMP150-AMP154): which wrapper a file uses, where
gradient sync is turned off, which `if` runs on some ranks only, distributed checkpoint saves.

Facts checked in torch 2.13: DDP's `no_sync()` sets `require_backward_grad_sync = False` for the
forwards (and so the backwards) inside it, and the next synchronised backward all-reduces the
accumulated gradients (nn/parallel/distributed.py); FSDP1's `no_sync()` does the same per FSDP
state; FSDP2's `set_requires_gradient_sync(False)` turns the reduce-scatter off until it is set
True again (_fully_shard/_fully_shard.py).
"""
from __future__ import annotations

import ast
import re

from ..analysis import BACKWARD, OPT_STEP, SCALER_STEP, FileModel, func_tail, names_in, tail
from ..lazy_re import lazy

RANK_NAME = lazy(r"(^|_)(local_|global_|node_)?rank$|get_rank$|^rank(_id)?$|is_main_process$|is_master$|"
                       r"main_process$|is_rank_zero$|is_world_process_zero$|is_local_main_process$|^RANK$", re.I)
SYNC_NAMES = {"no_sync", "require_backward_grad_sync", "set_requires_gradient_sync", "require_forward_param_sync"}
REDUCE_CALLS = {"all_reduce", "all_reduce_coalesced", "reduce_scatter", "reduce_scatter_tensor", "all_reduce_multigpu"}


def qual(m: FileModel, call: ast.Call) -> str:
    return m.names.qual(call.func) or ""


def ddp_calls(m: FileModel) -> list[ast.Call]:
    """`DistributedDataParallel(...)` (or an alias such as `DDP(...)`)."""
    return [c for c, q in m.calls_resolving(lambda last: last.endswith("DistributedDataParallel"), ("DDP",))
            if q.endswith("DistributedDataParallel")
            or (func_tail(c) == "DDP" and "DistributedDataParallel" in m.names.alias.get("DDP", ""))]


def mentions_sync_control(m: FileModel) -> bool:
    """The file turns gradient sync off somewhere (no_sync, the DDP flag, FSDP2's setter)."""
    return any(isinstance(n, ast.Attribute) and n.attr in SYNC_NAMES for n in m.nodes) or \
        any(isinstance(n, ast.Name) and n.id in SYNC_NAMES for n in m.nodes)


def reduces_by_hand(m: FileModel) -> bool:
    return bool(m.calls_named(*REDUCE_CALLS))


def unconditional_no_sync(m: FileModel) -> list[ast.With]:
    """`with model.no_sync():` blocks whose item is the plain call of DDP's/FSDP1's method: not
    `a if last else b`, and not a method of the file's own class taking a flag (SpeechBrain's
    `self.no_sync(not should_step)` turns sync off only when asked)."""
    out = []
    for w in m.of_class(ast.With):
        for i in w.items:
            c = i.context_expr
            if isinstance(c, ast.Call) and func_tail(c) == "no_sync" and not c.args and not c.keywords \
                    and not (isinstance(c.func, ast.Attribute) and isinstance(c.func.value, ast.Name)
                             and c.func.value.id == "self"):
                out.append(w)
                break
    return out


def inside(node: ast.AST, block: ast.AST) -> bool:
    return block.lineno <= node.lineno <= getattr(block, "end_lineno", block.lineno)


def unmanaged_backwards(m: FileModel) -> list:
    return [e for s in m.event_scopes for e in s.events if e.kind == BACKWARD and not e.managed]


def steps(m: FileModel) -> list:
    return [e for s in m.event_scopes for e in s.events if e.kind in (OPT_STEP, SCALER_STEP)]


def rank_test(test: ast.AST) -> str | None:
    """'compare' for `rank == 0`-like tests (a rank name compared), 'helper' for `is_main_process()`
    and the like, None when the test does not choose ranks."""
    names = {n for n in names_in(test)} | {tail(n.func) or "" for n in ast.walk(test) if isinstance(n, ast.Call)}
    if not any(RANK_NAME.search(n or "") for n in names):
        return None
    for c in (n for n in ast.walk(test) if isinstance(n, ast.Compare)):
        sides = [c.left, *c.comparators]
        words = {w for side in sides for w in names_in(side)}
        words |= {tail(n.func) or "" for side in sides for n in ast.walk(side) if isinstance(n, ast.Call)}
        if any(RANK_NAME.search(w) for w in words) and any(_literal(s) for s in sides):
            return "compare"
    return "helper"


def _literal(node: ast.AST) -> bool:
    """`0`, or `(-1, 0)` / `{-1, 0}` of literals (YOLO's `RANK in {-1, 0}`)."""
    if isinstance(node, ast.UnaryOp):
        node = node.operand
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return bool(node.elts) and all(_literal(e) for e in node.elts)
    return isinstance(node, ast.Constant)


def rank_ifs(m: FileModel) -> list[tuple[ast.If, str]]:
    """Every `if` whose test chooses ranks, with how plainly it does."""
    return m.memo.get(("rank_ifs",), lambda: [(n, k) for n in m.of_class(ast.If) if (k := rank_test(n.test))])


def is_distributed(m: FileModel) -> bool:
    """The file uses torch.distributed (imports it, wraps a model, starts a process group)."""
    return any("torch.distributed" in q or q.endswith("DistributedDataParallel") for _, _, q in m.names.imports) or \
        bool(m.calls_named("init_process_group", "DDP", "FSDP", "fully_shard"))
