"""The web page: four tabs laid out and wired to the plain functions of `troubleshooter.ui`,
plus the typed API endpoints (`api.register`). `app.py` only parses the options and calls `serve`.

It lives in the package (not in `app.py`) so the worker processes, which are spawned and so
re-run the main script, never import gradio or build a layout.
"""
from __future__ import annotations

import sys

import gradio as gr

from ..engine import check_render as render
from . import api, check, common, diagnose, findings_table, host, questionnaire, recipe, specinput, speedup, trace
from .glue import page_event, row_select, scroll_to
from .server import SETTINGS


def gpu_queue() -> dict:
    """Check, speedup and device probes share one queue slot per GPU on this host (one on a
    CPU-only host); `jobs.device_lock` keeps two of them off the same device."""
    return dict(concurrency_id="gpu", concurrency_limit=host.gpu_slots())


FAST = dict(concurrency_limit=8)  # questionnaire, explain, rules, inspect: cheap, each its own queue


def lint_queue() -> dict:
    """Lint (page and API) shares a few slots of its own: each lint runs in a worker process, and
    a flood of big scripts waits here, beside the other queues, instead of stalling them."""
    return dict(concurrency_id="lint", concurrency_limit=diagnose.LINT_SLOTS)


def page(name: str) -> dict:
    """Page events are private (`ui_*` names, not callable by API clients): the API is the typed
    endpoints of `api.py`, and the documented names stay theirs."""
    return dict(api_name=name, api_visibility="private")


CSS = """
.status-box {min-height: 1.5em}
#header-device {font-size: 0.95em; opacity: 0.9}
/* tables: headers, words and numbers never break mid-word; prose wraps at spaces */
table th, table td {word-break: normal !important; overflow-wrap: normal !important; hyphens: none !important}
table th {white-space: nowrap}
#check-findings td:nth-child(-n+3), #check-nan td:nth-child(-n+2) {white-space: nowrap}
#check-findings code {white-space: nowrap}
#lint-findings th *, #lint-info-findings th *, #speed-table *, #check-alignment *, #check-headroom-table *
  {word-break: normal !important; overflow-wrap: normal !important}
/* the inspect summary is preformatted text: long lines wrap (keeping their indent) instead of
   running off the right edge */
#check-inspect-result pre, #check-inspect-result code {white-space: pre-wrap !important; overflow-wrap: anywhere}
"""


