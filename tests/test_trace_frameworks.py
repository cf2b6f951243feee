"""trace on framework scripts run as they are (tests/fixtures/trace/frameworks): Accelerate, Lightning
(automatic and manual), Fabric, the Hugging Face Trainer and FSDP on this CPU host.

Each case is the CLI in the script's folder (`python -m troubleshooter trace SCRIPT --steps N --format
json -- ARGS`), a fresh interpreter importing torch and the framework (Lightning alone takes seconds).
By default two cases run, side by side (a buggy Accelerate loop and a buggy Lightning manual step);
`TRACE_FRAMEWORKS=1 python -m pytest tests/test_trace_frameworks.py` runs all of CASES.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from troubleshooter.lint.rules import BY_ID
from troubleshooter.trace import framework_report

ROOT = Path(__file__).resolve().parents[1]
FOLDER = Path(__file__).parent / "fixtures" / "trace" / "frameworks"
ALL = os.environ.get("TRACE_FRAMEWORKS") == "1"
MISSING = [m for m in ("accelerate", "lightning") if importlib.util.find_spec(m) is None]

# id: (script, args, steps, {rule: (severity, line)} expected, rules that must not appear, extra env)
CASES = {
    "accelerate-buggy": ("accelerate_fp16.py", ["--init-scale", "1e30"], 6,
                         {"AMP130": ("error", 39), "AMP133": ("warning", 41), "AMP261": ("info", 20)}, {"AMP104"}, {}),
    "accelerate-fused": ("accelerate_fp16.py", ["--clean", "--fused", "--init-scale", "1e30"], 5,
                         {"AMP145": ("warning", 41), "AMP261": ("info", 20)}, {"AMP133", "AMP107"}, {}),
    "lightning-manual-buggy": ("lightning_manual.py", [], 4, {"AMP130": ("error", 28), "AMP261": ("info", None)},
                               {"AMP104", "AMP105"}, {}),
    "accelerate-clean": ("accelerate_fp16.py", ["--clean"], 5, {"AMP261": ("info", 20)}, set(), {}),
    "accelerate-not-emulated": ("accelerate_fp16.py", ["--clean"], 4, {"AMP260": ("info", 20)}, {"AMP261"},
                                {"TROUBLESHOOTER_TRACE_EMULATE": "0"}),
    "accelerate-bf16": ("accelerate_fp16.py", ["--clean", "--mixed-precision", "bf16"], 4, {}, {"AMP260", "AMP261"}, {}),
    "lightning-manual-clean": ("lightning_manual.py", ["--clean"], 4, {"AMP261": ("info", None)}, {"AMP104", "AMP105"}, {}),
    "lightning-auto-buggy": ("lightning_auto.py", ["--buggy", "--explode"], 5,
                             {"AMP130": ("error", 28), "AMP262": ("info", None)}, {"AMP133", "AMP107"}, {}),
    "lightning-auto-clean": ("lightning_auto.py", [], 4, {"AMP261": ("info", None)}, {"AMP107"}, {}),
    "fabric-clean": ("fabric_fp16.py", [], 3, {"AMP261": ("info", 14)}, set(), {}),
    "fabric-buggy": ("fabric_fp16.py", ["--buggy"], 3, {"AMP131": ("error", 27), "AMP290": ("error", 27)}, set(), {}),
    "hf-trainer-fp16": ("hf_trainer_fp16.py", [], 4, {"AMP261": ("info", None)}, {"AMP107"}, {}),
    "hf-trainer-bf16-no-gpu": ("hf_trainer_fp16.py", ["--bf16"], 4, {"AMP261": ("info", None)}, {"AMP290"}, {}),
    "fsdp-sharded": ("fsdp_fp16.py", [], 4, {}, {"AMP115", "AMP113", "AMP135"}, {}),
    "fsdp-plain": ("fsdp_fp16.py", ["--plain"], 4, {"AMP135": ("warning", 24)}, set(), {}),
}
QUICK = ("accelerate-buggy", "lightning-manual-buggy")


def run_case(case_id: str) -> dict:
    script, args, steps, *_, env = CASES[case_id]
    full_env = {**os.environ, **env, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "troubleshooter", "trace", script, "--steps", str(steps), "--format",
                           "json", "--", *args], cwd=FOLDER, env=full_env, capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    return json.loads(proc.stdout)


def problems(case_id: str, report: dict) -> list[str]:
    """What is wrong with one report for its case (empty: as expected)."""
    script, _, _, expect, absent, _ = CASES[case_id]
    found = report["findings"]
    out = []
    for rule, (severity, line) in expect.items():
        hits = [f for f in found if f["rule"] == rule]
        if not hits:
            out.append(f"{rule} missing; got {[(f['rule'], f['severity']) for f in found]}")
            continue
        f = hits[0]
        if f["severity"] != severity or (line is not None and f["line"] != line) or not (f["path"] or "").endswith(script):
            out.append(f"{rule}: {f['severity']} at {f['path']}:{f['line']}, expected {severity} at {script}:{line}")
    out += [f"unexpected {f['rule']}" for f in found if f["rule"] in absent]
    out += [f"also {f['rule']} {f['severity']}: {f['message'][:90]}" for f in found
            if f["rule"] not in expect and f["severity"] in ("error", "warning")]
    if not {"AMP290"} & set(expect) and report["exit"]["status"] not in ("stopped", "finished"):
        out.append(f"script {report['exit']['status']}: {report['exit'].get('exception')}")
    return out


@pytest.fixture(scope="module")
def quick_reports():
    if MISSING:
        pytest.skip(f"framework trace tests need {', '.join(MISSING)} (pip install -r requirements-dev.txt)")
    with ThreadPoolExecutor(len(QUICK)) as pool:
        return dict(zip(QUICK, pool.map(run_case, QUICK)))


def test_accelerate_fp16_emulated_on_cpu_with_its_scaler_scheduler_and_clip(quick_reports):
    """accelerate 1.15 runs fp16 as float32 on a CPU; the trace runs its GPU path and says so: the scale comes
    down from 1e30 with every step skipped, the unprepared scheduler steps on each skip, the clip sees scaled
    gradients."""
    report = quick_reports["accelerate-buggy"]
    assert problems("accelerate-buggy", report) == []
    fw = report["framework"]
    assert fw["asked"] == "fp16" and fw["emulated"] and report["precision"]["emulated"]
    assert report["precision"]["compute"] == "float16 autocast"
    scaling = fw["loss_scaling"]
    assert scaling["scale_first"] == pytest.approx(1e30, rel=1e-6) and scaling["scale_last"] < 1e30 and scaling["skipped_steps"]
    assert fw["scheduler_on_skipped"]["scheduler_stepped_after"] == fw["scheduler_on_skipped"]["skipped_steps"]
    assert fw["clip_order"].startswith("on scaled gradients")
    entry = fw["frameworks"][0]
    assert entry["framework"] == "accelerate" and "float32" in entry["refused"] and entry["version"]


def test_lightning_manual_step_in_its_own_autocast_is_not_the_users(quick_reports):
    """Lightning runs training_step inside its autocast: manual_backward/opt.step there are not AMP104/AMP105;
    `self.clip_gradients` before `opt.step()` clips scaled gradients (Lightning #18089): AMP130."""
    report = quick_reports["lightning-manual-buggy"]
    assert problems("lightning-manual-buggy", report) == []
    entry = report["framework"]["frameworks"][0]
    assert entry["framework"] == "lightning" and entry["asked"] == "16-mixed" and entry["emulated"]
    assert "bf16-mixed" in entry["refused"]


def test_framework_rule_names_exist_in_the_lint_catalogue():
    """A mistake seen through a framework's GradScaler is reported under the lint rule of the same name."""
    for raw_rule, fw_rule in framework_report.FRAMEWORK_RULE.items():
        assert raw_rule in BY_ID and fw_rule in BY_ID and BY_ID[fw_rule].name.startswith("framework-")


@pytest.mark.skipif(not ALL, reason="all framework trace cases: TRACE_FRAMEWORKS=1 (about 2 minutes)")
def test_every_case():
    missing = [m for m in ("accelerate", "lightning", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")
    rest = [c for c in CASES if c not in QUICK]
    with ThreadPoolExecutor(2) as pool:
        reports = dict(zip(rest, pool.map(run_case, rest)))
    bad = {c: problems(c, r) for c, r in reports.items() if problems(c, r)}
    assert bad == {}
    assert "float16 parameters (FSDP1" in reports["fsdp-sharded"]["precision"]["compute"]
    assert reports["accelerate-not-emulated"]["precision"]["compute"] == "float32"


if __name__ == "__main__":  # a table of every case
    for cid in CASES:
        rep = run_case(cid)
        print(f"{cid:26} {'ok' if not problems(cid, rep) else problems(cid, rep)}")
