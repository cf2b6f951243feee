"""The rules for a `check` run's options, without torch: the app's server validates a request
with them before a worker starts (importing torch there cost the page's first check 3.4 s on a
busy host, and the server process stays torch-free), and `engine.check` applies the same ones."""
from __future__ import annotations

from typing import Any, Iterable

from ..errors import UserError

CHECKS = ("capability", "alignment", "skiprate", "nan", "headroom")
DEFAULT_STEPS = 20
MAX_STEPS = 10000
# The first answer (CLI, page and API default): capability, alignment, headroom and NaN answer in
# seconds on a busy 2-core CPU; what does not fit is listed in `budget.cut`, with how to ask for more.
FIRST_ANSWER_BUDGET_S = 9.0
MAX_BUDGET_S = 24 * 3600.0
POLICIES = ("cuda", "host")  # autocast op lists on a CPU host (engine.autocast_policy)


def parse_only(only: str | Iterable[str] | None) -> list[str]:
    """'alignment,nan' (or a list) -> the checks in CHECKS order; None -> all of them."""
    if only is None:
        return list(CHECKS)
    parts = only.split(",") if isinstance(only, str) else list(only)
    names = [p.strip().lower() for p in parts if p and p.strip()]
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        raise UserError(f"unknown check(s) {', '.join(unknown)}: choose from {', '.join(CHECKS)}")
    if not names:
        raise UserError(f"--only names no check: choose from {', '.join(CHECKS)}")
    return [c for c in CHECKS if c in names]


def check_steps(steps: Any) -> None:
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS:
        raise UserError(f"--steps must be a whole number from 1 to {MAX_STEPS}, got {steps!r}")


def check_budget(budget_s: Any) -> None:
    if budget_s is None:
        return
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or not 0 < budget_s <= MAX_BUDGET_S:
        raise UserError(f"--budget must be a number of seconds above 0 and at most {MAX_BUDGET_S:g}, got {budget_s!r}")


def check_policy(name: str | None) -> str:
    """'cuda' (the default: answers for the user's GPU) or 'host' (CPU autocast's own lists)."""
    value = (name or "cuda").strip().lower()
    if value not in POLICIES:
        raise UserError(f"unknown autocast policy {name!r}: use cuda (emulate a GPU's autocast on a CPU host, "
                        "the default) or host (the CPU's own autocast, for training on CPUs)")
    return value


def validated(device: str, only: str | Iterable[str] | None, steps: Any, budget_s: Any,
              autocast_policy: str) -> dict[str, Any]:
    """The run's `check_source` keyword arguments once every rule but the device's holds (the
    caller resolves the device: the engine with torch, the server from its host probe)."""
    selected = parse_only(only)
    check_steps(steps)
    check_budget(budget_s)
    return {"device": device, "only": selected, "steps": steps, "budget_s": budget_s,
            "autocast_policy": check_policy(autocast_policy)}
