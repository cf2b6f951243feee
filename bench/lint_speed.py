"""Linter speed: our AMP linter vs TorchFix on the same generated corpus, side by side in one run.

Generates >= 100k lines of training-script code (the lint fixtures: nanoGPT-like, timm-like, Trainer
classes, every rule's flagged and clean scripts, concatenated into ~1000-line files), then times
  - ours, in-process (`lint_paths` on the directory: read, parse, analyse, all 24 rules),
  - ours, the CLI (`python -m troubleshooter lint DIR --format json`, interpreter start included),
  - TorchFix CLI (`torchfix -j 1 DIR`: one process, like ours),
  - pyflakes, in-process (`pyflakes.api.checkRecursive`) and its CLI (`python -m pyflakes DIR`):
    a plain parse-and-scope linter, the floor a single-pass AST linter can hope for,
each the median of --repeat runs, and prints ms per 1000 lines and the ratios.

    python bench/lint_speed.py [--lines 100000] [--repeat 3] [--json out.json]
    python bench/lint_speed.py --lines 20000 --skip-torchfix --baseline /tmp/old   # before/after

--trees DIR [DIR ...] times real source trees side by side in one run instead (the issue-28 figures):
each tree's .py files copied once, then rounds of fresh processes in rotating order, CPU seconds of each
child from getrusage: ours (CLI, --no-cache, one process), ours again with a warm result cache (a second
run over the unchanged tree), a bare read + `ast.parse` of the same files (the floor any Python AST
linter pays), `ruff check --select ALL --silent --isolated --no-cache`, ruff again with its own cache
(`--cache-dir` in the temp folder, a second run over the unchanged tree: `ruff_cached`, to compare with
`ours_cached`), and `python -m pyflakes`; then the
start-up on one 16-line file (ours, pyflakes, ruff, a bare `python -c pass`). ruff and pyflakes are
optional (`pip install ruff pyflakes`); a missing one is skipped with the reason printed. Bytecode is
compiled first and PYTHONDONTWRITEBYTECODE dropped for the children, as in an installed package.
--same-as ROOT (with --trees) first checks that ROOT's `troubleshooter` (another version, e.g.
`git archive <rev> troubleshooter | tar -x -C ROOT`) gives byte-identical `lint --no-cache --format
json` output on each tree: speed work must change no finding.

    python bench/lint_speed.py --trees /tmp/corpora/nanogpt /tmp/corpora/timm --rounds 3 [--same-as /tmp/old] [--before /tmp/old]

--baseline ROOT (a folder holding another version's `troubleshooter/`, e.g. from
`git archive <rev> troubleshooter | tar -x -C ROOT`) adds rounds of fresh processes alternating
that version, this one and pyflakes on the same files: before/after and ours/pyflakes in one run.
TorchFix and pyflakes are optional (`pip install -r requirements-bench.txt`); without them only ours is timed.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
FIXTURES = ROOT / "tests" / "fixtures" / "lint"


def generate(out_dir: Path, min_lines: int, lines_per_file: int = 1000) -> tuple[int, int]:
    """Write realistic training scripts into out_dir; return (files, lines)."""
    sources = [p.read_text() for p in sorted(FIXTURES.glob("*.py"))]
    total = files = 0
    i = 0
    while total < min_lines:
        chunk, n = [], 0
        while n < lines_per_file:
            src = sources[i % len(sources)].replace("def train(", f"def train_{i}(")
            i += 1
            chunk.append(src)
            n += src.count("\n")
        (out_dir / f"train_{files:04d}.py").write_text("\n".join(chunk))
        files += 1
        total += n + len(chunk) - 1
    return files, total


CPU: dict[str, float] = {}


def _median_time(fn, repeat: int, label: str | None = None) -> float:
    """Median wall time; with `label`, also the median CPU seconds (this process + children) into CPU.

    CPU time is the fair comparison on a shared machine: wall time includes waiting for cores.
    """
    times, cpus = [], []
    for _ in range(repeat):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        c0 = time.process_time()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(time.process_time() - c0 + (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime))
    if label:
        CPU[label] = statistics.median(cpus)
    return statistics.median(times)


def _time_one(tool: str, root: str, folder: str) -> float:
    """CPU seconds of one in-process lint of `folder` (after one warm-up run) by `tool` imported from `root`."""
    if tool == "pyflakes":
        import io

        import pyflakes.api
        import pyflakes.reporter

        def run():
            pyflakes.api.checkRecursive([folder], pyflakes.reporter.Reporter(io.StringIO(), io.StringIO()))
    else:
        sys.path.insert(0, root)
        for name in [n for n in sys.modules if n == "troubleshooter" or n.startswith("troubleshooter.")]:
            del sys.modules[name]
        from troubleshooter.lint import lint_paths

        def run():
            lint_paths([folder])
    run()
    c0 = time.process_time()
    run()
    return time.process_time() - c0


def _baseline_rounds(baseline: str, folder: Path, rounds: int) -> dict[str, list[float]]:
    """Rounds of fresh processes, each timing one tool; the order of the three rotates every round."""
    tools = [("baseline", "ours", baseline), ("this", "ours", str(ROOT)), ("pyflakes", "pyflakes", "")]
    out: dict[str, list[float]] = {name: [] for name, _, _ in tools}
    for r in range(rounds):
        for name, tool, root in tools[r % 3:] + tools[:r % 3]:
            cmd = [sys.executable, str(Path(__file__).resolve()), "--time-one", tool, root or "-", str(folder)]
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            out[name].append(float(done.stdout.strip().splitlines()[-1]))
    return out


SMALL_FILE = '''"""A 16-line training snippet: the start-up comparison lints this one file."""
import torch
from torch import nn

model = nn.Linear(16, 4).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cuda")
for step in range(10):
    x = torch.randn(8, 16, device="cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(x).float().pow(2).mean()
    opt.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
'''

FLOOR = ("import ast, os, sys\n"
         "for d, _, fs in os.walk(sys.argv[1]):\n"
         "    for f in fs:\n"
         "        if f.endswith('.py'):\n"
         "            with open(os.path.join(d, f), 'rb') as fh:\n"
         "                ast.parse(fh.read())\n")


def _child_env() -> dict:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed package has its bytecode; so does this run
    return env


def _cpu_of(cmd: list[str], cwd: Path | None = None) -> tuple[float, subprocess.CompletedProcess]:
    """CPU seconds (user + system, all threads) of one child process, and its result."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(cmd, capture_output=True, cwd=cwd, env=_child_env())
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime), done


