"""bench/gpu_suite.py: the one command that measures every GPU path, known to work on a CPU.

The device machine has torch but neither pydantic nor gradio; these tests run the suite's CPU
dry run (tiny sizes, the same code paths) once and check what it writes, and check the parts a
dry run cannot reach: a failing step or section, the time limit, the app without gradio, the
wheels' install, nvidia-smi's output, the capability comparison on a described H100."""
from __future__ import annotations

import dataclasses
import importlib
import json
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"


def _bench(name: str):
    """A module of bench/ (gpu_suite puts the repository and bench/ on the path when imported)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    return importlib.import_module(name)


# ---------------------------------------------------------------- the CPU dry run, end to end


@pytest.fixture(scope="module")
def dry_run(app_server, tmp_path_factory):
    """One `--dry-run-cpu` run, in this process, driving the tests' shared app server."""
    out = tmp_path_factory.mktemp("gpu-suite")
    code = _bench("gpu_suite").main(["--dry-run-cpu", "--out", str(out), "--app-url", app_server.url])
    return code, json.loads((out / "gpu_suite.json").read_text()), (out / "gpu_suite.md").read_text()


def _section(report: dict, name: str) -> dict:
    return report["sections"][name]


def _table(section: dict, title_part: str) -> dict:
    (table,) = [t for t in section["tables"] if title_part in t["title"]]
    return table


def _column(table: dict, name: str) -> list:
    i = table["columns"].index(name)
    return [row[i] for row in table["rows"]]


@pytest.mark.server
def test_the_dry_run_writes_every_section_marked_as_a_cpu_dry_run(dry_run):
    code, report, md = dry_run
    sections = _bench("gpusuite.sections")
    assert code == 0, {n: (s["status"], s["error"], s["steps"]) for n, s in report["sections"].items()}
    assert report["mode"] == "cpu dry run" and report["device"] == "cpu" and report["finished"]
    assert report["order"] == list(sections.NAMES)
    for name in sections.NAMES:
        sec = _section(report, name)
        assert sec["status"] == "ok" and sec["mode"] == "cpu dry run", (name, sec["status"], sec["error"])
        assert sec["tables"] and all(t["rows"] for t in sec["tables"]), name
        assert all(s["status"] == "ok" and s["elapsed_s"] is not None for s in sec["steps"]), (name, sec["steps"])
        assert name == "env" or sec["steps"], name
    env = report["environment"]
    assert env["torch"] and env["python"] and env["date"] and env["gpus"] == []


