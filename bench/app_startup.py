"""App start-up: `python app.py` against a bare Gradio app (one Markdown block), side by side.

Each round starts each server on a free loopback port, in rotating order, and measures
  - seconds until the page answers HTTP 200 (what a person waits for after starting it),
  - the server process's CPU seconds and resident memory (VmRSS) at that moment, and whether
    torch is loaded in it (its shared library in /proc/PID/maps),
then stops it. The bare app imports gradio and serves one block: the floor for a Gradio page.
`--baseline ROOT` adds another checkout's app.py (e.g. `git worktree add /tmp/old main`).
`--first-check` then sends each app one `/check` of `mlp` (2 steps, through gradio_client) and reads
the server again: the first answer's time, and whether the job left torch in the server.

    python bench/app_startup.py [--rounds 5] [--baseline /tmp/old] [--first-check] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BARE_APP = """import sys
import gradio as gr
with gr.Blocks() as demo:
    gr.Markdown("# bare")
demo.launch(server_name="127.0.0.1", server_port=int(sys.argv[1]))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _proc_facts(pid: int) -> dict:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    rss = next(int(line.split()[1]) for line in open(f"/proc/{pid}/status") if line.startswith("VmRSS:")) / 1024
    torch = any("libtorch" in line for line in open(f"/proc/{pid}/maps"))
    return {"cpu_s": cpu, "rss_mib": rss, "torch_loaded": torch}


def _first_check(port: int, pid: int) -> dict:
    from gradio_client import Client

    client = Client(f"http://127.0.0.1:{port}/", verbose=False)
    t0 = time.perf_counter()
    client.predict(preset="mlp", yaml_text="", spec_file=None, device="cpu", steps=2, api_name="/check")
    facts = _proc_facts(pid)
    return {"first_check_s": time.perf_counter() - t0, "rss_after_check_mib": facts["rss_mib"],
            "torch_after_check": facts["torch_loaded"]}


def start_once(cmd: list[str], cwd: str, port: int, timeout: float = 180, first_check: bool = False) -> dict:
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{cmd} exited with {proc.returncode}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.perf_counter() - t0 > timeout:
                raise RuntimeError(f"{cmd} did not answer within {timeout} s")
            time.sleep(0.05)
        ready = time.perf_counter() - t0
        facts = {"ready_s": ready, **_proc_facts(proc.pid)}
        return {**facts, **_first_check(port, proc.pid)} if first_check else facts
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--baseline", help="another checkout whose app.py to time beside this one")
    ap.add_argument("--first-check", action="store_true", help="then one /check of mlp per app server")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="app-startup-") as tmp:
        bare = Path(tmp) / "bare_app.py"
        bare.write_text(BARE_APP)
        apps = {"bare gradio": lambda port: ([sys.executable, str(bare), str(port)], tmp),
                "this app.py": lambda port: ([sys.executable, "app.py", "--port", str(port)], str(ROOT))}
        if args.baseline:
            apps["baseline app.py"] = lambda port: ([sys.executable, "app.py", "--port", str(port)], args.baseline)
        names = list(apps)
        runs: dict[str, list[dict]] = {n: [] for n in names}
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                port = _free_port()
                cmd, cwd = apps[name](port)
                runs[name].append(start_once(cmd, cwd, port, first_check=args.first_check and name != "bare gradio"))
    load = os.getloadavg()
    print(f"{platform.machine()}, {os.cpu_count()} CPU, Python {platform.python_version()}, load {load[0]:.1f}, "
          f"{args.rounds} rounds (medians)")
    med = {n: {k: statistics.median(x[k] for x in runs[n]) for k in ("ready_s", "cpu_s", "rss_mib")} for n in names}
    for n in names:
        torch = sorted({x["torch_loaded"] for x in runs[n]})
        each = " ".join(f"{x['ready_s']:.2f}" for x in runs[n])
        print(f"  {n:16s} ready {med[n]['ready_s']:5.2f} s  CPU {med[n]['cpu_s']:5.2f} s  RSS {med[n]['rss_mib']:6.0f} MiB"
              f"  torch loaded: {torch}   (ready per round: {each})")
    for n in names[1:] if args.first_check else ():
        check = statistics.median(x["first_check_s"] for x in runs[n])
        rss = statistics.median(x["rss_after_check_mib"] for x in runs[n])
        print(f"  {n:16s} first /check {check:5.2f} s, then RSS {rss:6.0f} MiB, torch loaded: "
              f"{sorted({x['torch_after_check'] for x in runs[n]})}")
    for n in names[1:]:
        print(f"  {n} / bare gradio: ready {med[n]['ready_s'] / med['bare gradio']['ready_s']:.2f}x, "
              f"RSS {med[n]['rss_mib'] / med['bare gradio']['rss_mib']:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": runs, "medians": med, "load": load}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