def _diagnose_tab() -> None:
    with gr.Row():
        with gr.Column(scale=1, min_width=300):
            upload = gr.File(label="Upload a training script (.py) or notebook (.ipynb)",
                             file_types=[".py", ".ipynb"], elem_id="lint-upload")
            run = gr.Button("Diagnose", variant="primary", elem_id="lint-run")
            with gr.Accordion("Run it on this host (a few steps, to see what AMP really does)", open=False):
                if SETTINGS.allow_exec:
                    gr.Markdown("Runs the uploaded (or pasted) script in a child process on this server, "
                                "for the steps below, with the arguments below, under the server's time limit.")
                else:
                    gr.Markdown("This server does not run uploaded scripts. Its operator can enable it by "
                                "starting the app with `--allow-exec`; the diagnosis needs no execution.",
                                elem_id="trace-disabled")
                with gr.Row():
                    trace_steps = gr.Number(20, precision=0, minimum=1, maximum=trace.MAX_STEPS,
                                            label="Steps", elem_id="trace-steps", scale=1)
                    trace_nproc = gr.Number(1, precision=0, minimum=1, maximum=SETTINGS.max_nproc, scale=1,
                                            label=f"Processes (torchrun, at most {SETTINGS.max_nproc})",
                                            elem_id="trace-nproc")
                    trace_args = gr.Textbox("", label="Script arguments (as on a command line)",
                                            placeholder="--epochs 1 --batch-size 8", elem_id="trace-args", scale=3)
                trace_policy = gr.Radio(check.AUTOCAST_POLICY_CHOICES, value="cuda", elem_id="trace-autocast-policy",
                                        label="Autocast op lists on a host without a GPU")
                trace_btn = gr.Button("Run it on this host" if SETTINGS.allow_exec else
                                      "Run it on this host (needs --allow-exec on the server)",
                                      interactive=SETTINGS.allow_exec, elem_id="trace-run")
        with gr.Column(scale=2, min_width=480):
            code = gr.Code(language="python", lines=12, max_lines=30, interactive=True,
                           label="…or paste your training code (an upload, if any, is what gets diagnosed)",
                           elem_id="lint-code")
    # the findings get the page's full width: six columns of code and prose. Both status lines
    # (diagnosis, run) sit right below the buttons, so a result shows where it was asked for.
    status = gr.Markdown(elem_id="lint-status", elem_classes=["status-box"])
    trace_status = gr.Markdown(elem_id="trace-status")
    trace_plot = gr.Plot(label="Loss scale per step (run time)", show_label=False, elem_id="trace-plot",
                         visible=False)
    table = gr.Dataframe(headers=diagnose.TABLE_HEADERS, label="Findings: errors and warnings, worst first",
                         wrap=True, interactive=False, elem_id="lint-findings", column_widths=_FINDING_WIDTHS)
    with gr.Accordion(findings_table.infos_label(0), open=False, visible=False, elem_id="lint-infos") as infos_box:
        info_table = gr.Dataframe(headers=diagnose.TABLE_HEADERS, show_label=False, wrap=True,
                                  interactive=False, elem_id="lint-info-findings", column_widths=_FINDING_WIDTHS)
    with gr.Row():
        with gr.Column(scale=1):
            with gr.Row():
                md_file = gr.File(label="Report (Markdown)", interactive=False, elem_id="lint-md")
                json_file = gr.File(label="Report (JSON)", interactive=False, elem_id="lint-json")
            with gr.Accordion("Corrected script (mechanical, safe fixes)", open=False):
                fixed_note = gr.Markdown(elem_id="lint-fix-note")
                fixed_code = gr.Code(language="python", label="Corrected script", interactive=False)
                diff = gr.Code(label="Diff", interactive=False)
                with gr.Row():
                    fixed_file = gr.File(label="Corrected script", interactive=False)
                    diff_file = gr.File(label="Diff", interactive=False)
        with gr.Column(scale=1):
            with gr.Accordion("Explain a rule (or click a finding)", open=True):
                rule = gr.Dropdown(choices=_safe(diagnose.rule_choices, []), label="Rule",
                                   value=None, elem_id="lint-rule")
                explanation = gr.Markdown(elem_id="lint-explanation")
    # row i of each table -> its rule id (by index, never parsed from text)
    row_rules, info_rules = gr.State([]), gr.State([])
    lint_rows, lint_rules = gr.State([]), gr.State([])  # every static row: run-time rows join these, not old ones

    def shown(rows, rules) -> tuple:
        """The two tables for these rows: errors and warnings, and the infos folded below (open
        when there is nothing else to show)."""
        main, main_rules, infos, infos_rules = findings_table.split(rows or [], rules or [])
        box = gr.Accordion(label=findings_table.infos_label(len(infos)), visible=bool(infos), open=not main)
        return main, box, infos, main_rules, infos_rules

    def lint_view(code_text, upload_file, running: str = ""):
        out = diagnose.ui_lint(code_text, upload_file)
        rows, rules = out[1], out[-1]
        main, box, infos, main_rules, infos_rules = shown(rows, rules)
        return (out[0], main, box, infos, *out[2:10], main_rules, infos_rules, rows, rules, running,
                gr.Plot(value=None, visible=False))  # a diagnosis replaces the last run's results too

    def run_view(code_text, upload_file):
        name = diagnose.input_name(code_text, upload_file)
        return lint_view(code_text, upload_file, f"Running **{common.md_escape(name)}** on this host…")

    outputs = [status, table, infos_box, info_table, md_file, json_file, rule, fixed_note, fixed_code, diff,
               fixed_file, diff_file, row_rules, info_rules, lint_rows, lint_rules, trace_status, trace_plot]
    # made when an error clears them (a component made here, at build time, would join the page)
    blank = {2: lambda: gr.Accordion(visible=False), 17: lambda: gr.Plot(value=None, visible=False)}
    run.click(None, js=scroll_to("lint-status"), queue=False, api_visibility="private")
    run.click(page_event(lint_view, len(outputs), blank=blank), [code, upload], outputs,
              **lint_queue(), **page("ui_lint"))
    table.select(row_select(diagnose.rule_at), [row_rules], [rule], **FAST, **page("ui_pick_rule"))
    info_table.select(row_select(diagnose.rule_at), [info_rules], [rule], **FAST, **page("ui_pick_info_rule"))
    rule.change(page_event(diagnose.explain, 1, clear=False), [rule], [explanation],
                **FAST, **page("ui_explain_rule"))
    trace_outputs = [trace_status, table, infos_box, info_table, row_rules, info_rules, trace_plot]

    def trace_and_show(*args, progress=None):
        status_md, rows, rules, fig = trace.ui_trace(*args, progress=progress)
        # the run's own rows follow the static ones: their fix in the page's words (the message and
        # the status quote what the script printed, which stays as printed)
        static = len(args[4] or [])
        rows = rows[:static] + [[*r[:5], common.for_page(r[5])] for r in rows[static:]]
        main, box, infos, main_rules, infos_rules = shown(rows, rules)
        return (f"*{common.stamp()}* · {status_md}", main, box, infos, main_rules, infos_rules,
                gr.Plot(value=fig, visible=fig is not None))

    # A run first diagnoses the same input again (the table and reports then belong to the script
    # that runs, not to whatever was diagnosed before), then runs it and adds what it saw.
    trace_btn.click(None, js=scroll_to("lint-status"), queue=False, api_visibility="private")
    trace_btn.click(page_event(run_view, len(outputs), blank=blank), [code, upload], outputs,
                    **lint_queue(), **page("ui_trace_lint")) \
        .then(page_event(trace_and_show, len(trace_outputs), progress=True, clear=False),
              [code, upload, trace_args, trace_steps, lint_rows, lint_rules, trace_policy, trace_nproc],
              trace_outputs,
              **gpu_queue(), **page("ui_trace"))


