"""The app's server process never imports torch for a preset or YAML check, a speedup or a trace: it
hands the job to a worker by reference, and the worker has torch (issue 28: the first check paid
~3 s and 150 MiB importing it in the server)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import pickle, sys
    from troubleshooter.ui import check, jobs, speedup, specinput, trace
    from troubleshooter.ui.server import SETTINGS
    handed = []

    def run_job(func, *args, **kwargs):
        handed.append(func)
        pickle.dumps(func)  # crosses to the worker by reference
        return {"findings": []} if func.__name__ == "_traced" else None  # the trace's JSON, cleaned here

    jobs.run_job = run_job
    source = specinput.preset_source("mlp", "")
    check.run(source, "cpu")
    speedup.measure(source, "cpu")
    SETTINGS.allow_exec = True
    trace.run("print('hello')", None, steps=2, device="cpu")
    assert [f.__module__ for f in handed] == ["troubleshooter.jobs_entry"] * 2 + ["troubleshooter.ui.trace"], handed
    print("torch imported:", "torch" in sys.modules)
""")


def test_a_check_a_speedup_and_a_trace_are_handed_to_a_worker_without_importing_torch():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "torch imported: False" in out.stdout


def test_the_job_entry_points_run_the_engines_functions():
    from troubleshooter import jobs_entry
    from troubleshooter.engine.check_report import CheckReport
    from troubleshooter.spec import SpecSource

    source = SpecSource.preset("mlp:in_features=8,hidden=8,depth=1,num_classes=2,batch_size=4")
    report = jobs_entry.check_report(source, device="cpu", only="alignment", steps=2)
    assert isinstance(report, CheckReport) and report.section("alignment")


READ_BACK = textwrap.dedent("""
    import pickle, sys
    report, speed = pickle.loads(open(sys.argv[1], "rb").read())
    from troubleshooter.engine import check_render as render
    from troubleshooter.ui import check, speedup
    check.skiprate_figure(report), report.to_dict()
    render.status_markdown(report, "page"), render.alignment_rows(report), render.headroom_rows(report)
    speedup.table_rows(speed), speedup.verdict_markdown(speed), speedup.figure(speed)
    print("torch imported:", "torch" in sys.modules)
""")


def test_a_report_read_back_and_rendered_in_the_server_imports_no_torch(tmp_path):
    """What a worker sends back (a pickled CheckReport, a speedup dict) holds no object whose
    class lives in a torch module: the engine's result classes are in engine/results.py and
    torch's version string is a plain str."""
    import pickle

    from troubleshooter import jobs_entry
    from troubleshooter.spec import SpecSource

    source = SpecSource.preset("mlp:in_features=8,hidden=8,depth=2,num_classes=2,batch_size=4")
    report = jobs_entry.check_report(source, device="cpu", steps=2)
    speed = jobs_entry.speedup_source(source, device="cpu", precisions=["fp32", "bf16"], budget_s=1.0)
    path = tmp_path / "results.pkl"
    path.write_bytes(pickle.dumps((report, speed)))
    out = subprocess.run([sys.executable, "-c", READ_BACK, str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "torch imported: False" in out.stdout
