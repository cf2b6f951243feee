"""One command that measures every GPU path of the product and writes its own results.

    python bench/gpu_suite.py --out DIR                  # on a CUDA GPU: DIR/gpu_suite.json and .md
    python bench/gpu_suite.py --dry-run-cpu --out DIR    # the same code paths on a CPU, tiny sizes
    python bench/gpu_suite.py --out DIR --only speedup_compile,recipe_compile   # a part
    python bench/gpu_suite.py --merge A/gpu_suite.json B/gpu_suite.json --out DIR
    python bench/gpu_suite.py --list

Sections (issue 9's list): capability against nvidia-smi and torch; the bf16 matmul ceiling;
the speedup check on GPT-2 small and the CNN twice, eager and compiled, against
torch.utils.benchmark; check on GPT-2 small, cnn, vit and the overflow/underflow fixtures
against the CPU; the generated recipes' throughput and MFU; nanhunt's overhead; a profile of
GPT-2 small's bf16 step; trace on recipes and on nanoGPT; the app through gradio_client with two
queued speedups. Every step is
guarded (a failure is recorded, the rest runs) and both files are rewritten after each step,
so a run stopped by a time limit still leaves what it measured. `--time-limit` (default 470 s on
a GPU) keeps the whole run under 8 minutes: a section whose estimate would not fit is listed as
not run, with the `--only` command that runs it. gradio and pydantic come from bench/wheels/
(bench/fetch_wheels.sh) when they are not installed. How to run it on the lent GPU machine:
docs/gpu_suite.md. Exit status: 0 every section ok or skipped, 1 a section failed or was not
run, 2 bad usage or no GPU without --dry-run-cpu.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # the package and the bench scripts it builds on

from gpusuite import env as suite_env  # noqa: E402  (no torch: the wheels go on the path first)

DEFAULT_TIME_LIMIT_S = 470.0  # under 8 minutes with the interpreter's start and the wheels' install


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="bench/gpu_suite.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="folder for gpu_suite.json and gpu_suite.md")
    ap.add_argument("--dry-run-cpu", action="store_true",
                    help="run every section on the CPU with tiny sizes (marked 'cpu dry run'): proves the suite works")
    ap.add_argument("--only", help="comma-separated sections to run (env always runs); see --list")
    ap.add_argument("--skip", help="comma-separated sections to leave out")
    ap.add_argument("--device", default="cuda:0", help="the GPU to measure (default cuda:0)")
    ap.add_argument("--time-limit", type=float, default=None, metavar="S",
                    help=f"end the run within S seconds (default {DEFAULT_TIME_LIMIT_S:g} on a GPU, none in a dry run)")
    ap.add_argument("--wheels", type=Path, default=suite_env.WHEELS_DIR,
                    help="wheels for gradio/pydantic when they are missing (default bench/wheels)")
    ap.add_argument("--site", type=Path, default=Path(tempfile.gettempdir()) / "amp-gpu-suite-site",
                    help="where those wheels are installed (pip --target)")
    ap.add_argument("--app-url", help="drive this running app instead of starting one (the tests share theirs)")
    ap.add_argument("--merge", nargs="+", type=Path, metavar="JSON",
                    help="combine the gpu_suite.json of several runs (e.g. two device calls) into --out")
    ap.add_argument("--list", action="store_true", help="list the sections and exit")
    args = ap.parse_args(argv)
    if not args.list and args.out is None:
        ap.error("--out DIR is required")
    return args


def _names(text: str | None) -> list[str] | None:
    return [n.strip() for n in text.split(",") if n.strip()] if text else None


@contextlib.contextmanager
def one_thread_each(on: bool):
    """A dry run's processes (this one, the recipes' and traces' children) use one CPU thread:
    its models are tiny, and on a shared 2-core machine two threads per process spin against
    each other (a tiny step took 85-158 ms with two, 8-12 ms with one)."""
    if not on:
        yield
        return
    import torch

    threads, omp = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        if omp is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = omp


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from gpusuite import runner

    if args.merge:
        reports = [json.loads(p.read_text()) for p in args.merge]
        try:
            runner.write_outputs(args.out, runner.merge(reports))
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"merged {len(reports)} runs into {args.out / runner.MD_NAME}")
        return 0
    packages = suite_env.bring_packages(args.wheels, args.site)  # before anything imports torch
    from gpusuite import sections, sizes

    if args.list:
        for s in sections.SECTIONS:
            print(f"{s.name:<16} ~{s.estimate_s:>4.0f} s  {s.what}")
        return 0
    try:
        chosen = sections.select(_names(args.only), _names(args.skip))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import torch

    if not args.dry_run_cpu and not torch.cuda.is_available():
        print("error: no CUDA GPU here; nothing would be a GPU measurement. Use --dry-run-cpu to check the "
              "suite on this CPU.", file=sys.stderr)
        return 2
    mode = runner.DRY_RUN if args.dry_run_cpu else runner.GPU
    device = "cpu" if args.dry_run_cpu else str(torch.device(args.device))
    time_limit = args.time_limit
    if time_limit is None and not args.dry_run_cpu:
        time_limit = DEFAULT_TIME_LIMIT_S
    smi = suite_env.nvidia_smi()
    environment = suite_env.environment(smi, packages)
    ctx = runner.Context(mode=mode, device=device, sizes=sizes.DRY_RUN if args.dry_run_cpu else sizes.GPU,
                         out_dir=args.out, packages=packages, results={}, app_url=args.app_url,
                         environment=environment)
    argv_used = list(sys.argv[1:] if argv is None else argv)
    with one_thread_each(args.dry_run_cpu):
        report = runner.Suite(ctx, chosen, environment, argv_used, time_limit).run()
    for name in report["order"]:
        sec = report["sections"][name]
        print(f"{name:<16} {sec['status']:<11} {sec['elapsed_s'] or 0:>7.1f} s  {sec.get('reason') or ''}")
    print(f"wrote {args.out / runner.JSON_NAME} and {args.out / runner.MD_NAME}")
    bad = [n for n in report["order"] if report["sections"][n]["status"] not in ("ok", "skipped")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
