"""What this host has: the header line and the device picker's choices.

Probed once, in a worker process, so the server process never creates a CUDA context
(which would hold GPU memory for the server's whole life and inherit into nothing useful).
"""
from __future__ import annotations

import functools
import logging

from ..errors import UserError

log = logging.getLogger("troubleshooter.app")


def probe_host() -> dict:
    """Runs in the child: the capability summary and the devices a job can target."""
    import torch

    devices = ["auto", "cpu"]
    names = {"cpu": "CPU"}
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            devices.append(f"cuda:{i}")
            names[f"cuda:{i}"] = torch.cuda.get_device_name(i)
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        devices.append("mps")
        names["mps"] = "Apple MPS"
    try:
        from ..engine.capability import detect

        report = detect("auto")
        summary = report.summary_line()
        recommended = getattr(report, "recommended_precision", None)
        capability = report.to_dict()
    except ImportError:
        summary = names.get(devices[2], "CPU (no GPU)") if len(devices) > 2 else "CPU (no GPU)"
        recommended, capability = None, None
    return {"summary": summary, "devices": devices, "device_names": names,
            "recommended_precision": recommended, "capability": capability}


@functools.lru_cache(maxsize=1)
def host_info(timeout_s: float = 120.0) -> dict:
    """Cached host facts; a failed probe yields a readable line instead of breaking the page."""
    from ..worker import run_in_worker

    try:
        return run_in_worker(probe_host, timeout_s=timeout_s)
    except UserError as exc:
        log.warning("host probe failed: %s", exc)
        return {"summary": f"device detection failed: {exc}", "devices": ["auto", "cpu"],
                "device_names": {"cpu": "CPU"}, "recommended_precision": None, "capability": None}


def device_choices() -> list[tuple[str, str]]:
    """(label, value) pairs for a Dropdown: `cuda:0 — NVIDIA H100 ...`."""
    info = host_info()
    out = []
    for dev in info["devices"]:
        label = "auto (best available)" if dev == "auto" else f"{dev} — {info['device_names'].get(dev, dev)}"
        out.append((label, dev))
    return out


def gpu_slots() -> int:
    """How many GPU-bound jobs may run at once: one per accelerator (at least one)."""
    return max(1, sum(1 for d in host_info()["devices"] if d not in ("auto", "cpu")))


def device_key(device: str | None) -> str:
    """The physical device a job will use: `auto` and `cuda` name the first GPU (or the CPU)."""
    device = (device or "auto").strip() or "auto"
    gpus = [d for d in host_info()["devices"] if d not in ("auto", "cpu")]
    if device == "auto":
        return gpus[0] if gpus else "cpu"
    if device == "cuda":
        return next((d for d in gpus if d.startswith("cuda:")), "cuda:0")
    return device


def validate_device(device: str | None) -> str:
    """`device` if this host has it (answered here, before a worker starts), else UserError."""
    device = (device or "auto").strip() or "auto"
    known = host_info()["devices"]
    if device in known or (device == "cuda" and any(d.startswith("cuda:") for d in known)):
        return device
    raise UserError(f"this host has no device {device!r}; it has: {', '.join(known)}")
