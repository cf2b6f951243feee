"""What this host has: the header line and the device picker's choices.

Probed once, in a worker process, so the server process never creates a CUDA context
(which would hold GPU memory for the server's whole life and inherit into nothing useful).
"""
from __future__ import annotations

import concurrent.futures
import json
import logging
import threading

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
    info = {"summary": summary, "devices": devices, "device_names": names,
            "recommended_precision": recommended, "capability": capability}
    # Plain JSON types only: unpickling a torch object (the capability's TorchVersion) in the
    # server would import torch there, 1.5 s and 180 MiB for a header line.
    return json.loads(json.dumps(info, default=str))


_PROBE: concurrent.futures.Future | None = None
_PROBE_LOCK = threading.Lock()


def start_probe(timeout_s: float = 120.0) -> None:
    """Start probing this host now, in the background: the server calls it before importing
    gradio, so the probe's worker (a Python importing torch) runs beside that import instead
    of after it, and the page is built without waiting for it."""
    global _PROBE
    with _PROBE_LOCK:
        if _PROBE is None:
            _PROBE = concurrent.futures.Future()
            threading.Thread(target=_probe_into, args=(_PROBE, timeout_s), name="host-probe", daemon=True).start()


def _probe_into(future: concurrent.futures.Future, timeout_s: float) -> None:
    from ..worker import run_in_worker

    try:
        future.set_result(run_in_worker(probe_host, timeout_s=timeout_s))
    except UserError as exc:
        log.warning("host probe failed: %s", exc)
        future.set_result({"summary": f"device detection failed: {exc}", "devices": ["auto", "cpu"],
                           "device_names": {"cpu": "CPU"}, "recommended_precision": None, "capability": None})
    except BaseException as exc:  # noqa: BLE001 - whoever waits must not wait forever
        future.set_exception(exc)


def host_info(timeout_s: float = 120.0) -> dict:
    """Cached host facts (probed once per process); a failed probe yields a readable line instead
    of breaking the page."""
    start_probe(timeout_s)
    return _PROBE.result()


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
