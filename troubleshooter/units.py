"""Numbers for people: one formatter per unit so every report prints memory and time the same way."""
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


def format_seconds(s: float) -> str:
    """2.04 -> '2.0 s', 0.18 -> '0.18 s', 0.004 -> '4 ms': a short time never reads as '0 s'."""
    if s >= 1:
        return f"{s:.1f} s"
    if s >= 0.1:
        return f"{s:.2f} s"
    return f"{s * 1000:.0f} ms"
