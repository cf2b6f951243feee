"""Check tab: run the diagnostics on a model in a worker; inspect a checkpoint; probe the device."""
from __future__ import annotations

import copy
import functools
import json

from ..errors import UserError
from . import common, host, jobs, specinput
from .ranks import check_ranks_markdown, parse_nproc
from .server import SETTINGS

from ..engine.check_options import CHECKS as CHECK_NAMES  # torch-free: the server never imports torch
CHECK_LABELS = {"capability": "GPU capability", "alignment": "tensor-core alignment",
                "skiprate": "fp16 skip rate", "nan": "NaN/Inf localisation", "headroom": "overflow/underflow headroom"}
MAX_UI_STEPS = 2000  # the page's number box; the engine's own limit applies to the API
DEFAULT_UI_BUDGET_S = 8.0  # the first answer: the CLI's 9 s less the page's round trip (queue, worker, the report back)
MIN_UI_BUDGET_S = 5.0  # the page's number box
# the page's choice of autocast policy on a CPU host (engine.autocast_policy)
AUTOCAST_POLICY_CHOICES = [("CUDA's (answers for your GPU)", "cuda"), ("this CPU's own (training on CPUs)", "host")]
CHECKPOINT_KINDS = (".pt", ".pth", ".bin", ".ckpt", ".tar", ".safetensors")


# ---------------------------------------------------------------- page values -> engine options
# Only parsing into types and the server's own limit here: which values are valid is the
# engine's rule (`engine.check.check_options`), asked before a worker starts.


