"""The page's process count (trace and check under torch.distributed) and the per-rank tables.

The count is bounded by the operator (`--max-nproc`, default 2) and by the host: one rank per
visible GPU when the job runs on GPUs, else one per CPU core. The host's GPUs come from the probe
the page already made in a worker (`host.host_info`), so the server never touches CUDA itself.
"""
from __future__ import annotations

import os

from ..errors import UserError
from . import common
from .server import SETTINGS


def max_processes(device: str = "auto") -> int:
    gpus = [] if (device or "auto") == "cpu" else \
        [d for d in host_devices() if d.startswith("cuda:")]
    return max(1, min(SETTINGS.max_nproc, len(gpus) if gpus else (os.cpu_count() or 1)))


def host_devices() -> list[str]:
    from .host import host_info

    return list(host_info().get("devices") or [])


def parse_nproc(value, device: str = "auto") -> int | None:
    """The processes box -> None (one process, the usual run) or N ranks (UserError past the limit)."""
    try:
        number = float(value if value not in (None, "") else 1)
    except (TypeError, ValueError):
        raise UserError(f"processes must be a whole number, not {value!r}") from None
    if not number.is_integer() or number < 1:
        raise UserError(f"processes must be a whole number from 1, not {value}")
    n = int(number)
    if n == 1:
        return None
    limit = max_processes(device)
    if n > limit:
        raise UserError(f"this server runs at most {limit} processes per job (its --max-nproc, and one per "
                        f"{'GPU' if limit and [d for d in host_devices() if d.startswith('cuda:')] else 'CPU core'}); "
                        f"got {n}")
    return n


def _table(rows: list[list[str]]) -> str:
    head, body = rows[0], rows[1:]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(common.md_escape(str(c)) for c in row) + " |" for row in body]
    return "\n".join(out)


def trace_ranks_markdown(result: dict) -> str:
    """The per-rank table (status, steps, skipped steps, loss scale, where) and the disagreements."""
    from ..trace.merge import rank_table, step_lines

    d = result.get("distributed") or {}
    backend = (d.get("backend") or {}).get("used")
    parts = [f"**{d.get('nproc')} ranks under torch.distributed.run**" + (f" ({backend})" if backend else ""), "",
             _table(rank_table(result))]
    steps = step_lines(result)
    if any("disagree" in s for s in steps):
        parts += ["", "Skip decisions per step (S skipped, . stepped, @ loss scale):", "", "```", *steps, "```"]
    return "\n".join(parts)


def check_ranks_markdown(result: dict) -> str:
    d = result.get("distributed") or {}
    rows = [["rank", "status", "steps", "skipped steps", "loss scale", "own gradients non-finite at"]]
    for r in d.get("ranks") or []:
        rows.append([str(r["rank"]), str(r["status"]) + (f" ({r['error']})" if r.get("error") else ""),
                     str(r["steps"]), ", ".join(map(str, r["skipped_steps"])) or "none",
                     f"{r['final_scale']:g}" if isinstance(r.get("final_scale"), (int, float)) else "-",
                     ", ".join(map(str, r.get("locally_nonfinite_steps") or [])) or "none"])
    red = d.get("reduction") or {}
    pol = d.get("policy") or {}
    lines = [f"**{d.get('nproc')} ranks, {str(d.get('wrap')).upper()}, compute {pol.get('param_dtype')}, reduce "
             f"{pol.get('reduce_dtype')}** ({d.get('backend') or '?'})", "", _table(rows)]
    if red.get("steps"):
        lines += ["", f"Reduction in {red.get('dtype')}: at most {red.get('worst_flushed_share', 0):.2%} of non-zero "
                      f"gradient elements flushed to zero, {red.get('overflowed', 0)} made inf "
                      f"({red.get('measured_at')})."]
    return "\n".join(lines)