_FINDING_WIDTHS = ["8%", "15%", "6%", "23%", "24%", "24%"]


def _model_picker(prefix: str, weights: bool = False) -> list:
    """Preset + parameters, a YAML editor, or an upload; returns the inputs `source_from_inputs` takes."""
    names = _safe(specinput.preset_names, [])
    first = "mlp" if "mlp" in names else (names[0] if names else None)
    mode = gr.Radio(list(specinput.MODES), value="Preset", label="Model from", elem_id=f"{prefix}-mode")
    with gr.Group(visible=True) as preset_box:
        with gr.Row():
            preset = gr.Dropdown(names, value=first, label="Preset", elem_id=f"{prefix}-preset", scale=1)
            params = gr.Textbox(value=_safe(lambda: specinput.params_text(first), ""), scale=3,
                                label="Parameters (name=value, comma separated)", elem_id=f"{prefix}-params")
        about = gr.Markdown(_safe(lambda: specinput.preset_description(first), ""))
    with gr.Group(visible=False) as yaml_box:
        yaml_text = gr.Code(value=_safe(specinput.example_yaml, ""), language="yaml", lines=14,
                            interactive=True, label="Model spec (YAML)", elem_id=f"{prefix}-yaml")
    with gr.Group(visible=False) as upload_box:
        upload = gr.File(label="Model spec (.yaml) — or a Python model file (.py), only if the server "
                               "runs with --allow-exec", file_types=list(specinput.SPEC_KINDS),
                         elem_id=f"{prefix}-spec-file")
    weights_file = None
    if weights:
        weights_file = gr.File(label="Weights (state_dict) named by the spec's `weights:` (optional)",
                               file_types=[".pt", ".pth", ".bin", ".ckpt"], elem_id=f"{prefix}-weights")
    mode.change(lambda m: tuple(gr.update(visible=m == k) for k in specinput.MODES), [mode],
                [preset_box, yaml_box, upload_box], queue=False, api_visibility="private")
    preset.change(lambda p: (specinput.params_text(p), specinput.preset_description(p)), [preset],
                  [params, about], queue=False, api_visibility="private")
    return [mode, preset, params, yaml_text, upload] + ([weights_file] if weights else [])


def _device_picker(prefix: str) -> gr.Dropdown:
    return gr.Dropdown(host.device_choices(), value="auto", label="Device", elem_id=f"{prefix}-device")