@pytest.mark.server
def test_the_dry_run_figures_are_plausible(dry_run):
    _, report, _ = dry_run
    cap = _table(_section(report, "capability"), "Capability")
    facts = dict(zip(_column(cap, "fact"), cap["rows"]))
    assert facts["GPU count"][1] == 0 and facts["GPU count"][-1] is True  # ours and torch's: no GPU here
    assert _section(report, "capability")["targets"][0]["met"] is True

    matmul = _table(_section(report, "matmul"), "Matmul")
    assert set(_column(matmul, "dtype")) == {"bf16", "fp16", "tf32", "fp32"}
    assert all(x > 0 for x in _column(matmul, "TFLOP/s"))

    speedup = _section(report, "speedup")
    both_timed = 0
    for label, runs in speedup["data"]["runs"].items():
        assert len(runs) == 2, label
        for r in runs:
            # the dry run's 0.2 s budget may leave bf16 untimed on a loaded host: then it says why
            assert "fp32" in r["results"] and set(r["results"]) | set(r["skipped"]) == {"fp32", "bf16"}, label
            assert all(why for why in r["skipped"].values())
            assert all(x["median_ms"] > 0 for x in r["results"].values())
        both_timed += all("bf16" in r["results"] for r in runs)
    repeat = _table(speedup, "repeatability")
    assert _column(repeat, "precision") == ["bf16", "bf16"]  # one row per model, compared or not
    assert sum(not d.startswith("not compared") for d in _column(repeat, "difference")) == both_timed
    assert _table(speedup, "torch.utils.benchmark")["rows"][0][-1].startswith(("ok", "FAIL"))

    check = _section(report, "check")
    cases = check["data"]["cases"]
    assert all(c["comparison"]["agree"] for c in cases.values())
    found = {label: {(f["rule"], f.get("module")) for f in c["device"]["findings"]} for label, c in cases.items()}
    assert ("AMP202", "2") in found["overflow fixture"]  # fp16 overflow in the planted layer
    fresh = _table(check, "in a fresh process")["rows"][0]
    assert fresh[0] == "mlp (tiny stand-in)" and fresh[1] == 3.0 and fresh[2] > 0  # budget, wall from outside
    assert check["data"]["fresh_process"]["timings_s"]["start_up"] > 0
    assert any(t["name"].endswith("first answer, from outside") for t in check["targets"])
    assert any(rule == "AMP203" for rule, _ in found["underflow fixture"])

    recipe = _table(_section(report, "recipe"), "Generated recipe")
    assert _column(recipe, "precision") == ["fp32", "bf16"]
    assert all(x > 0 for x in _column(recipe, "tokens/s")) and _column(recipe, "error") == [None] * 2
    assert _column(recipe, "vs fp32")[0] == 1.0

    (nan,) = _section(report, "nan_overhead")["data"]["results"].values()
    assert set(nan["median_step_s"]) == {"plain", "nanhunt", "detect_anomaly"}
    assert all(v > 0 for v in nan["median_step_s"].values()) and "ratio" in nan

    trace = _table(_section(report, "trace"), "trace on")
    assert all(_column(trace, "as expected"))
    nanogpt = dict(zip(_column(trace, "script"), trace["rows"]))["nanoGPT train.py (unmodified)"]
    assert "float32" in nanogpt[4] and "AMP292" in nanogpt[5]  # its own AMP is off on a CPU, and the trace says so

    app = _section(report, "app")
    assert app["targets"][0]["met"] is True and len(app["data"]["speedups"]) == 2
    assert all(j["device"] == "cpu" for j in app["data"]["speedups"])

    for name in ("speedup_compile", "recipe_compile"):
        assert any("TorchDynamo" in n or "TORCHDYNAMO" in n for n in _section(report, name)["notes"])


@pytest.mark.server
def test_the_dry_run_markdown_has_every_table_and_says_it_is_no_gpu_figure(dry_run):
    _, report, md = dry_run
    render = _bench("gpusuite.render")
    assert md.startswith("# GPU suite") and render.DRY_RUN_BANNER in md.split("\n\n")[1]
    for name, sec in report["sections"].items():
        assert f"(`{name}`) · cpu dry run" in md
        for t in sec["tables"]:
            header = render.table(t["columns"], [])[0]
            assert f"**{t['title']}** (cpu dry run)" in md and header in md, (name, t["title"])
    assert "| torch | " + report["environment"]["torch"] + " |" in md


# ---------------------------------------------------------------- what a dry run cannot show


def _suite(tmp_path, sections, mode="cpu dry run", time_limit=None):
    runner = _bench("gpusuite.runner")
    ctx = runner.Context(mode=mode, device="cpu", sizes=None, out_dir=tmp_path, packages={}, results={})
    suite = runner.Suite(ctx, sections, {"torch": "x"}, ["--out", str(tmp_path)], time_limit)
    return suite.run(), (tmp_path / "gpu_suite.md").read_text()