def _number(value, what: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UserError(f"{what} must be a number, not {value!r}") from None
    return number


def _steps(steps):
    """The steps box (a float from a Number component) -> an int when it is whole."""
    value = _number(steps, "steps")
    return int(value) if value.is_integer() else value


def _only(checks) -> str:
    """The checks box (a list) or parameter (comma or space separated) -> 'a,b'."""
    if not isinstance(checks, str):
        checks = ",".join(str(c) for c in (checks or []))
    return checks.replace(" ", ",")


def _budget(budget_s) -> float:
    """The time budget, kept inside the operator's job time limit (the worker is killed there and
    a killed job reports nothing, while a spent budget reports what it measured)."""
    value = _number(budget_s, "the time budget (seconds)")
    if not 0 < value < float("inf"):
        return value  # the engine refuses it with its own reason
    return min(value, max(MIN_UI_BUDGET_S, SETTINGS.job_timeout_s * 0.8))


def options(device="auto", checks=CHECK_NAMES, steps=20, budget_s=DEFAULT_UI_BUDGET_S,
            autocast_policy="cuda") -> dict:
    """The `check_source` keyword arguments for these page/API values, validated by the engine's
    rules (`engine.check_options`: no torch in the server) and the device by the host probe."""
    from ..engine.check_options import validated

    kwargs = validated("auto", _only(checks), _steps(steps), _budget(budget_s), autocast_policy)
    kwargs["device"] = host.device_key(host.validate_device(device))  # what `auto` and `cuda` name here
    return kwargs


def run(source, device: str = "auto", checks=CHECK_NAMES, steps=20, progress=None,
        budget_s: float = DEFAULT_UI_BUDGET_S, autocast_policy: str = "cuda"):
    """The `CheckReport` for `source`, measured in a worker process (it crosses back typed)."""
    from ..jobs_entry import check_report  # the server stays torch-free

    kwargs = options(device, checks, steps, budget_s, autocast_policy)
    specinput.validate(source)
    timeout = SETTINGS.job_timeout_s
    key = host.device_key(kwargs["device"])  # the engine's resolved name: "CPU" and "cpu" share a lock
    common.warm_plotting()  # the skip-rate plot is drawn here once the job returns
    if specinput.is_python(source):
        if progress:
            progress(0.0, "running the uploaded model file in its own process")
        return jobs.run_job(check_report, source, allow_exec=SETTINGS.allow_exec, in_worker=False,
                            timeout_s=timeout, device_key=key, **kwargs)
    return jobs.run_job(check_report, source, timeout_s=timeout, progress=progress, device_key=key, **kwargs)


# ---------------------------------------------------------------- the page's outputs


def skiprate_figure(report):
    """The loss-scale trajectory plot, or None when the skip-rate probe did not run."""
    section = report.section("skiprate")
    if not section:
        return None
    try:
        from ..engine.skiprate_plot import plot_skiprate
    except ImportError:
        return None
    return plot_skiprate(section)


def ui_check(mode, preset, params, yaml_text, upload, weights, device, checks, steps,
             budget_s=DEFAULT_UI_BUDGET_S, autocast_policy="cuda", nproc=1, wrap="ddp", param_dtype="float16",
             reduce_dtype="", progress=None) -> tuple:
    """The Run button: (status, capability, findings, alignment summary, alignment rows,
    skip-rate text, skip-rate plot, NaN text, headroom text, headroom rows, JSON download), every
    text from the renderer the CLI prints with. With processes > 1 the skip-rate and NaN checks
    run under torch.distributed (`run_distributed`) and the status shows the per-rank table."""
    from ..engine import check_render as render

    source = specinput.source_from_inputs(mode, preset, params, yaml_text, upload, weights)
    ranks = parse_nproc(nproc, (device or "auto").strip() or "auto")
    if ranks is not None:
        return _ui_distributed(source, device, ranks, wrap, param_dtype, reduce_dtype, steps, progress)
    report = run(source, device, checks, steps, progress=progress, budget_s=budget_s,
                 autocast_policy=autocast_policy)
    name = str(report.spec.get("name") or "model")
    path = common.write_download(f"check_{name}.json", json.dumps(report.to_dict(), indent=2, default=str))
    say = common.for_page
    return (f"*{common.stamp()}* · " + say(render.status_markdown(report, "page")),
            say(render.section_markdown(report, "capability")),
            say(render.findings_markdown(report)), say(render.section_markdown(report, "alignment")),
            render.alignment_rows(report), say(render.section_markdown(report, "skiprate")),
            skiprate_figure(report), say(render.section_markdown(report, "nan")),
            say(render.section_markdown(report, "headroom")), render.headroom_rows(report), path)


def run_distributed(source, device: str, nproc: int, wrap: str, param_dtype: str, reduce_dtype, steps,
                    progress=None) -> dict:
    """`check --nproc` in a worker; its ranks stop at the server's time limit, before the worker's."""
    from ..engine.distributed_check import check_options

    device = (device or "auto").strip() or "auto"
    check_options(nproc, wrap, param_dtype, reduce_dtype or None, device, host=False)  # before a worker starts
    specinput.validate(source)
    limit = SETTINGS.job_timeout_s
    return jobs.run_job(_checked, source, timeout_s=limit + 30, progress=progress, device_key=host.device_key(device),
                        limit_s=limit, nproc=nproc, wrap=wrap, param_dtype=param_dtype,
                        reduce_dtype=reduce_dtype or None, steps=int(_steps(steps)), device=device,
                        allow_exec=SETTINGS.allow_exec)


def _checked(source, limit_s: float, progress=None, **kwargs) -> dict:
    """In the worker: `check_distributed` with the server's time limit for its ranks (picklable)."""
    from ..engine.distributed_check import check_distributed

    return check_distributed(source, timeout_s=limit_s, progress=progress, **kwargs)


def _ui_distributed(source, device, nproc, wrap, param_dtype, reduce_dtype, steps, progress) -> tuple:
    result = run_distributed(source, device, nproc, wrap, param_dtype, reduce_dtype, steps, progress)
    path = common.write_download("check_distributed.json", json.dumps(result, indent=2, default=str))
    from ..findings import Severity

    worst_first = sorted(result.get("findings") or [], key=lambda f: -Severity.parse(f["severity"]).rank)
    findings = "\n\n".join(f"**{f['severity']} {f['rule']} {f['name']}**: {f['message']}"
                             for f in worst_first) or "No findings."
    status = f"*{common.stamp()}* · " + common.for_page(check_ranks_markdown(result))
    return status, "", common.for_page(findings), "", [], "", None, "", "", [], path


# ---------------------------------------------------------------- checkpoint and device


def inspect_report(checkpoint):
    """The checkpoint's `InspectReport`, named by the file name the user gave it (never the
    server's upload folder); loaded with torch.load(weights_only=True), so no code runs."""
    path = common.upload_path(checkpoint)
    if not path:
        raise UserError("upload a checkpoint (.pt/.pth/.bin/.ckpt/.safetensors) to inspect")
    common.check_size(path, SETTINGS.max_file_bytes)
    from ..engine.inspect_checkpoint import inspect_checkpoint

    # In-process: torch.load(weights_only=True) runs no code, and the upload limit bounds memory.
    report = inspect_checkpoint(path)
    report.path = common.display_name(path)
    return report


def inspect_upload(checkpoint) -> dict:
    """The `inspect` endpoint: the checkpoint report as `inspect --format json` prints it."""
    return inspect_report(checkpoint).to_dict()


def ui_inspect(upload) -> tuple[str, dict]:
    """The Inspect button: the summary the CLI prints (what is present, dtypes, findings) shown
    verbatim, and the JSON report."""
    report = inspect_report(upload)
    n = len(report.findings)
    head = (f"*{common.stamp()}* · **{common.md_escape(report.path)}**: "
            + (f"{n} finding{'s' if n != 1 else ''}" if n else "no findings"))
    return f"{head}\n\n```text\n{report.to_text()}```\n", report.to_dict()


def capability_in_child(device: str = "auto") -> dict:
    from ..engine.capability import detect

    return detect(device or "auto").to_dict()


@functools.lru_cache(maxsize=8)
def _capability_cached(device: str) -> dict:
    if device == "auto":
        cached = host.host_info().get("capability")
        if cached:
            return cached
    report = jobs.run_job(_no_progress(capability_in_child), device, timeout_s=120,
                          device_key=host.device_key(device))
    report.pop("job", None)
    return report


def capability(device: str = "auto") -> dict:
    """The capability report of `device`, probed once per device in a worker process (the
    server never creates a CUDA context), then remembered: hardware does not change."""
    return copy.deepcopy(_capability_cached(host.validate_device(device)))


class _no_progress:
    """Adapts a job that takes no `progress` to `jobs.run_job` (picklable: wraps a module function)."""

    def __init__(self, func):
        self.func = func
        self.__name__ = getattr(func, "__name__", "job")

    def __call__(self, *args, progress=None, **kwargs):
        return self.func(*args, **kwargs)