def _speedup_tab() -> None:
    gr.Markdown("Times a full training step (forward, loss, backward, optimizer) in each precision on "
                "this host, interleaved, until the numbers are stable or the budget is spent.")
    with gr.Row():
        with gr.Column(scale=2):
            model = _model_picker("speed")
            with gr.Row():
                device = _device_picker("speed")
                precisions = gr.CheckboxGroup(list(speedup.PRECISIONS), value=list(speedup.PRECISIONS),
                                              label="Precisions", elem_id="speed-precisions")
            with gr.Row():
                budget = gr.Slider(2, 300, value=speedup.DEFAULT_UI_BUDGET_S, step=1, label="Time budget (s)", elem_id="speed-budget")
                compile_ = gr.Checkbox(False, label="torch.compile each precision")
            run = gr.Button("Run speedup check", variant="primary", elem_id="speed-run")
        with gr.Column(scale=3):
            status = gr.Markdown(elem_id="speed-status", elem_classes=["status-box"])
            verdict = gr.Markdown(elem_id="speed-verdict")
            plot = gr.Plot(label="Step time and peak memory", show_label=False, elem_id="speed-plot")
            json_file = gr.File(label="Result (JSON)", interactive=False, elem_id="speed-json")
    table = gr.Dataframe(headers=speedup.TABLE_HEADERS, label="Results", interactive=False,  # full width
                         wrap=True, elem_id="speed-table",
                         column_widths=["8%", "8%", "7%", "12%", "9%", "14%", "14%", "28%"])
    outputs = [status, table, plot, verdict, json_file]
    run.click(None, js=scroll_to("speed-status"), queue=False, api_visibility="private")
    run.click(page_event(speedup.ui_speedup, len(outputs), progress=True), [*model, device, precisions, budget, compile_],
              outputs, **gpu_queue(), **page("ui_speedup"))


def _check_tab() -> None:
    gr.Markdown("Runs your model for a few steps on this host and reports what mixed precision will do to it.")
    with gr.Row():
        with gr.Column(scale=1, min_width=320):
            model = _model_picker("check", weights=True)
            with gr.Row():
                device = _device_picker("check")
                steps = gr.Number(20, precision=0, minimum=1, maximum=check.MAX_UI_STEPS,
                                  label="Steps (skip-rate probe)", elem_id="check-steps")
                budget = gr.Number(check.DEFAULT_UI_BUDGET_S, minimum=check.MIN_UI_BUDGET_S,
                                   label="Time budget (s), shared by the checks", elem_id="check-budget")
            checks = gr.CheckboxGroup([(check.CHECK_LABELS[c], c) for c in check.CHECK_NAMES],
                                      value=list(check.CHECK_NAMES), label="Checks", elem_id="check-checks")
            policy = gr.Radio(check.AUTOCAST_POLICY_CHOICES, value="cuda", elem_id="check-autocast-policy",
                              label="Autocast op lists on a CPU host")
            with gr.Accordion("Under torch.distributed (skip rate and NaN, on several ranks)", open=False):
                with gr.Row():
                    nproc = gr.Number(1, precision=0, minimum=1, maximum=SETTINGS.max_nproc, elem_id="check-nproc",
                                      label=f"Processes (1: one process; at most {SETTINGS.max_nproc})")
                    wrap = gr.Dropdown([("DDP", "ddp"), ("FSDP2 fully_shard", "fsdp2")], value="ddp",
                                       label="Wrapped in", elem_id="check-wrap")
                with gr.Row():
                    param_dtype = gr.Dropdown(["float16", "bfloat16", "float32"], value="float16",
                                              label="Compute dtype (param_dtype)", elem_id="check-param-dtype")
                    reduce_dtype = gr.Dropdown([("as FSDP2/DDP default", ""), "float16", "bfloat16", "float32"],
                                               value="", label="Reduce dtype", elem_id="check-reduce-dtype")
            run = gr.Button("Run checks", variant="primary", elem_id="check-run")
        with gr.Column(scale=2, min_width=560):
            status = gr.Markdown(elem_id="check-status", elem_classes=["status-box"])
            capability = gr.Markdown(elem_id="check-capability")
            findings = gr.Markdown(elem_id="check-findings")
            align_md = gr.Markdown(elem_id="check-alignment-summary")
            align = gr.Dataframe(headers=render.ALIGN_HEADERS, label="Tensor-core alignment (padded sizes)",
                                 interactive=False, wrap=True, elem_id="check-alignment",
                                 column_widths=["8%", "11%", "14%", "7%", "7%", "15%", "12%", "26%"])
            skip_md = gr.Markdown(elem_id="check-skiprate")
            skip_plot = gr.Plot(label="Loss scale per step (skipped steps marked)", show_label=False, elem_id="check-skiprate-plot")
            nan_md = gr.Markdown(elem_id="check-nan")
            head_md = gr.Markdown(elem_id="check-headroom")
            head_rows = gr.Dataframe(headers=render.HEADROOM_HEADERS, label="Activation headroom in fp16",
                                     interactive=False, elem_id="check-headroom-table")
            json_file = gr.File(label="Result (JSON)", interactive=False, elem_id="check-json")
    with gr.Accordion("Inspect a checkpoint (what it holds, in which dtypes; loaded without running code)",
                      open=False, elem_id="check-inspect-box"):
        with gr.Row():
            with gr.Column(scale=1, min_width=280):
                ckpt = gr.File(label="Checkpoint (.pt/.pth/.bin/.ckpt/.safetensors)",
                               file_types=list(check.CHECKPOINT_KINDS), elem_id="check-ckpt")
                inspect_btn = gr.Button("Inspect", elem_id="check-inspect")
            with gr.Column(scale=3):
                inspect_md = gr.Markdown(elem_id="check-inspect-result")
                inspect_json = gr.JSON(label="Checkpoint report (JSON)", open=False)
    outputs = [status, capability, findings, align_md, align, skip_md, skip_plot, nan_md, head_md, head_rows, json_file]
    run.click(page_event(check.ui_check, len(outputs), progress=True),
              [*model, device, checks, steps, budget, policy, nproc, wrap, param_dtype, reduce_dtype], outputs,
              **gpu_queue(), **page("ui_check"))
    inspect_btn.click(page_event(check.ui_inspect, 2), [ckpt], [inspect_md, inspect_json],
                      **FAST, **page("ui_inspect"))
    # the Run button sits below the model picker; the results (and a bad spec's problems) start at the top
    run.click(None, js=scroll_to("check-status"), queue=False, api_visibility="private")


