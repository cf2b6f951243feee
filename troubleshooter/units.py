"""Numbers for people: one formatter for sizes so every report prints memory the same way."""
from __future__ import annotations


def format_bytes(n: float | None, missing: str = "n/a") -> str:
    """1536 -> '1.5 KiB'; None -> `missing`."""
    if n is None:
        return missing
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)  # unreachable: the loop always returns at TiB
