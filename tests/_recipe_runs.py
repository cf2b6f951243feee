"""Run generated recipes in ONE process (torch is imported once) and report what each run printed.

Used by tests/test_recipes_convergence.py: `python tests/_recipe_runs.py OUT_DIR SPEC_JSON` where the
spec is a list of {"name", "options" (render_recipe keywords), "argv" (the script's command line)}, and
optionally "half_copy": [SRC, DST] (before the run, save a float16 copy of the weights in SRC as DST:
the half-precision checkpoint a user starts from).
Each script runs as `__main__` through runpy, as `python train.py ...` would; its stdout is captured
and a SystemExit other than 0 is reported. Prints one JSON object: name -> {"stdout", "exit"}.
"""
from __future__ import annotations

import contextlib
import io
import json
import runpy
import sys
from pathlib import Path


def main(out_dir: str, spec_json: str) -> None:
    import torch

    from troubleshooter import recipes

    torch.set_num_threads(1)  # the suite runs on 2 shared cores; one thread per run is also deterministic
    results = {}
    for run in json.loads(Path(spec_json).read_text()):
        if run.get("half_copy"):
            src, dst = run["half_copy"]
            state = torch.load(src, map_location="cpu", weights_only=True)
            torch.save({k: v.half() if v.is_floating_point() else v for k, v in state.items()}, dst)
        script = Path(out_dir) / f"{run['name']}.py"
        script.write_text(recipes.render_recipe(**run["options"]))
        buffer, code = io.StringIO(), 0
        sys.argv = [str(script), *run["argv"]]
        with contextlib.redirect_stdout(buffer):
            try:
                runpy.run_path(str(script), run_name="__main__")
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
        results[run["name"]] = {"stdout": buffer.getvalue(), "exit": code}
    print(json.dumps(results))


if __name__ == "__main__":
    main(*sys.argv[1:3])