def test_a_failed_step_or_section_is_recorded_with_its_error_and_the_rest_runs(tmp_path):
    runner = _bench("gpusuite.runner")
    seen = {}

    def steps(ctx, res):
        with res.step("breaks"):
            raise ValueError("boom in a step")
        with res.step("runs after it") as entry:
            on_disk = json.loads((tmp_path / "gpu_suite.json").read_text())
            seen["status while running"] = on_disk["sections"]["steps"]["status"]
            entry["value"] = 1
        res.table("A table", ["a", "b"], [[1, None]])

    def broken(ctx, res):
        raise RuntimeError("the whole section broke")

    def skipped(ctx, res):
        raise runner.SkipStep("skipped: gradio not installed")

    report, md = _suite(tmp_path, [runner.Section("steps", "Steps", steps, 1, "w"),
                                   runner.Section("broken", "Broken", broken, 1, "w"),
                                   runner.Section("skipped", "Skipped", skipped, 1, "w")])
    s = report["sections"]
    assert seen["status while running"] == "running"  # a killed run shows where it stopped
    assert s["steps"]["status"] == "partial" and [x["status"] for x in s["steps"]["steps"]] == ["failed", "ok"]
    assert s["steps"]["steps"][0]["error"]["message"] == "boom in a step"
    assert s["broken"]["status"] == "failed" and s["broken"]["error"]["type"] == "RuntimeError"
    assert s["skipped"]["status"] == "skipped" and "gradio not installed" in s["skipped"]["reason"]
    assert "step `breaks`: failed: ValueError: boom in a step" in md
    assert "Status: **FAILED**" in md and "RuntimeError: the whole section broke" in md
    assert "| 1 | - |" in md


def test_a_section_that_would_pass_the_time_limit_is_not_started(tmp_path):
    runner = _bench("gpusuite.runner")
    ran = []
    sections = [runner.Section("quick", "Quick", lambda c, r: ran.append("quick"), 1, "w"),
                runner.Section("slow", "Slow", lambda c, r: ran.append("slow"), 10_000, "w")]
    report, md = _suite(tmp_path, sections, mode="gpu", time_limit=60)
    assert ran == ["quick"]
    slow = report["sections"]["slow"]
    assert slow["status"] == "not run" and "--only slow" in slow["reason"]
    assert report["sections"]["quick"]["status"] == "ok" and "--only slow" in md


def test_a_dry_run_overlaps_waiting_sections_but_never_with_one_that_must_run_alone(tmp_path):
    """trace stops every process that appears below the suite while it runs: the app's jobs
    (run beside the rest in a dry run) must be over before it starts."""
    import time

    runner = _bench("gpusuite.runner")
    times = {}

    def waiting(ctx, res):
        with res.step("wait"):
            time.sleep(0.3)
        times["waiting ended"] = time.perf_counter()

    def other(ctx, res):
        times["other started"] = time.perf_counter()

    def alone(ctx, res):
        times["alone started"] = time.perf_counter()

    report, _ = _suite(tmp_path, [runner.Section("bg", "Bg", waiting, 1, "w", waits=True),
                                  runner.Section("other", "Other", other, 1, "w"),
                                  runner.Section("solo", "Solo", alone, 1, "w", alone=True)])
    assert times["other started"] < times["waiting ended"] <= times["alone started"]
    assert [report["sections"][n]["status"] for n in ("bg", "other", "solo")] == ["ok"] * 3
    assert report["sections"]["bg"]["steps"][0]["name"] == "wait"


def test_the_app_section_is_skipped_without_gradio(tmp_path, monkeypatch):
    app, env, runner = _bench("gpusuite.app"), _bench("gpusuite.env"), _bench("gpusuite.runner")
    monkeypatch.setattr(env, "missing_packages", lambda names=env.NEEDED: ["gradio", "gradio_client"])
    report, md = _suite(tmp_path, [runner.Section("app", "App", app.run, 1, "w")])
    sec = report["sections"]["app"]
    assert sec["status"] == "skipped" and sec["reason"].startswith("skipped: gradio, gradio_client not installed")


def test_the_wheels_are_installed_into_a_scratch_folder_first_on_the_path(tmp_path, monkeypatch):
    env = _bench("gpusuite.env")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    info = "amp_suite_probe-0.1.dist-info"
    with zipfile.ZipFile(wheels / "amp_suite_probe-0.1-py3-none-any.whl", "w") as whl:
        whl.writestr("amp_suite_probe.py", "ANSWER = 42\n")
        whl.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: amp-suite-probe\nVersion: 0.1\n")
        whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{info}/RECORD", f"amp_suite_probe.py,,\n{info}/METADATA,,\n{info}/WHEEL,,\n{info}/RECORD,,\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.setattr(env, "missing_packages", lambda names=env.NEEDED: ["gradio"])
    assert env.bring_packages(tmp_path / "none", tmp_path / "site")["source"] is None  # no wheels: says how
    got = env.bring_packages(wheels, tmp_path / "site")
    assert got["source"] == "wheels" and got["wheels"] == 1, got
    assert sys.path[0] == str(tmp_path / "site")
    import os

    assert os.environ["PYTHONPATH"].split(os.pathsep) == [str(tmp_path / "site"), "/elsewhere"]  # for the children
    monkeypatch.delitem(sys.modules, "amp_suite_probe", raising=False)
    assert importlib.import_module("amp_suite_probe").ANSWER == 42


