"""The named API endpoints: one typed function per action, registered with `gr.api`.

Gradio derives each endpoint's parameters from these signatures, so the parameter names and
defaults below are the documented contract (docs/app.md). Each calls the same library function
the page's event calls. JSON results travel as JSON text (`gradio_client` would try to download
any dict with a string "path" key, and findings have one); files travel as `FileData`. Every
output is named and described (`RETURNS`), so `client.view_api()` shows what comes back; new
outputs are appended, never inserted. A user's mistake raises `gr.Error` with the readable
message, and messages are in the API's words (`budget_s`, never `--budget`; no traceback).
"""
from __future__ import annotations

import functools
import json
from inspect import signature
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
    """Errors become `gr.Error(readable message)` in the API's words; the signature (gradio reads
    it) is kept, resolved: with postponed annotations a return type is a string, which gr.api
    shows as one `Any`."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except gr.Error:
            raise
        except Exception as exc:  # noqa: BLE001 - every failure becomes a message for the caller
            raise gr.Error(common.error_message(exc, surface="api"), print_exception=False) from None

    wrapper.__signature__ = signature(fn, eval_str=True)
    return wrapper


@endpoint
def lint(code: str = "", file: FileData | None = None, select: str = "", ignore: str = "") \
        -> tuple[str, FileData, FileData, str, str, FileData | None, FileData | None]:
    """Lint pasted `code` or an uploaded .py/.ipynb `file`: (report JSON, report.md, report.json,
    then as the page offers them: the corrected script, its diff, both as files).
    `select`/`ignore`: comma-separated rule ids or prefixes (e.g. "AMP1", "AMP121,AMP123")."""
    r = diagnose.lint_script(code, file, select, ignore)
    return (as_json_text(r["report"]), FileData(path=r["md_path"]), FileData(path=r["json_path"]),
            r["fixed_text"] or "", r["diff"] or "", _file(r["fixed_path"]), _file(r["diff_path"]))


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
                  precisions: str = ",".join(speedup.PRECISIONS), budget_s: float = speedup.DEFAULT_UI_BUDGET_S,
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


def _trace_words(result):
    """A trace's own advice in the API's words; its messages quote the script's output (an
    argparse error naming `--steps`, say), which stays exactly as the script printed it."""
    for finding in (result.get("findings") or []) if isinstance(result, dict) else []:
        if isinstance(finding, dict) and isinstance(finding.get("suggestion"), str):
            finding["suggestion"] = common.for_api(finding["suggestion"])
    return result


JSON_TEXT = "JSON text (json.loads it)"
# Each endpoint's outputs, by position: (name, description[, how its JSON is put in the API's
# words]). gr.api labels them "1st", "2nd", ...; `publish` names them for `view_api()`.
RETURNS = {
    "lint": (("report", f"{JSON_TEXT}: lint --format json's object, each finding with `fixable` and its safe `fix`"),
             ("report_md", "the report as Markdown (file)"),
             ("report_json", "the report as JSON (file)"),
             ("fixed_script", "the script with every safe mechanical fix applied; empty when none applies "
                              "(notebooks are not rewritten)"),
             ("diff", "unified diff from the script to fixed_script; empty when none applies"),
             ("fixed_file", "fixed_script as a file, in the script's declared encoding (none when no fix applies)"),
             ("diff_file", "the diff as a file (none when no fix applies)")),
    "rules": (("rules", f"{JSON_TEXT}: the list of rules, or the one rule asked for"),
              ("explanation", "the rule's explanation as Markdown (empty for the list)")),
    "check": (("report", f"{JSON_TEXT}: check --format json's object (capability, alignment, skiprate, nan, "
                         "headroom, findings, budget)", common.api_words),
              ("skiprate_png", "the fp16 loss-scale plot (file; none when the skip-rate probe did not run)")),
    "inspect": (("report", f"{JSON_TEXT}: inspect --format json's object (what is present, dtypes, findings)",
                 common.api_words),),
    "capability": (("capability", f"{JSON_TEXT}: the device's capability report (bf16/fp16/tf32 support, "
                                  "recommended precision and why)", common.api_words),),
    "speedup": (("result", f"{JSON_TEXT}: speedup --format json's object; results.<precision>.speedup_vs_fp32 is "
                           "the median of the paired per-round ratios", common.api_words),
                ("plot_png", "step time and peak memory per precision (file)")),
    "recommend": (("decision", f"{JSON_TEXT}: ask --format json's object (precision, reasons, warnings; "
                               "gpu_detected when gpu was left empty)", common.api_words),
                  ("loop", "the generated training loop (Python source)"),
                  ("train_amp_py", "the same loop as train_amp.py (file)")),
    "explain": (("report", f"{JSON_TEXT}: explain --format json's object (matches with cause and fix, symptoms, "
                           "verdict)"),),
    "recipe": (("loop", "the generated training loop (Python source)"),
               ("train_amp_py", "the same loop as train_amp.py (file)")),
    "trace": (("result", f"{JSON_TEXT}: the trace's object (protocol, loss scale, skipped steps, first non-finite "
                         "module, findings), `script` = the file name", _trace_words),
              ("loss_scale_png", "the loss scale per step (file; none when no GradScaler ran)")),
    "trace_ranks": (("result", f"{JSON_TEXT}: the ranks' merged trace (docs/distributed.md)", _trace_words),),
    "check_ranks": (("report", f"{JSON_TEXT}: check --nproc's object: the ranks' skip agreement and what the "
                               "reduce dtype does to the gradients", common.api_words),),
}
# Inputs whose format a caller must know, shown beside their type.
PARAMS = {
    "select": "comma-separated rule ids or prefixes to report (e.g. AMP1)",
    "ignore": "comma-separated rule ids or prefixes to leave out",
    "checks": "comma-separated: " + ", ".join(check.CHECK_NAMES),
    "budget_s": "seconds the run may take",
    "precisions": "comma-separated: " + ", ".join(speedup.PRECISIONS),
    "answers": 'a JSON object with the keys of `ask`, e.g. {"gpu": "A100", "symptoms": ["nan_loss"]}',
    "options": 'a JSON object of recipe options, e.g. {"precision": "bf16", "clip": 1.0}',
    "args": "the script's command line, split as a shell would (no shell runs it)",
    "autocast_policy": 'on a host without a GPU: "cuda" (CUDA autocast\'s op lists, emulated) or "host" (the CPU\'s own)',
    "nproc": "processes (ranks) under torch.distributed",
    "wrap": '"ddp" or "fsdp2"',
}


def register(gpu_queue: dict, lint_queue: dict) -> None:
    """Publish every endpoint under its documented name (inside a `gr.Blocks`). Jobs that use
    a device share the page's GPU queue, lints the page's lint queue (concurrency_id + limit)."""
    publish(lint, "lint", **lint_queue)
    publish(rules, "rules", **FAST)
    publish(check_model, "check", **gpu_queue)
    publish(inspect, "inspect", **FAST)
    publish(capability, "capability", **gpu_queue)
    publish(speedup_check, "speedup", **gpu_queue)
    publish(recommend, "recommend", **FAST)
    publish(explain, "explain", **FAST)
    publish(recipe_loop, "recipe", **FAST)
    publish(trace_run, "trace", **gpu_queue)
    publish(trace_ranks, "trace_ranks", **gpu_queue)
    publish(check_ranks, "check_ranks", **gpu_queue)


def publish(fn: Callable, api_name: str, **queue) -> None:
    """`gr.api` for `fn`, with its JSON outputs in the API's words and with what gr.api leaves out:
    each output named and described (`RETURNS`), the inputs of `PARAMS` described."""
    from gradio.context import get_blocks_context

    returns = RETURNS[api_name]
    dep = gr.api(worded(fn, returns), api_name=api_name, **queue)
    blocks = get_blocks_context().blocks
    if len(dep["outputs"]) != len(returns):
        raise TypeError(f"/{api_name}: {len(dep['outputs'])} outputs annotated, {len(returns)} in RETURNS")
    for block_id, (name, description, *_) in zip(dep["outputs"], returns):
        block = blocks[block_id]
        block.label = name
        block._api_info = {**block._api_info, "description": description}
    for block_id, name in zip(dep["inputs"], signature(fn).parameters):
        if name in PARAMS:
            block = blocks[block_id]
            block._api_info = {**block._api_info, "additional_description": PARAMS[name]}


def worded(fn: Callable, returns: tuple) -> Callable:
    """`fn` with each JSON-text output that `returns` gives a wording function put in the API's
    words (the CLI's JSON names its flags: `raise --budget` reads `raise budget_s`)."""
    words = {i: out[2] for i, out in enumerate(returns) if len(out) > 2}

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        out = fn(*args, **kwargs)
        many = isinstance(out, tuple)
        values = list(out) if many else [out]
        for i, say in words.items():
            if isinstance(values[i], str):
                values[i] = json.dumps(say(json.loads(values[i])), indent=2, ensure_ascii=False)
        return tuple(values) if many else values[0]

    return wrapper
