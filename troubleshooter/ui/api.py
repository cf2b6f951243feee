"""The named API endpoints: one typed function per action, registered with `gr.api`.

Gradio derives each endpoint's parameters from these signatures, so the parameter names and
defaults below are the documented contract (docs/app.md). Each calls the same library function
the page's event calls. JSON results travel as JSON text (`gradio_client` would try to download
any dict with a string "path" key, and findings have one); files travel as `FileData`.
A user's mistake raises `gr.Error` with the readable message (never a traceback).
"""
from __future__ import annotations

import functools
import json
from typing import Callable

import gradio as gr
from gradio import FileData

from ..errors import UserError
from . import check, common, diagnose, questionnaire, recipe, specinput, speedup, trace


def as_json_text(value) -> str:
    """A JSON-able result as text: the objects the CLI prints with `--format json`."""
    return json.dumps(value, indent=2, default=str, ensure_ascii=False)


def _file(path: str | None) -> FileData | None:
    return FileData(path=path) if path else None


def endpoint(fn: Callable) -> Callable:
    """Errors become `gr.Error(readable message)`; the signature (gradio reads it) is kept."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except gr.Error:
            raise
        except Exception as exc:  # noqa: BLE001 - every failure becomes a message for the caller
            raise gr.Error(common.error_message(exc), print_exception=False) from None

    return wrapper


@endpoint
def lint(code: str = "", file: FileData | None = None, select: str = "", ignore: str = "") \
        -> tuple[str, FileData, FileData]:
    """Lint pasted `code` or an uploaded .py/.ipynb `file`: (report JSON, report.md, report.json).
    `select`/`ignore`: comma-separated rule ids or prefixes (e.g. "AMP1", "AMP121,AMP123")."""
    r = diagnose.lint_script(code, file, select, ignore)
    return as_json_text(r["report"]), FileData(path=r["md_path"]), FileData(path=r["json_path"])


@endpoint
def rules(rule_id: str = "") -> tuple[str, str]:
    """All rules (empty `rule_id`), or one rule and its Markdown explanation."""
    table = diagnose.rules_table()
    if not (rule_id or "").strip():
        return as_json_text(table), ""
    text = diagnose.explain(rule_id)
    rid = rule_id.strip().upper()
    return as_json_text(next((r for r in table if r["id"] == rid), {"id": rid})), text


@endpoint
def check_model(preset: str = "", yaml_text: str = "", spec_file: FileData | None = None,
                weights_file: FileData | None = None, device: str = "auto",
                checks: str = ",".join(check.CHECK_NAMES), steps: float = 20,
                budget_s: float = check.DEFAULT_UI_BUDGET_S, autocast_policy: str = "cuda") \
        -> tuple[str, FileData | None]:
    """Run the checks on a model (the first given of spec_file, yaml_text, preset) within budget_s
    seconds: (the `check --format json` object, the skip-rate plot PNG or none). autocast_policy:
    on a CPU host, `cuda` (default) follows CUDA autocast's op lists, `host` the CPU's own."""
    source = specinput.source_for_api(preset, yaml_text, spec_file, weights_file)
    report = check.run(source, device, checks, steps, budget_s=budget_s,
                       autocast_policy=autocast_policy)  # typed up to here
    return as_json_text(report.to_dict()), _file(common.save_figure(check.skiprate_figure(report), "skiprate.png"))


@endpoint
def inspect(checkpoint: FileData | None = None) -> str:
    """What a checkpoint holds (dtypes, scaler/optimizer/scheduler state), loaded without running code."""
    return as_json_text(check.inspect_upload(checkpoint))


@endpoint
def capability(device: str = "auto") -> str:
    """The capability report of a device of this host (`auto`, `cpu`, `cuda:0`)."""
    return as_json_text(check.capability(device))


@endpoint
def speedup_check(preset: str = "", yaml_text: str = "", spec_file: FileData | None = None, device: str = "auto",
                  precisions: str = ",".join(speedup.PRECISIONS), budget_s: float = 30,
                  compile: bool = False) -> tuple[str, FileData | None]:
    """Time fp32/TF32/fp16/bf16 training steps: (the `speedup --format json` object, the plot PNG)."""
    source = specinput.source_for_api(preset, yaml_text, spec_file)
    result = speedup.measure(source, device, precisions, budget_s, compile)
    return as_json_text(result), _file(common.save_figure(speedup.figure(result), "speedup.png"))


@endpoint
def recommend(answers: str = "{}") -> tuple[str, str, FileData]:
    """Answers (a JSON object, keys of `ask`) -> (decision JSON, generated loop, train_amp.py).
    An empty or missing `gpu` means this server's device; the decision then has `gpu_detected`."""
    d, code, path = questionnaire.recommend_with_loop(questionnaire.parse_answers(answers))
    return as_json_text(d), code, FileData(path=path)


