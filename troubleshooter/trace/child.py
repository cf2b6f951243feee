"""The child process: run the user's script as `python SCRIPT ARGS` would, with observers on.

    python -m troubleshooter.trace.child CONFIG.json

CONFIG names the script, its arguments, the step count, the options and the file the result is
written to. The script runs in this interpreter (its folder first on sys.path, sys.argv set,
`__name__ == "__main__"`); after N optimizer steps the next call that starts a new step raises
`TraceStop` into it. The result (events, violations, numerics, how it ended) is written as JSON,
also as throttled snapshots while it runs so a hard kill still leaves the steps seen so far.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback


def main(config_path: str) -> None:
    with open(config_path) as fh:
        cfg = json.load(fh)
    script = cfg["script"]
    sys.argv = [cfg["argv0"], *cfg["args"]]
    sys.path[0] = os.path.dirname(os.path.realpath(script))

    import torch  # noqa: F401 - imported before the script so the observers are in place

    from .locate import caused_by_tool, script_traceback, user_frame_of_traceback
    from .numerics import Numerics
    from .patches import install
    from .recorder import STEADY_AFTER, Recorder, TraceStop, TraceTimeout

    rec = Recorder(cfg["steps"], steady_after=STEADY_AFTER if cfg.get("steady", True) else 0)
    numerics = Numerics(rec, nan=cfg["nan"], headroom=cfg["headroom"])
    writer = _Writer(cfg["result"], rec, numerics)
    writer.policy = _autocast_policy(cfg.get("autocast_policy", "cuda"))

    def on_step(r, step):
        numerics.on_step(r, step)
        writer.snapshot()

    def stop_at_next_forward():
        torch.nn.modules.module.register_module_forward_pre_hook(lambda m, a: rec.maybe_stop())

    rec.on_step = on_step
    rec.on_stop_pending = stop_at_next_forward
    handles = install(rec)  # noqa: F841 - kept alive while the script runs
    from . import frameworks
    frameworks.install(rec)  # Accelerate, Lightning/Fabric, HF Trainer, FSDP: what they were asked and did

    def on_term(signum, frame):
        raise TraceTimeout()

    signal.signal(signal.SIGTERM, on_term)
    if cfg.get("distributed"):  # trace --nproc: one rank of several (trace/rank.py)
        from .rank import install_rank
        install_rank(rec, cfg["distributed"], writer)
    exit_info: dict = {"status": "finished", "exception": None, "code": 0}
    import runpy

    from ..heap import freeze_imports

    freeze_imports()  # torch and the tracer stay for the whole run: the script's collections skip them
    try:
        runpy.run_path(script, run_name="__main__")
    except TraceStop:
        exit_info["status"] = "stopped"
    except TraceTimeout as exc:
        path, line = user_frame_of_traceback(exc.__traceback__)
        exit_info.update(status="timeout", where={"path": path, "line": line})
    except SystemExit as exc:
        code = exc.code
        if code not in (None, 0):
            path, line = user_frame_of_traceback(exc.__traceback__)
            exit_info.update(status="exited", code=code if isinstance(code, int) else 1,
                             message=None if isinstance(code, int) else str(code),
                             where={"path": path, "line": line}, step=rec.steps)
    except BaseException as exc:  # noqa: BLE001 - the script's own failure is what we report
        path, line = user_frame_of_traceback(exc.__traceback__)
        exit_info.update(status="raised", code=1, exception={
            "type": type(exc).__name__, "message": str(exc)[:2000], "path": path, "line": line,
            "traceback": script_traceback(exc)[-6000:], "step": rec.steps})
        if caused_by_tool(exc):  # our bug, not the script's: kept whole for a bug report
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            exit_info["exception"].update(caused_by_tool=True, tool_traceback=tb[-6000:])
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    writer.final(exit_info)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no atexit handlers or non-daemon threads of the script may hold us here


class _Writer:
    """Writes the result file: throttled snapshots while running, the final one at the end."""

    def __init__(self, path: str, rec, numerics):
        self.path = path
        self.rec = rec
        self.numerics = numerics
        self.last = 0.0
        self.sections: dict = {}  # name -> callable adding a section (trace --nproc: "distributed")

    def payload(self, exit_info: dict | None) -> dict:
        rec = self.rec
        return {"steps_observed": rec.steps, "timeline": rec.timeline, "series": rec.series,
                "violations": rec.violations, "numerics": self.numerics.result(),
                "scheduler_after_scaler_steps": rec.scheduler_after_scaler_steps,
                "scheduler_where": rec.scheduler_where, "scaler_step_where": rec.scaler_step_where,
                "scaler_steps": rec.scaler_steps, "device": _device_used(rec), "precision": rec.precision_seen(),
                "exit": exit_info, "final": exit_info is not None, "framework": _framework_result(),
                "autocast_policy": self._policy(), "step_unit": rec.step_unit, "overhead": rec.overhead(),
                "steady": {"enabled": bool(rec.steady_after), "after": rec.steady_after or None,
                           "steps": rec.steady_steps}}

    policy: tuple = ("host", None)

    def _policy(self) -> dict:
        from ..engine.autocast_policy import describe

        name, run = self.policy
        return describe(run, name, (_device_used(self.rec).get("type") or "cpu"))

    def _write(self, exit_info: dict | None) -> None:
        from ..jsonsafe import jsonable
        tmp = self.path + ".tmp"
        payload = self.payload(exit_info)
        payload.update({name: section() for name, section in self.sections.items()})
        with open(tmp, "w") as fh:
            json.dump(jsonable(payload), fh)
        os.replace(tmp, self.path)

    every = 1.0  # seconds between snapshots; longer once a write takes long (see snapshot)

    def snapshot(self) -> None:
        now = time.monotonic()
        if now - self.last >= self.every:
            try:
                self._write(None)
            except Exception:  # noqa: BLE001 - a snapshot is best effort
                pass
            # the timeline grows with the steps and each snapshot writes all of it: keep the
            # writes under 2% of the run (a long trace of short steps would pay more and more)
            self.last = time.monotonic()
            self.every = max(1.0, 50 * (self.last - now))

    def final(self, exit_info: dict) -> None:
        self._write(exit_info)


def _autocast_policy(name: str) -> tuple:
    """CUDA autocast's op lists for the script's CPU autocast regions, on a host without a GPU
    (`--autocast-policy cuda`, the default): the trace then answers for the user's GPU."""
    import torch

    from ..engine.autocast_policy import PolicyRun, cuda_op_lists, install

    if name != "cuda" or torch.cuda.is_available():
        return (name, None)
    return (name, install(PolicyRun(cuda_op_lists())).run)


def _framework_result() -> dict:
    from . import frameworks
    return frameworks.result()


def _device_used(rec) -> dict:
    """The device of the parameters the optimizers update (what the script actually used)."""
    from .recorder import device_of, first_param

    if rec.device_seen is not None:
        return rec.device_seen
    params = (first_param(opt) for opt in list(rec.optimizers))
    param = next((p for p in params if p is not None), None)
    return device_of(param) if param is not None else {"type": None, "index": None, "name": None}


if __name__ == "__main__":
    main(sys.argv[1])
