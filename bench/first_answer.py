"""Check and speedup: time to the first answer, through the CLI and through the page's API (issue 28).

Each round runs, for every code tree given (this checkout, and `--base ROOT`, another checkout
such as `git worktree add /tmp/base 6f8d670`), in rotating order:
  - `python -m troubleshooter check --preset P --format json` for each preset (default: the
    presets the page lists), with that tree's default options;
  - `python -m troubleshooter speedup --preset P --format json` with its defaults;
  - through the API of `python app.py` (started once per tree on a free loopback port, before
    the rounds): `/check` and `/speedup` with the page's default settings (the page's first
    preset, every check, its default steps and budget).
Per run: wall seconds, CPU seconds (the child's rusage; for the API, the server's process tree),
the load average at the start, the check's own `timings_s`, `budget.cut`, the finding ids and
the speedup's verdict level, `stopped_because` and `time_spent_s`. `--busy N` adds N processes spinning on the
CPU for the whole bench (the "2 busy cores" condition). `--stages` profiles one in-process
check (torch import, model build, each check) instead.

    python bench/first_answer.py [--rounds 3] [--base /tmp/base] [--busy 2] [--json out.json]
    python bench/first_answer.py --stages --preset gpt
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE_PRESETS = ("mlp", "cnn", "gpt", "bert", "vit")  # spec/presets/catalogue.py, in the page's order
ENV = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONUNBUFFERED": "1"}


@contextlib.contextmanager
def busy(burners: int):
    """`burners` child processes spinning on the CPU for the duration (none for 0)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(burners)]
    try:
        time.sleep(0.5 if procs else 0)
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _check_facts(out: dict) -> dict:
    return {"exit_code": out.get("exit_code"), "timings_s": out.get("timings_s"),
            "cut": (out.get("budget") or {}).get("cut"), "budget_s": (out.get("budget") or {}).get("budget_s"),
            "findings": sorted({(f["rule"], f.get("severity"), (f.get("location") or {}).get("module")
                                 if isinstance(f.get("location"), dict) else f.get("module"), f.get("precision"))
                                for f in out.get("findings") or []}, key=str),
            "errors": {k: v.get("kind") for k, v in (out.get("errors") or {}).items()},
            "first_answer": out.get("first_answer")}


def _speedup_facts(out: dict) -> dict:
    st, v = out.get("settings") or {}, out.get("verdict") or {}
    return {"budget_s": st.get("budget_s"), "elapsed_s": st.get("elapsed_s"), "rounds": st.get("rounds"),
            "stopped_because": st.get("stopped_because"), "level": v.get("level"),
            "inconclusive_because": v.get("inconclusive_because"), "budget_exceeded_s": st.get("budget_exceeded_s"),
            "time_spent_s": st.get("time_spent_s")}


