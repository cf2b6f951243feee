"""AMP213, an op CUDA autocast refuses seen running in an enabled autocast region, as a finding,
without torch: `autocast_policy` records the op while its CUDA policy is emulated on a CPU, and
the check and the trace parent (which never imports torch) turn that record into this finding.
"""
from __future__ import annotations

from ..findings import Finding, Location, Severity

BANNED_FINDING = ("AMP213", "autocast-unsafe-op")


def banned_findings(described: dict | None, seen: str | None = None) -> list:
    """AMP213 (error): an op CUDA autocast refuses (`binary_cross_entropy`, `nn.BCELoss`) ran in an
    enabled autocast region; on a GPU that line raises, the emulation ran it in float32 to go on."""
    out = []
    for op, count in ((described or {}).get("banned") or {}).items():
        at = ((described or {}).get("banned_at") or {}).get(op) or {}
        data = {"op": op, "count": count}
        if seen:
            data["seen"] = seen
        out.append(Finding(
            BANNED_FINDING[0], BANNED_FINDING[1], Severity.ERROR,
            f"{op} runs inside an enabled autocast region ({count}x): CUDA autocast refuses it, so on your GPU "
            "this raises RuntimeError ('torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are "
            "unsafe to autocast'); the CPU emulation of CUDA's policy ran it in float32 to go on",
            "Use torch.nn.functional.binary_cross_entropy_with_logits (or nn.BCEWithLogitsLoss) on the logits, "
            "dropping the sigmoid before it; or compute this loss outside autocast on .float() inputs.",
            Location(path=at.get("path"), line=at.get("line")), None, data))
    return out