def _question_control(q: dict):
    """One control per question of data/questions.yaml, by its type."""
    kind, label, key = questionnaire.control_kind(q), questionnaire.label(q), f"q-{q['key']}"
    default = q.get("default")
    if kind == "choice":
        return gr.Radio(questionnaire.choice_labels(q), value=default, label=label, elem_id=key)
    if kind == "list":
        return gr.CheckboxGroup(questionnaire.choice_labels(q), value=default or [], label=label, elem_id=key)
    if kind == "bool":
        return gr.Checkbox(bool(default), label=label, elem_id=key)
    if kind == "tristate":
        return gr.Radio(["yes", "no", questionnaire.UNKNOWN], value=questionnaire.UNKNOWN, label=label, elem_id=key)
    if kind == "int" and default is not None:
        return gr.Number(default, label=label, precision=0, minimum=q.get("min"), elem_id=key)
    if kind in ("int", "number"):  # optional: a textbox, since a number control cannot be left empty
        return gr.Textbox("" if default is None else str(default), label=label + " (optional)", elem_id=key)
    if kind == "log":
        return gr.Textbox(label=label, lines=6, max_lines=20, elem_id=key,
                          placeholder="e.g. RuntimeError: ... or a few lines of your training log")
    return gr.Textbox(default if default not in (None, "detect") else "", label=label, elem_id=key)


def _recipe_control(opt: dict):
    label, key = f"{opt['flag']}: {opt.get('help', '')}", f"r-{opt['name']}"
    if opt["type"] == "choice":
        return gr.Dropdown(opt["choices"], value=opt.get("default"), label=label, elem_id=key)
    if opt["type"] == "bool":
        return gr.Checkbox(bool(opt.get("default")), label=label, elem_id=key)
    if opt.get("optional") or opt.get("default") is None:  # empty = off; a number control cannot be empty
        return gr.Textbox("" if opt.get("default") is None else str(opt["default"]), label=label + " (empty: off)",
                          elem_id=key)
    return gr.Number(opt.get("default"), label=label, precision=0 if opt["type"] == "int" else None,
                     minimum=opt.get("min"), elem_id=key)