def _peers() -> tuple[dict[str, list[str]], list[str]]:
    """The peer tools found here, as command prefixes; and why the others are skipped."""
    found, skipped = {}, []
    ruff = shutil.which("ruff")
    if ruff:
        found["ruff"] = [ruff, "check", "--select", "ALL", "--silent", "--isolated", "--no-cache", "--exit-zero"]
    else:
        skipped.append("ruff: not installed (pip install ruff)")
    try:
        import pyflakes  # noqa: F401
        found["pyflakes"] = [sys.executable, "-m", "pyflakes"]
    except ImportError:
        skipped.append("pyflakes: not installed (pip install pyflakes)")
    return found, skipped


def _cached_ruff(ruff: list[str], cache_dir: Path) -> list[str]:
    """The ruff command with its own result cache in `cache_dir` instead of `--no-cache`."""
    return [a for a in ruff if a != "--no-cache"] + ["--cache-dir", str(cache_dir)]


def _ours(*args: str) -> list[str]:
    """Our CLI (run with cwd set to the checkout whose `troubleshooter` package it should use)."""
    return [sys.executable, "-m", "troubleshooter", "lint", "--format", "json", "--exit-zero", *args]


def _copy_py(tree: str, dest: Path) -> tuple[int, int]:
    """The tree's .py files alone (every tool sees the same files; pyflakes reads no notebooks)."""
    shutil.copytree(tree, dest, ignore=shutil.ignore_patterns(".*", "__pycache__"))
    for p in dest.rglob("*"):
        if p.is_file() and p.suffix != ".py":
            p.unlink()
    py = list(dest.rglob("*.py"))
    return len(py), sum(p.read_bytes().count(b"\n") for p in py)


def same_output(other_root: str, tree: Path) -> bool:
    """ROOT's troubleshooter and this one give byte-identical `lint --no-cache --format json` on tree."""
    outs = [subprocess.run(_ours("--no-cache", str(tree)), capture_output=True, cwd=root, env=_child_env()).stdout
            for root in (Path(other_root), ROOT)]
    if outs[0] != outs[1]:
        print(f"  DIFFERENT lint output on {tree.name} between {other_root} and this checkout")
        return False
    print(f"  same lint output on {tree.name} as {other_root} ({len(json.loads(outs[1])['findings'])} findings)")
    return True


