"""What the suite ran on (GPU, driver, CUDA, torch, date), and bringing gradio/pydantic as wheels.

The device machine has torch but neither gradio nor pydantic, and no network: bench/fetch_wheels.sh
downloads their wheels here into bench/wheels/ (git-ignored), the device call carries that folder,
and `bring_packages` installs them with `pip install --no-index --target` into a scratch folder
put first on sys.path (and PYTHONPATH, for the app server and its workers). This module imports
no torch at import time: the wheels must be on the path before anything imports typing_extensions.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WHEELS_DIR = ROOT / "bench" / "wheels"
NEEDED = ("gradio", "gradio_client", "pydantic")  # what the device lacks; the app section needs all three
REPORTED = ("gradio", "gradio_client", "pydantic", "transformers", "matplotlib", "numpy")
SMI_FIELDS = "index,name,driver_version,memory.total,compute_cap"


def missing_packages(names=NEEDED) -> list[str]:
    return [n for n in names if importlib.util.find_spec(n) is None]


def bring_packages(wheels_dir: Path | None, site_dir: Path) -> dict:
    """Install the wheels for what is missing (no index, no deps: the folder is the whole set) into
    `site_dir` and put it first on the path. Says what it did; never raises."""
    missing = missing_packages()
    info = {"missing_before": missing, "wheels_dir": str(wheels_dir) if wheels_dir else None, "installed_to": None}
    if not missing:
        info["source"] = "already installed"
        return info
    wheels = sorted(Path(wheels_dir).glob("*.whl")) if wheels_dir and Path(wheels_dir).is_dir() else []
    if not wheels:
        info["source"] = None
        info["how"] = ("no wheels: run `bash bench/fetch_wheels.sh` where pip reaches PyPI and carry bench/wheels "
                       "(docs/gpu_suite.md); the app section is skipped and YAML specs cannot be read without them")
        return info
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
           "--upgrade", "--target", str(site_dir), *map(str, wheels)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        info["source"] = None
        info["error"] = (proc.stderr.strip().splitlines() or [f"pip exited {proc.returncode}"])[-1]
        return info
    use_site(site_dir)
    info.update(source="wheels", installed_to=str(site_dir), wheels=len(wheels),
                missing_after=missing_packages())
    return info


def use_site(site_dir: Path) -> None:
    """`site_dir` first for this process and for every child it starts (app server, workers)."""
    site = str(site_dir)
    if site not in sys.path:
        sys.path.insert(0, site)
    os.environ["PYTHONPATH"] = os.pathsep.join([site, *filter(None, [os.environ.get("PYTHONPATH")])])
    importlib.invalidate_caches()


def package_versions(names=REPORTED) -> dict[str, str | None]:
    out = {}
    for n in names:
        try:
            out[n] = importlib.metadata.version(n)
        except importlib.metadata.PackageNotFoundError:
            out[n] = None
    return out


# ---------------------------------------------------------------- nvidia-smi


def parse_smi_csv(text: str, fields: str = SMI_FIELDS) -> list[dict]:
    """`nvidia-smi --query-gpu=FIELDS --format=csv,noheader,nounits` output -> one dict per GPU."""
    keys = [f.strip() for f in fields.split(",")]
    gpus = []
    for line in text.strip().splitlines():
        values = [v.strip() for v in line.split(",")]
        if len(values) != len(keys):
            continue
        gpus.append({k: (None if v in ("[N/A]", "N/A", "[Not Supported]") else v) for k, v in zip(keys, values)})
    return gpus


def parse_smi_cuda_version(text: str) -> str | None:
    """The 'CUDA Version: 13.0' of nvidia-smi's banner: the newest CUDA the driver supports."""
    m = re.search(r"CUDA Version:\s*([\d.]+)", text)
    return m.group(1) if m else None


def nvidia_smi(run=subprocess.run) -> dict:
    """What nvidia-smi says, or why it could not be asked (None fields where a query failed)."""
    if shutil.which("nvidia-smi") is None and run is subprocess.run:
        return {"available": False, "reason": "nvidia-smi not found", "gpus": []}
    out: dict = {"available": True, "gpus": [], "cuda_version": None}
    for fields in (SMI_FIELDS, SMI_FIELDS.replace(",compute_cap", "")):  # compute_cap needs a newer driver
        try:
            proc = run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                       capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return {"available": False, "reason": f"{type(exc).__name__}: {exc}", "gpus": []}
        if proc.returncode == 0:
            out["gpus"] = parse_smi_csv(proc.stdout, fields)
            break
        out["query_error"] = proc.stderr.strip() or proc.stdout.strip()
    try:
        banner = run(["nvidia-smi"], capture_output=True, text=True, timeout=30)
        out["cuda_version"] = parse_smi_cuda_version(banner.stdout)
    except (OSError, subprocess.TimeoutExpired):
        pass
    return out


# ---------------------------------------------------------------- the environment


def _git_commit() -> str | None:
    try:
        proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                           capture_output=True, text=True, timeout=10).stdout.strip()
    return proc.stdout.strip() + (" (with uncommitted changes)" if dirty else "")


def environment(smi: dict, packages: dict) -> dict:
    """GPU model, driver, CUDA (the torch build's runtime and what the driver supports), torch,
    Python, CPU, date and commit: the header every table of the run is read against."""
    import torch

    from troubleshooter.engine.cpu_features import cpu_features

    gpus = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            gpus.append({"index": i, "name": p.name, "compute_capability": f"{p.major}.{p.minor}",
                         "memory_gib": round(p.total_memory / 2**30, 1), "multiprocessors": p.multi_processor_count})
    driver_cuda = None
    if torch.cuda.is_available():
        try:
            v = torch._C._cuda_getDriverVersion()  # e.g. 13000
            driver_cuda = f"{v // 1000}.{(v % 1000) // 10}"
        except Exception:  # noqa: BLE001 - a private call: its absence only loses one cell
            driver_cuda = None
    smi_gpus = smi.get("gpus") or []
    return {
        "gpus": gpus, "gpu_count": len(gpus),
        "driver": smi_gpus[0].get("driver_version") if smi_gpus else None,
        "cuda_runtime": torch.version.cuda, "cuda_driver": smi.get("cuda_version") or driver_cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "torch": torch.__version__, "python": platform.python_version(),
        "cpu": cpu_features().get("model"), "cpu_count": os.cpu_count(), "platform": platform.platform(),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": _git_commit(), "nvidia_smi": smi,
        "packages": package_versions(), "packages_source": packages.get("source"),
        "wheels": packages,
    }
