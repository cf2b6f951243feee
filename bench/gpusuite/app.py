"""Section `app`: the Gradio app on the device, driven through gradio_client as a user's script
would: a check, and two speedups submitted at once on the same GPU, which must queue
(one job per accelerator: the second starts when the first has finished, by the jobs' own
server-side times). Needs gradio, gradio_client and pydantic (the wheels on the device)."""
from __future__ import annotations

import json
import tempfile
import time

from .runner import SkipStep

NEEDS = ("gradio", "gradio_client", "pydantic")


def _decode(value):
    return json.loads(value) if isinstance(value, str) and value.startswith("{") else value


def queued_one_at_a_time(jobs: list[dict]) -> bool:
    """Jobs on one device ran one after another: each started after the previous one finished."""
    ordered = sorted(jobs, key=lambda j: j["started"])
    return all(a["finished"] <= b["started"] for a, b in zip(ordered, ordered[1:]))


def run(ctx, res) -> None:
    from .env import missing_packages

    missing = missing_packages(NEEDS)
    if missing:
        raise SkipStep(f"skipped: {', '.join(missing)} not installed (bring the wheels: docs/gpu_suite.md)")
    s, device = ctx.sizes, ctx.device
    server, url, rows = None, ctx.app_url, []
    try:
        with res.step("start the app" if url is None else "use the running app"):
            if url is None:
                from tests.test_app_harness import AppServer

                server = AppServer(startup_s=180)
                url = server.url
            res.data["url_given"] = ctx.app_url is not None
        if url is None:
            return
        from gradio_client import Client

        with tempfile.TemporaryDirectory(prefix="gpu-suite-app-") as downloads:
            client = Client(url, verbose=False, download_files=downloads)
            with res.step("check"):
                t0 = time.perf_counter()
                which = {"checks": s.app_checks} if s.app_checks else {}  # else the endpoint's default: all
                report, _png = client.predict(preset=s.app_check_preset, yaml_text="", spec_file=None,
                                              weights_file=None, device=device, steps=s.app_check_steps,
                                              budget_s=s.app_budget_s, api_name="/check", **which)
                report = _decode(report)
                job = report.get("job") or {}
                rows.append(["check " + s.app_check_preset, job.get("device"), time.perf_counter() - t0,
                             _span(job), None, ", ".join(sorted({f["rule"] for f in report.get("findings", [])}))
                             or "no findings"])
                res.data["check"] = {k: report.get(k) for k in ("findings", "timings_s", "job", "errors")}
                if job.get("device") != device:
                    raise AssertionError(f"the check ran on {job.get('device')}, not {device}")
            with res.step("two speedups at once"):
                t0 = time.perf_counter()
                submitted = [client.submit(preset=s.app_speedup_preset, yaml_text="", spec_file=None, device=device,
                                           precisions="fp32,bf16", budget_s=s.app_speedup_budget_s, compile=False,
                                           api_name="/speedup") for _ in range(2)]
                results = [_decode(j.result(timeout=600)[0]) for j in submitted]
                wall = time.perf_counter() - t0
                jobs = [r["job"] for r in results]
                first = min(j["started"] for j in jobs)
                for i, (r, j) in enumerate(zip(results, jobs), 1):
                    rows.append([f"speedup {s.app_speedup_preset} #{i}", j.get("device"), wall, _span(j),
                                 j["started"] - first, r["verdict"]["recommendation"]])
                queued = queued_one_at_a_time(jobs)
                res.data["speedups"] = jobs
                res.target(f"two speedups on {device} queue (one job per GPU)", "one after the other",
                           "queued" if queued else "overlapped", queued)
    finally:
        if server is not None:
            server.close()
        if rows:
            res.table(f"The app through gradio_client on {device}",
                      ["call", "device", "wall s (client)", "job s (server)", "started after the first (s)",
                       "result"], rows)


def _span(job: dict) -> float | None:
    return job["finished"] - job["started"] if job.get("started") is not None and job.get("finished") else None
