"""Which of the child's non-finite events count, without torch: the child (`numerics`) decides
with it when to stop re-checking steps, and the parent (`analysis`) which event its finding is
about; the parent never imports torch.
"""
from __future__ import annotations


def is_real(event: dict) -> bool:
    """Not a GradScaler calibration skip: the forward or the loss itself went non-finite."""
    return not event.get("skipped") or event.get("forward") is not None or isinstance(event.get("loss"), str)
