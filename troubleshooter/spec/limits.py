"""What a spec may ask for, and the size check that needs no model: torch-free, so the app's server
can refuse an oversized preset before a job is queued without importing torch."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

GiB = 1024 ** 3
DEFAULT_MAX_PARAMS = 2_000_000_000
DEFAULT_MAX_MEMORY_GB = 48.0
ENV_MAX_PARAMS = "TROUBLESHOOTER_MAX_PARAMS"
ENV_MAX_MEMORY_GB = "TROUBLESHOOTER_MAX_MEMORY_GB"


def host_memory_gb() -> float | None:
    """This machine's physical memory in GiB (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GiB
    except (AttributeError, ValueError, OSError):
        return None


def default_memory_gb() -> float:
    """The memory limit without an override: DEFAULT_MAX_MEMORY_GB, but never more than this host
    has (a 48 GiB step on a 23 GiB machine would only swap or be killed)."""
    host = host_memory_gb()
    return min(DEFAULT_MAX_MEMORY_GB, host) if host else DEFAULT_MAX_MEMORY_GB


@dataclass(frozen=True)
class Limits:
    """What a spec may ask for; arguments win over the environment, which wins over the defaults."""

    max_params: float = DEFAULT_MAX_PARAMS
    max_memory_gb: float = DEFAULT_MAX_MEMORY_GB

    @classmethod
    def resolve(cls, max_params: float | None = None, max_memory_gb: float | None = None) -> "Limits":
        def pick(arg, env, default):
            if arg is not None:
                return float(arg)
            raw = os.environ.get(env, "").strip()
            if raw:
                try:
                    return float(raw)
                except ValueError:
                    from ..errors import UserError

                    raise UserError(f"{env}={raw!r} is not a number") from None
            return float(default)

        return cls(pick(max_params, ENV_MAX_PARAMS, DEFAULT_MAX_PARAMS),
                   pick(max_memory_gb, ENV_MAX_MEMORY_GB, default_memory_gb()))


MAX_MODULES = 20_000  # building (even on meta) costs time per module; real models have a few thousand


def check_size(params: int, modules: int, optimizer_floats_per_param: int, limits: Limits) -> list[str]:
    """Reasons to refuse a model from its computed size alone, before building anything: its
    parameters, the memory its weights, gradients and optimizer state need (activations come on
    top), and its module count (what building costs time for)."""
    problems = []
    if params > limits.max_params:
        problems.append(f"the model would have {_count(params)} parameters, over the limit of "
                        f"{human_count(limits.max_params)} (raise it with {ENV_MAX_PARAMS} or max_params=...)")
    need = params * 4 * (2 + optimizer_floats_per_param)
    if need > limits.max_memory_gb * GiB:
        problems.append(f"its weights, gradients and optimizer state alone would need {need / GiB:,.1f} GiB, over "
                        f"the limit of {limits.max_memory_gb:g} GiB (raise it with {ENV_MAX_MEMORY_GB})")
    if modules > MAX_MODULES:
        problems.append(f"the model would have {modules:,} modules (layers), over the {MAX_MODULES:,} this tool "
                        "builds: use fewer layers")
    return problems


def _count(n: float) -> str:
    return human_count(n) if n < 1e15 else f"{n:.1e}"


def human_count(n: float) -> str:
    if n <= 0 or not math.isfinite(n):
        return str(n)
    for unit, size in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:g}"