def _rounds(tools: dict[str, list[str]], rounds: int, before: str | None = None) -> dict[str, list[float]]:
    """CPU seconds of each tool, `rounds` times, the order rotating every round (load drifts). The tool
    named "before" runs in the `before` checkout (another version of our package)."""
    cpu: dict[str, list[float]] = {k: [] for k in tools}
    names = list(tools)
    for r in range(rounds):
        for k in names[r % len(names):] + names[:r % len(names)]:
            cpu[k].append(_cpu_of(tools[k], Path(before) if k == "before" else ROOT)[0])
    return cpu


def time_trees(trees: list[str], rounds: int, same_as: str | None, before: str | None = None) -> dict:
    """Side-by-side CPU seconds per tree (median of `rounds` rotating rounds) and their ratios."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "troubleshooter")],
                   capture_output=True, env=_child_env())
    peers, skipped = _peers()
    for why in skipped:
        print(f"skipped {why}")
    results: dict = {"trees": {}, "skipped": skipped, "python": platform.python_version(),
                     "machine": f"{platform.machine()}, {os.cpu_count()} CPU", "rounds": rounds,
                     "loadavg_start": os.getloadavg()}
    if "ruff" in peers:
        results["ruff_version"] = subprocess.run([peers["ruff"][0], "--version"], capture_output=True,
                                                 text=True).stdout.strip()
    tmp = Path(tempfile.mkdtemp(prefix="lint_trees_"))
    try:
        for tree in trees:
            name = Path(tree).name
            work = tmp / name
            files, lines = _copy_py(tree, work)
            if same_as and not same_output(same_as, work):
                results.setdefault("different", []).append(name)
            cache = tmp / f"cache_{name}"
            tools = {"ours": _ours("--no-cache", str(work)),
                     **({"before": _ours("--no-cache", str(work))} if before else {}),
                     "ours_cached": _ours("--cache-dir", str(cache), str(work)),
                     "floor": [sys.executable, "-c", FLOOR, str(work)],
                     **{k: v + [str(work)] for k, v in peers.items()}}
            if "ruff" in peers:  # the command as people run it: with ruff's own cache (warm, like ours_cached)
                tools["ruff_cached"] = _cached_ruff(peers["ruff"], tmp / f"ruff_cache_{name}") + [str(work)]
            for warm in ("ours_cached", "ruff_cached"):
                if warm in tools:
                    _cpu_of(tools[warm], ROOT)  # fills the cache: every timed cached run is a second run
            cpu = _rounds(tools, rounds, before)
            med = {k: statistics.median(v) for k, v in cpu.items()}
            ratios = {f"ours/{k}": med["ours"] / med[k] for k in med if k not in ("ours", "ruff_cached")}
            ratios["ours_cached/floor"] = med["ours_cached"] / med["floor"]
            if "ruff_cached" in med:  # like for like, both warm; the cold ratio above stays ours / ruff --no-cache
                ratios["ours_cached/ruff_cached"] = med["ours_cached"] / med["ruff_cached"]
            results["trees"][name] = {"files": files, "lines": lines, "cpu_s": med, "runs": cpu, "ratios": ratios,
                                      "files_per_cpu_s": {k: files / v for k, v in med.items() if v}}
            print(f"{name}: {files} files, {lines} lines; CPU s (median of {rounds}): "
                  + ", ".join(f"{k} {v:.2f}" for k, v in med.items()))
            print("  " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
        small = tmp / "small16.py"
        small.write_text(SMALL_FILE)
        tools = {"ours": _ours("--no-cache", str(small)),
                 **({"before": _ours("--no-cache", str(small))} if before else {}), "python -c pass": [sys.executable, "-c", "pass"],
                 **{k: v + [str(small)] for k, v in peers.items()}}
        n = max(rounds, 9)
        med = {k: statistics.median(v) for k, v in _rounds(tools, n, before).items()}
        results["small_file"] = {"cpu_s": med, "ratios": {f"ours/{k}": med["ours"] / med[k] for k in med if k != "ours"}}
        print(f"one 16-line file, CPU s (median of {n}): " + ", ".join(f"{k} {v:.3f}" for k, v in med.items()))
        print("  " + ", ".join(f"{k} {v:.2f}x" for k, v in results["small_file"]["ratios"].items()))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    results["loadavg_end"] = os.getloadavg()
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--skip-torchfix", action="store_true", help="do not time TorchFix (it takes minutes)")
    ap.add_argument("--dir", help="time these existing files (a real source tree) instead of generated ones")
    ap.add_argument("--baseline", help="folder with another version's troubleshooter/ package to compare against")
    ap.add_argument("--trees", nargs="+", metavar="DIR", help="time these source trees side by side (see above)")
    ap.add_argument("--rounds", type=int, default=3, help="with --trees: rotating rounds per tree (median)")
    ap.add_argument("--same-as", metavar="ROOT", help="with --trees: check ROOT's troubleshooter gives the same output")
    ap.add_argument("--before", metavar="ROOT", help="with --trees: also time ROOT's troubleshooter (cold) in the same rounds")
    ap.add_argument("--time-one", nargs=3, metavar=("TOOL", "ROOT", "DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.time_one:
        print(_time_one(*args.time_one))
        return 0
    if args.trees:
        results = time_trees(args.trees, args.rounds, args.same_as, args.before)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2))
        return 1 if results.get("different") else 0

    from troubleshooter.lint import lint_paths

    tmp = Path(tempfile.mkdtemp(prefix="lint_bench_"))
    try:
        if args.dir:
            shutil.rmtree(tmp)
            shutil.copytree(args.dir, tmp, ignore=shutil.ignore_patterns(".*", "__pycache__"))
            for p in tmp.rglob("*"):  # the same .py files for every tool (pyflakes reads no notebooks)
                if p.is_file() and p.suffix != ".py":
                    p.unlink()
            py = list(tmp.rglob("*.py"))
            files, lines = len(py), sum(p.read_bytes().count(b"\n") for p in py)
        else:
            files, lines = generate(tmp, args.lines)
        kl = lines / 1000
        results = {"files": files, "lines": lines, "python": platform.python_version(),
                   "machine": f"{platform.machine()}, {os.cpu_count()} CPU", "repeat": args.repeat}
        findings = {}

        def ours_api():
            findings["n"] = len(lint_paths([str(tmp)]).findings)

        results["ours_api_s"] = _median_time(ours_api, args.repeat, "ours_api")
        results["ours_findings"] = findings["n"]
        cmd = [sys.executable, "-m", "troubleshooter", "lint", str(tmp), "--format", "json", "--no-cache"]
        results["ours_cli_s"] = _median_time(lambda: subprocess.run(cmd, capture_output=True, cwd=ROOT), args.repeat,
                                             "ours_cli")
        startup = [sys.executable, "-m", "troubleshooter", "--version"]
        results["ours_cli_startup_s"] = _median_time(lambda: subprocess.run(startup, capture_output=True, cwd=ROOT),
                                                     args.repeat)
        try:
            import io

            import pyflakes
            import pyflakes.api
            import pyflakes.reporter

            def pyflakes_api():
                pyflakes.api.checkRecursive([str(tmp)], pyflakes.reporter.Reporter(io.StringIO(), io.StringIO()))

            results["pyflakes_version"] = pyflakes.__version__
            # Interleaved ours/pyflakes in-process CPU times: on a shared machine load changes between
            # blocks of runs, so alternate the two tools and compare medians of the alternation.
            pairs = {"ours": [], "pyflakes": []}
            for _ in range(max(args.repeat, 5)):
                for name, fn in (("ours", lambda: lint_paths([str(tmp)])), ("pyflakes", pyflakes_api)):
                    c0 = time.process_time()
                    fn()
                    pairs[name].append(time.process_time() - c0)
            results["interleaved_cpu_s"] = {k: statistics.median(v) for k, v in pairs.items()}
            results["pyflakes_api_s"] = _median_time(pyflakes_api, args.repeat, "pyflakes_api")
            pf_cmd = [sys.executable, "-m", "pyflakes", str(tmp)]
            results["pyflakes_cli_s"] = _median_time(lambda: subprocess.run(pf_cmd, capture_output=True),
                                                     args.repeat, "pyflakes_cli")
        except ImportError:
            pass
        if args.baseline:
            results["baseline_rounds_cpu_s"] = _baseline_rounds(args.baseline, tmp, max(args.repeat, 5))
        tf = None if args.skip_torchfix else shutil.which("torchfix")
        if tf:
            results["torchfix_version"] = subprocess.run([tf, "--version"], capture_output=True, text=True).stdout.strip()
            results["torchfix_j1_s"] = _median_time(
                lambda: subprocess.run([tf, "-j", "1", str(tmp)], capture_output=True), args.repeat, "torchfix_j1")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    results["cpu_s"] = dict(CPU)
    print(f"corpus: {files} files, {lines} lines ({results['machine']}, Python {results['python']}, "
          f"median of {args.repeat})")
    print(f"ours (API, in-process)   {results['ours_api_s']:7.2f} s  {1000 * results['ours_api_s'] / kl:7.2f} ms/1k lines"
          f"  ({results['ours_findings']} findings)")
    print(f"ours (CLI, incl. start)  {results['ours_cli_s']:7.2f} s  {1000 * results['ours_cli_s'] / kl:7.2f} ms/1k lines"
          f"  (CLI start alone {results['ours_cli_startup_s']:.2f} s)")
    if "pyflakes_api_s" in results:
        cpu = CPU
        print(f"pyflakes (API)           {results['pyflakes_api_s']:7.2f} s  "
              f"{1000 * results['pyflakes_api_s'] / kl:7.2f} ms/1k lines  (pyflakes {results['pyflakes_version']})")
        print(f"pyflakes (CLI)           {results['pyflakes_cli_s']:7.2f} s  "
              f"{1000 * results['pyflakes_cli_s'] / kl:7.2f} ms/1k lines")
        results["cpu_ratio_api_vs_pyflakes"] = cpu["ours_api"] / cpu["pyflakes_api"]
        results["cpu_ratio_cli_vs_pyflakes"] = cpu["ours_cli"] / cpu["pyflakes_cli"]
        inter = results["interleaved_cpu_s"]
        results["cpu_ratio_interleaved_vs_pyflakes"] = inter["ours"] / inter["pyflakes"]
        print(f"ours/pyflakes CPU time: API {results['cpu_ratio_api_vs_pyflakes']:.2f}, "
              f"CLI {results['cpu_ratio_cli_vs_pyflakes']:.2f}; interleaved in-process "
              f"{inter['ours']:.2f} s / {inter['pyflakes']:.2f} s = {results['cpu_ratio_interleaved_vs_pyflakes']:.2f}"
              "  (target <= 2)")
    else:
        print("pyflakes not installed: pip install -r requirements-bench.txt to compare")
    if "torchfix_j1_s" in results:
        print(f"torchfix -j 1            {results['torchfix_j1_s']:7.2f} s  "
              f"{1000 * results['torchfix_j1_s'] / kl:7.2f} ms/1k lines  ({results['torchfix_version']})")
        results["ratio_api_vs_torchfix_j1"] = results["ours_api_s"] / results["torchfix_j1_s"]
        results["ratio_cli_vs_torchfix_j1"] = results["ours_cli_s"] / results["torchfix_j1_s"]
        print(f"ours/torchfix wall time: API {results['ratio_api_vs_torchfix_j1']:.3f}, "
              f"CLI {results['ratio_cli_vs_torchfix_j1']:.3f}  (target <= 0.25)")
        cpu = results["cpu_s"]
        results["cpu_ratio_api"] = cpu["ours_api"] / cpu["torchfix_j1"]
        results["cpu_ratio_cli"] = cpu["ours_cli"] / cpu["torchfix_j1"]
        print(f"CPU seconds: ours API {cpu['ours_api']:.2f} ({1000 * cpu['ours_api'] / kl:.1f} ms/1k), "
              f"ours CLI {cpu['ours_cli']:.2f}, torchfix {cpu['torchfix_j1']:.2f} ({1000 * cpu['torchfix_j1'] / kl:.1f} ms/1k)"
              f" -> ratio API {results['cpu_ratio_api']:.3f}, CLI {results['cpu_ratio_cli']:.3f}")
    else:
        print("torchfix not timed (--skip-torchfix) or not installed: pip install -r requirements-bench.txt")
    if "baseline_rounds_cpu_s" in results:
        med = {k: statistics.median(v) for k, v in results["baseline_rounds_cpu_s"].items()}
        results["baseline_median_cpu_s"] = med
        print(f"fresh-process rounds, CPU s (median of {len(results['baseline_rounds_cpu_s']['this'])}): "
              f"baseline {med['baseline']:.3f}, this {med['this']:.3f}, pyflakes {med['pyflakes']:.3f} -> "
              f"this/baseline {med['this'] / med['baseline']:.2f}, baseline/pyflakes {med['baseline'] / med['pyflakes']:.2f}, "
              f"this/pyflakes {med['this'] / med['pyflakes']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