def cli_run(tree: Path, command: str, preset: str, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "troubleshooter", command, "--preset", preset, "--format", "json", *extra]
    load = os.getloadavg()[0]
    cpu0, t0 = _children_cpu(), time.perf_counter()
    proc = subprocess.run(cmd, cwd=tree, env=ENV, capture_output=True, text=True, timeout=900)
    wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    row = {"via": "cli", "command": command, "preset": preset, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
           "load": round(load, 2), "rc": proc.returncode}
    try:
        out = json.loads(proc.stdout)
    except json.JSONDecodeError:
        row["error"] = (proc.stderr or proc.stdout)[-400:]
        return row
    row.update(_check_facts(out) if command == "check" else _speedup_facts(out))
    return row


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`python app.py` of one tree, up until closed; CPU of its whole process tree via psutil."""

    def __init__(self, tree: Path):
        import urllib.request

        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.log = open(f"/tmp/first_answer_server_{self.port}.log", "w")
        self.proc = subprocess.Popen([sys.executable, "app.py", "--host", "127.0.0.1", "--port", str(self.port)],
                                     cwd=tree, env=ENV, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 180
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"app.py in {tree} exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(self.url, timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"app.py in {tree} did not answer")
            time.sleep(0.2)
        from gradio_client import Client

        self.client = Client(self.url, verbose=False)

    def cpu(self) -> float:
        """CPU seconds of the server and its live children, plus the children that have exited
        (psutil's `children_*` counters of each live process)."""
        import psutil

        total = 0.0
        try:
            root = psutil.Process(self.proc.pid)
            for p in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    t = p.cpu_times()
                    total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            pass
        return total

    def call(self, api: str, **kwargs) -> dict:
        load = os.getloadavg()[0]
        cpu0, t0 = self.cpu(), time.perf_counter()
        text, _png = self.client.predict(api_name=api, **kwargs)
        wall, cpu = time.perf_counter() - t0, self.cpu() - cpu0
        out = json.loads(text)
        row = {"via": "api", "command": api.strip("/"), "preset": kwargs.get("preset"), "wall_s": round(wall, 2),
               "cpu_s": round(cpu, 2), "load": round(load, 2)}
        row.update(_check_facts(out) if api == "/check" else _speedup_facts(out))
        return row

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.log.close()


def stages(preset: str, budget: float | None) -> dict:
    """Where one in-process check's time goes: imports, model build, each check."""
    t0 = time.perf_counter()
    import torch  # noqa: F401
    t_torch = time.perf_counter()
    import torch._dynamo  # noqa: F401  (optimizer steps import it on their first call)
    t_dynamo = time.perf_counter()
    sys.path.insert(0, str(ROOT))
    from troubleshooter.engine.check import run_check
    from troubleshooter.spec import SpecSource, load_workload
    t_engine = time.perf_counter()
    workload = load_workload(SpecSource.preset(preset))
    t_build = time.perf_counter()
    result = run_check(workload, device="cpu", budget_s=budget)
    t_end = time.perf_counter()
    return {"preset": preset, "import_torch_s": round(t_torch - t0, 2), "import_dynamo_s": round(t_dynamo - t_torch, 2),
            "import_engine_s": round(t_engine - t_dynamo, 2), "load_workload_s": round(t_build - t_engine, 2),
            "checks_s": result["timings_s"], "run_check_s": round(t_end - t_build, 2),
            "cut": result["budget"]["cut"], "load": round(os.getloadavg()[0], 2)}


def _summary(rows: list[dict]) -> list[dict]:
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["tree"], r["via"], r["command"], r["preset"]), []).append(r)
    out = []
    for (tree, via, command, preset), rs in groups.items():
        walls, cpus = [r["wall_s"] for r in rs], [r["cpu_s"] for r in rs]
        out.append({"tree": tree, "via": via, "command": command, "preset": preset, "n": len(rs),
                    "wall_median_s": round(statistics.median(walls), 1), "wall_max_s": round(max(walls), 1),
                    "cpu_median_s": round(statistics.median(cpus), 1),
                    "load": [r["load"] for r in rs]})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--base", type=Path, help="another checkout to run side by side (e.g. /tmp/base)")
    ap.add_argument("--presets", default=",".join(PAGE_PRESETS), help="presets for the CLI check")
    ap.add_argument("--speedup-presets", default="mlp,gpt", help="presets for the CLI speedup")
    ap.add_argument("--no-api", action="store_true", help="skip the page's API runs")
    ap.add_argument("--no-cli", action="store_true", help="skip the CLI runs")
    ap.add_argument("--busy", type=int, default=0, help="CPU-spinning processes for the whole bench")
    ap.add_argument("--stages", action="store_true", help="profile one in-process check instead")
    ap.add_argument("--preset", default="gpt", help="with --stages")
    ap.add_argument("--budget", type=float, default=None, help="with --stages (default: no limit)")
    ap.add_argument("--json", type=Path, help="write every row here")
    args = ap.parse_args(argv)
    # stopped with SIGTERM or SIGINT (ignored by default in a background job), the servers and
    # spinners are still stopped by the `finally` blocks
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sys.exit(143))
    with busy(args.busy):
        if args.stages:
            print(json.dumps(stages(args.preset, args.budget), indent=1))
            return 0
        trees = {"this": ROOT, **({"base": args.base.resolve()} if args.base else {})}
        print(f"# {platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
              f"busy={args.busy}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
        servers = {} if args.no_api else {name: Server(path) for name, path in trees.items()}
        rows: list[dict] = []
        try:
            for rnd in range(args.rounds):
                order = list(trees)[rnd % len(trees):] + list(trees)[:rnd % len(trees)]
                for name in order:
                    jobs = []
                    if not args.no_cli:
                        jobs += [("check", p) for p in args.presets.split(",") if p]
                        jobs += [("speedup", p) for p in args.speedup_presets.split(",") if p]
                    if not args.no_api:
                        jobs += [("api_check", "mlp"), ("api_speedup", "mlp")]
                    for what, preset in jobs:
                        if what.startswith("api_"):  # the page's defaults: only the model is given
                            row = servers[name].call(f"/{what[4:]}", preset=preset)
                        else:
                            row = cli_run(trees[name], what, preset, [])
                        row.update(tree=name, round=rnd)
                        rows.append(row)
                        print(json.dumps(row), flush=True)
        finally:
            for s in servers.values():
                s.close()
    summary = _summary(rows)
    print("\n# summary (median over rounds)")
    for s in summary:
        print(json.dumps(s))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "summary": summary, "busy": args.busy,
                                         "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                       time.gmtime())}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