def test_nvidia_smi_output_is_read():
    env = _bench("gpusuite.env")
    gpus = env.parse_smi_csv("0, NVIDIA H100 80GB HBM3, 580.159.04, 81559, 9.0\n"
                             "1, NVIDIA H200, 580.159.03, [N/A], 9.0\n")
    assert gpus[0] == {"index": "0", "name": "NVIDIA H100 80GB HBM3", "driver_version": "580.159.04",
                       "memory.total": "81559", "compute_cap": "9.0"}
    assert gpus[1]["memory.total"] is None
    banner = "| NVIDIA-SMI 580.159.04   Driver Version: 580.159.04   CUDA Version: 13.0     |"
    assert env.parse_smi_cuda_version(banner) == "13.0" and env.parse_smi_cuda_version("no banner") is None

    def fake_run(cmd, **kwargs):  # an old driver without compute_cap: asked again without it
        import subprocess

        if "compute_cap" in " ".join(cmd):
            return subprocess.CompletedProcess(cmd, 2, "", 'Field "compute_cap" is not a valid field to query.')
        text = "0, Tesla V100-SXM2-16GB, 470.1, 16160\n" if len(cmd) > 1 else banner
        return subprocess.CompletedProcess(cmd, 0, text, "")

    smi = env.nvidia_smi(run=fake_run)
    assert smi["gpus"][0]["name"] == "Tesla V100-SXM2-16GB" and "compute_cap" not in smi["gpus"][0]
    assert smi["cuda_version"] == "13.0"


def test_capability_is_held_against_nvidia_smi_torch_and_measurement_on_a_described_h100():
    cap = _bench("gpusuite.capability")
    from troubleshooter.engine.capability import report_from_profile

    ours = report_from_profile({"device": "cuda:0", "name": "NVIDIA H100 80GB HBM3", "compute_capability": [9, 0],
                                "memory_bytes": 81559 * 2**20, "multiprocessors": 132, "gpu_count": 1,
                                "cuda_version": "13.0", "bf16_supported_native": True,
                                "bf16_supported_default": True,
                                "tf32": {"matmul_allow_tf32": False, "cudnn_allow_tf32": True,
                                         "float32_matmul_precision": "highest"}}).to_dict()
    smi = {"available": True, "gpus": [{"name": "NVIDIA H100 80GB HBM3", "compute_cap": "9.0", "memory.total": "81559",
                                        "driver_version": "580.159.04"}]}
    torch_ans = {"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "memory_gib": 81559 / 1024,
                 "multiprocessors": 132, "gpu_count": 1, "cuda_version": "13.0", "bf16_native": True,
                 "bf16_with_emulation": True, "tf32_supported": True, "float32_matmul_precision": "highest",
                 "matmul_fp32_precision": "none"}
    measured = {"vs_fp32": {"fp32": 1.0, "tf32": 7.0, "bf16": 12.0, "fp16": 12.5}}
    rows = cap.compare_rows(ours, smi, torch_ans, measured, {"runs": True}, cuda=True)
    agree = {r[0]: r[-1] for r in rows}
    assert all(v is not False for v in agree.values()), rows
    assert agree["compute capability"] and agree["memory (GiB)"] and agree["native bf16"] and agree["TF32 tensor cores"]
    assert agree["fp8 tensor cores (torch._scaled_mm runs)"] is True
    assert dict((r[0], r[4]) for r in rows)["native bf16"] == "yes (12.0x fp32 in a matmul)"

    wrong = cap.compare_rows(ours, {**smi, "gpus": [{**smi["gpus"][0], "compute_cap": "8.0"}]}, torch_ans,
                             {"vs_fp32": {**measured["vs_fp32"], "bf16": 1.0}}, {"runs": False}, cuda=True)
    differ = {r[0] for r in wrong if r[-1] is False}
    assert differ == {"compute capability", "native bf16", "fp8 tensor cores (torch._scaled_mm runs)"}