@endpoint
def explain(text: str = "") -> str:
    """A pasted error message or training log -> the explain report JSON."""
    return as_json_text(questionnaire.explain(text)["report"])


@endpoint
def recipe_loop(options: str = "{}") -> tuple[str, FileData]:
    """Recipe options (a JSON object, e.g. {"precision": "bf16", "clip": 1.0}) -> (loop, train_amp.py)."""
    code, path = recipe.render(recipe.parse_options(options))
    return code, FileData(path=path)


@endpoint
def trace_run(script: FileData | None = None, args: str = "", steps: float = 20, device: str = "auto",
              autocast_policy: str = "cuda") -> tuple[str, FileData | None]:
    """Run the user's training script for a few steps on this host (only with --allow-exec):
    (the trace JSON, the loss-scale plot PNG or none). autocast_policy: on a host without a GPU,
    `cuda` (default) follows CUDA autocast's op lists, `host` the CPU's own."""
    result = trace.run("", script, args, steps, device, autocast_policy=autocast_policy)
    return as_json_text(result), _file(common.save_figure(trace.scale_figure(result), "loss_scale.png"))


# Under torch.distributed: endpoints of their own, so the parameters of /trace and /check stay as
# they were (a raw HTTP caller sends every parameter, and one more would break its calls).
@endpoint
def trace_ranks(script: FileData | None = None, args: str = "", steps: float = 20, device: str = "auto",
                nproc: float = 2, autocast_policy: str = "cuda") -> str:
    """Run the training script under torch.distributed.run with nproc ranks (only with --allow-exec;
    at most --max-nproc and the host's CPU cores or GPUs): the merged trace JSON (docs/distributed.md).
    autocast_policy: as /trace."""
    return as_json_text(trace.run("", script, args, steps, device, nproc=nproc, autocast_policy=autocast_policy))


@endpoint
def check_ranks(preset: str = "", yaml_text: str = "", spec_file: FileData | None = None,
                weights_file: FileData | None = None, device: str = "auto", nproc: float = 2, wrap: str = "ddp",
                param_dtype: str = "float16", reduce_dtype: str = "", steps: float = 20) -> str:
    """The skip-rate and NaN checks on nproc ranks, the model wrapped in DDP or FSDP2 (`check --nproc`
    JSON): the ranks' skip agreement and what the reduce dtype does to the gradients."""
    source = specinput.source_for_api(preset, yaml_text, spec_file, weights_file)
    ranks = check.parse_nproc(nproc, device)
    if ranks is None:
        raise UserError("check_ranks runs on several processes: nproc must be 2 or more (use /check for one)")
    return as_json_text(check.run_distributed(source, device, ranks, wrap, param_dtype, reduce_dtype, steps))


FAST = dict(concurrency_limit=8)  # questionnaire, explain, recipe, rules: cheap, answered beside a job


def register(gpu_queue: dict, lint_queue: dict) -> None:
    """Publish every endpoint under its documented name (inside a `gr.Blocks`). Jobs that use
    a device share the page's GPU queue, lints the page's lint queue (concurrency_id + limit)."""
    gr.api(lint, api_name="lint", **lint_queue)
    gr.api(rules, api_name="rules", **FAST)
    gr.api(check_model, api_name="check", **gpu_queue)
    gr.api(inspect, api_name="inspect", **FAST)
    gr.api(capability, api_name="capability", **gpu_queue)
    gr.api(speedup_check, api_name="speedup", **gpu_queue)
    gr.api(recommend, api_name="recommend", **FAST)
    gr.api(explain, api_name="explain", **FAST)
    gr.api(recipe_loop, api_name="recipe", **FAST)
    gr.api(trace_run, api_name="trace", **gpu_queue)
    gr.api(trace_ranks, api_name="trace_ranks", **gpu_queue)
    gr.api(check_ranks, api_name="check_ranks", **gpu_queue)