def _questionnaire_tab() -> None:
    gr.Markdown("Answer what you know (only the GPU is required); get FP16, BF16 or FP32 with the reason "
                "for each decision, and a training loop that is right by construction.")
    controls, by_key = [], {}
    with gr.Row():
        with gr.Column(scale=2):
            for q in _safe(questionnaire.questions, []):
                control = _question_control(q)
                controls.append(control)
                by_key[q["key"]] = control
                if q["key"] == "gpu":
                    with gr.Row():
                        detect = gr.Button("Detect my GPU", size="sm", elem_id="q-detect")
                    detected = gr.Markdown(elem_id="q-detected")
                if q["key"] == "log":
                    explain_btn = gr.Button("Explain this error", size="sm", elem_id="q-explain")
                    explanation = gr.Markdown(elem_id="q-explanation")
            run = gr.Button("Recommend", variant="primary", elem_id="q-run")
        with gr.Column(scale=3):
            verdict = gr.Markdown(elem_id="q-recommendation", elem_classes=["status-box"])
            code = gr.Code(language="python", label="Your training loop (train_amp.py)", interactive=False,
                           lines=20, max_lines=40, elem_id="q-code")
            script = gr.File(label="Download train_amp.py", interactive=False, elem_id="q-script")
            with gr.Accordion("Adjust the training loop", open=False):
                options = [_recipe_control(o) for o in _safe(recipe.options_meta, [])]
                regen = gr.Button("Regenerate", elem_id="q-regenerate")
                regen_status = gr.Markdown(elem_id="q-regenerate-status")
    if not controls:
        return
    def recommend(*values):  # a new recommendation replaces the last "Regenerate" note too
        return (*questionnaire.ui_recommend(*values), "")

    # the button ends a long column of questions; the answer starts at the top of the page
    run.click(None, js=scroll_to("q-recommendation"), queue=False, api_visibility="private")
    run.click(page_event(recommend, 4 + len(options)), controls,
              [verdict, code, script, *options, regen_status], **FAST, **page("ui_recommend"))
    regen.click(page_event(recipe.ui_render, 3), options, [regen_status, code, script], **FAST, **page("ui_recipe"))
    if "gpu" in by_key:
        detect.click(page_event(questionnaire.ui_detect, 2, status_index=1, clear=False), None,
                     [by_key["gpu"], detected], **FAST, **page("ui_detect"))  # cached at startup
    if "log" in by_key and "symptoms" in by_key:
        explain_btn.click(page_event(questionnaire.ui_explain, 2, clear=False), [by_key["log"], by_key["symptoms"]],
                          [explanation, by_key["symptoms"]], **FAST, **page("ui_explain_log"))


def _safe(fn, default):
    """Build-time data (rule list, presets) must not keep the page from starting."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001
        print(f"app: {getattr(fn, '__name__', fn)} unavailable: {exc}", file=sys.stderr)
        return default


def build_demo() -> gr.Blocks:
    """The page and its API, built with the settings in force (`server.SETTINGS`)."""
    info = host.host_info()
    from .common import UPLOAD_CACHE_CLEANUP

    with gr.Blocks(title="AMP Troubleshooter", delete_cache=UPLOAD_CACHE_CLEANUP) as blocks:
        gr.Markdown("# AMP Troubleshooter\nDiagnose and fix PyTorch FP16/BF16 mixed-precision training.")
        gr.Markdown(f"**This server:** {info['summary']} · uploaded Python files: "
                    + ("**run** on request, in a child process with a time limit" if SETTINGS.allow_exec
                       else "never run (the operator can allow it with --allow-exec)"),
                    elem_id="header-device")
        with gr.Tabs():
            with gr.Tab("Diagnose a script", id="diagnose"):
                _diagnose_tab()
            with gr.Tab("Check a model", id="check"):
                _check_tab()
            with gr.Tab("Questionnaire", id="questionnaire"):
                _questionnaire_tab()
            with gr.Tab("Speedup check", id="speedup"):
                _speedup_tab()
        api.register(gpu_queue(), lint_queue())
    # Every event has its own queue (jobs: "gpu", lint: "lint", the rest one each); no global cap:
    # with one, a backlog of jobs made even /rules answer "Queue is full".
    blocks.queue(default_concurrency_limit=8, max_size=None)
    return blocks


def warm_workers() -> None:
    """Spawn one standby worker per device now, so the first job does not wait for one."""
    from ..worker import POOL

    for key in {host.device_key(d) for d in host_info_devices()}:
        POOL.prepare(key)
    diagnose.prepare_lint_worker()


def host_info_devices() -> list[str]:
    return [d for d in host.host_info()["devices"] if d != "auto"] or ["cpu"]


def serve(settings) -> int:
    """Serve the page with `settings` (parsed by `server.settings_or_exit` before gradio is
    imported, so a mistyped option is answered at once): build, warm the workers, launch."""
    from . import server

    server.apply(settings)
    if not server.is_loopback(settings.host) and settings.auth is None:
        print(f"warning: serving on {settings.host} without --auth: anyone who can reach the port can use it",
              file=sys.stderr)
    from .procsecrets import hide_server_secrets

    hide_server_secrets(settings.auth, server.AUTH_ENV)  # /proc of this process shows no password or key
    demo = build_demo()
    warm_workers()
    demo.launch(**server.launch_kwargs(settings), css=CSS)
    return 0