def test_runs_of_several_device_calls_merge_and_a_dry_run_never_merges_with_a_gpu_run():
    runner = _bench("gpusuite.runner")

    def rep(mode, started, statuses):
        return {"mode": mode, "started": started, "argv": [], "environment": {}, "order": list(statuses),
                "sections": {n: {"name": n, "status": s} for n, s in statuses.items()}}

    first = rep("gpu", "t1", {"env": "ok", "speedup": "ok", "speedup_compile": "not run"})
    second = rep("gpu", "t2", {"env": "ok", "speedup_compile": "ok"})
    merged = runner.merge([first, second])
    assert merged["order"] == ["env", "speedup", "speedup_compile"]
    assert merged["sections"]["speedup_compile"]["run_started"] == "t2"
    assert merged["sections"]["speedup"]["run_started"] == "t1"
    with pytest.raises(ValueError, match="dry run"):
        runner.merge([first, rep("cpu dry run", "t3", {"env": "ok"})])


def test_without_a_gpu_the_suite_measures_nothing_unless_told_to_dry_run(tmp_path, capsys):
    gpu_suite = _bench("gpu_suite")
    assert gpu_suite.main(["--out", str(tmp_path)]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err and not (tmp_path / "gpu_suite.json").exists()
    assert gpu_suite.main(["--dry-run-cpu", "--out", str(tmp_path), "--only", "trace,magic"]) == 2
    assert "unknown section(s) magic:" in capsys.readouterr().err
    sections = _bench("gpusuite.sections")
    assert [s.name for s in sections.select(["trace", "check"], None)] == ["env", "check", "trace"]
    assert [s.name for s in sections.select(None, ["app", "env"])][:2] == ["env", "capability"]
    assert "app" not in [s.name for s in sections.select(None, ["app"])]


def test_a_preset_loads_without_pydantic(monkeypatch):
    """Only a YAML spec is validated by pydantic: presets must load where it is missing."""
    import troubleshooter.spec as spec_package

    monkeypatch.setitem(sys.modules, "pydantic", None)  # `import pydantic` raises ImportError
    for name in ("loader", "yamlspec", "schema"):  # imported afresh, put back afterwards
        monkeypatch.delitem(sys.modules, f"troubleshooter.spec.{name}", raising=False)
        if name in vars(spec_package):
            monkeypatch.setattr(spec_package, name, vars(spec_package)[name])
    loader = importlib.import_module("troubleshooter.spec.loader")
    from troubleshooter.spec import SpecSource

    workload = loader.load_workload(SpecSource.preset("mlp:hidden=16,depth=2,in_features=8,batch_size=4"))
    assert workload.name.startswith("mlp") and workload.batch_size == 4
    with pytest.raises(ImportError):
        loader.load_workload(SpecSource.yaml_text("model:\n  layers: [ReLU]\ninput: {shape: [2, 4]}\n"))


def test_findings_are_compared_only_over_the_checks_both_devices_ran():
    checks = _bench("gpusuite.checks")

    def finding(rule, check, module="2", precision="fp16"):
        return {"rule": rule, "module": module, "precision": precision, "data": {"check": check}}

    base = {c: {} for c in ("capability", "alignment", "skiprate", "nan", "headroom")}
    gpu = {**base, "errors": {}, "findings": [finding("AMP202", "nan"), finding("AMP207", "capability", None, "bf16"),
                                              finding("AMP204", "skiprate", None)]}
    cpu = {**base, "errors": {"skiprate": {"kind": "budget"}}, "skiprate": None,
           "findings": [finding("AMP202", "nan"), finding("AMP208", "capability", None)]}
    same = checks.compare_findings(gpu, cpu)  # AMP204's check did not run on the CPU: not compared
    assert same["agree"] and same["checks"] == ["alignment", "nan", "headroom"]
    cpu["findings"].append(finding("AMP203", "headroom", "0"))
    differ = checks.compare_findings(gpu, cpu)
    assert not differ["agree"] and differ["only_cpu"] == [["AMP203", "0", "fp16"]] and differ["only_device"] == []


def test_a_trace_on_the_gpu_is_judged_against_what_must_hold_there():
    trace = _bench("gpusuite.trace")
    case = {"mixed": True, "dtype": "float16", "scaler": True}
    good = {"exit": {"status": "stopped"}, "steps_observed": 5, "device": {"type": "cuda"}, "findings": [],
            "precision": {"mixed": True, "compute": "float16 autocast", "scalers": [{"enabled": True}]}}
    assert trace.judge(good, case, "cuda") == []
    bad = {**good, "device": {"type": "cpu"}, "findings": [{"rule": "AMP101", "severity": "error"}],
           "precision": {"mixed": True, "compute": "bfloat16 autocast", "scalers": [{"enabled": False}]}}
    problems = trace.judge(bad, case, "cuda")
    assert problems == ["ran on cpu, not cuda", "computed in bfloat16 autocast, not float16", "GradScaler off",
                        "findings: AMP101 (error)"]


def test_the_profile_counts_each_kernel_once_not_under_its_op_and_itself(tmp_path, monkeypatch):
    """torch.profiler lists an op (CPU side, its kernels' time as its own device time) and each
    kernel (device side) as separate events: the first GPU run summed both and said the kernels
    were busy 200% of the step. Only the kernels' own events make the total."""
    from types import SimpleNamespace

    runner, speed = _bench("gpusuite.runner"), _bench("gpusuite.speed")
    cpu, gpu = SimpleNamespace(name="CPU"), SimpleNamespace(name="CUDA")
    events = [SimpleNamespace(key="aten::mm", count=6, device_type=cpu, self_device_time_total=30_000.0),
              SimpleNamespace(key="gemm_kernel_" + "x" * 300, count=6, device_type=gpu, self_device_time_total=30_000.0),
              SimpleNamespace(key="aten::add_", count=3, device_type=cpu, self_device_time_total=6_000.0),
              SimpleNamespace(key="add_kernel", count=3, device_type=gpu, self_device_time_total=6_000.0),
              SimpleNamespace(key="aten::view", count=3, device_type=cpu, self_device_time_total=0.0)]
    span = SimpleNamespace(key="Optimizer.step#AdamW.step", count=3, device_type=gpu, self_device_time_total=6_000.0)
    raw = [SimpleNamespace(key=span.key, device_type=gpu, is_user_annotation=True),
           SimpleNamespace(key=span.key, device_type=cpu, is_user_annotation=False)]
    assert speed._without_annotations([*events, span], raw) == events  # a range's span repeats its kernels
    monkeypatch.setattr(speed, "_profiled_steps", lambda preset, device, steps: (events, 12.0))
    monkeypatch.setattr(speed, "_release", lambda device: None)
    ctx = runner.Context(mode="gpu", device="cuda:0", sizes=SimpleNamespace(profile_model=("m", "mlp")),
                         out_dir=tmp_path, packages={}, results={})
    res = runner.SectionResult("profile", "Profile", "gpu")
    speed.run_profile(ctx, res)
    assert [s["status"] for s in res.steps] == ["ok"], res.steps
    assert res.data["busy_ms"] == pytest.approx(12.0)  # (30 + 6) ms over 3 steps, not twice that
    ops, kernels = res.tables
    assert [r[0] for r in ops["rows"]] == ["aten::mm", "aten::add_"]
    assert ops["rows"][0][3] == pytest.approx(30 / 36) and "busy 100% of it" in ops["note"]
    assert len(kernels["rows"][0][0]) == 110 and kernels["rows"][0][0].endswith("…")


def test_repeatability_does_not_judge_a_figure_from_a_cold_first_step():
    """The check refuses to rank a precision timed only from its first step (kernel loading):
    the suite's repeatability target must not count it either (H200 run of 2026-11-28: 175%)."""
    compare = _bench("speedup_repeatability").compare

    def run(bf16, cold):
        return {"results": {"fp32": {"speedup_vs_fp32": 1.0, "spread": 0.0},
                            "bf16": {"speedup_vs_fp32": bf16, "spread": 0.01, "first_step_only": cold}}}

    warm = compare(run(3.99, False), run(3.90, False))["bf16"]
    assert warm["not_comparable"] is None and warm["rel_diff"] < 0.05
    cold = compare(run(0.257, True), run(3.99, False))["bf16"]
    assert cold["not_comparable"] == "run 1 timed from a cold first step only"
    # fp32 cold: the run states no ratio at all (make_verdict), and the row says why
    cold_base = {"results": {"fp32": {"speedup_vs_fp32": None, "first_step_only": True},
                             "bf16": {"speedup_vs_fp32": None, "spread": 0.0}}}
    pair = compare(cold_base, run(3.99, False))["bf16"]
    assert pair["missing"] and pair["not_comparable"] == "run 1: fp32 timed from a cold first step only"


def test_a_precision_one_run_left_untimed_is_a_row_with_the_reason():
    """Under a tight budget one run may skip bf16: the repeatability table says so instead of
    leaving the model out (an empty table read as a broken section)."""
    compare = _bench("speedup_repeatability").compare
    timed = {"results": {"fp32": {"speedup_vs_fp32": 1.0}, "bf16": {"speedup_vs_fp32": 2.0}}, "skipped": {}}
    untimed = {"results": {"fp32": {"speedup_vs_fp32": 1.0}},
               "skipped": {"bf16": "one bf16 step is expected to take about 0.3 s here"}}
    pair = compare(timed, untimed)["bf16"]
    assert pair["missing"] and pair["rel_diff"] is None
    assert pair["not_comparable"] == "run 2: one bf16 step is expected to take about 0.3 s here"
    assert compare(timed, timed)["bf16"]["not_comparable"] is None


def test_the_reference_times_what_our_run_was_asked_to_even_when_it_left_bf16_untimed(tmp_path, monkeypatch):
    """A busy host can leave bf16 untimed in the dry run's 0.2 s budget; the torch.utils.benchmark
    reference must still time fp32 and bf16 (a reference of fp32 alone failed the step with
    `max() arg is an empty sequence`) and our inconclusive verdict is judged, not an error."""
    runner, speed, sizes = _bench("gpusuite.runner"), _bench("gpusuite.speed"), _bench("gpusuite.sizes")
    repeat, ref_mod = _bench("speedup_repeatability"), _bench("speedup_vs_utils_benchmark")
    untimed = {"results": {"fp32": {"median_ms": 1.0, "spread": 0.01, "speedup_vs_fp32": 1.0}},
               "skipped": {"bf16": "one bf16 step is expected to take about 0.3 s here"},
               "verdict": {"level": "inconclusive", "best_precision": None, "speedup": None, "recommendation": "r"},
               "settings": {"rounds": 0, "elapsed_s": 0.2, "time_spent_s": None}}
    asked = []

    def reference(workload, precisions, min_run_s, device):
        asked.append(list(precisions))
        return {p: {"median_ms": 1.0, "spread": 0.01, "speedup": 1.0 if p == "fp32" else 1.5} for p in precisions}

    monkeypatch.setattr(repeat, "run_twice", lambda *a, **k: [untimed, untimed])
    monkeypatch.setattr(ref_mod, "reference", reference)
    monkeypatch.setattr(speed, "_fresh_process_speedup", lambda ctx, res: None)
    monkeypatch.setattr(speed, "_slim", lambda run: run)
    one = dataclasses.replace(sizes.DRY_RUN, speedup_models=(("tiny", sizes.TINY_GPT, 0.2),))
    ctx = runner.Context(mode="cpu dry run", device="cpu", sizes=one, out_dir=tmp_path, packages={}, results={})
    res = runner.SectionResult("speedup", "Speedup", "cpu dry run")
    speed.run_speedup(ctx, res)
    assert asked == [["fp32", "bf16"]]
    assert [s["status"] for s in res.steps] == ["ok", "ok"], res.steps
    assert _table(res.to_dict(), "torch.utils.benchmark")["rows"][0][-1] == "ok: inconclusive"
