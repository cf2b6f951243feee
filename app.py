"""AMP Troubleshooter web app: layout and event wiring only.

Every callback is a plain function in `troubleshooter.ui` (tested directly); this file lays
out the four tabs, connects components to those functions, and names the API endpoints.
Run `python app.py --help` for serving options.
"""
from __future__ import annotations

import sys

# Worker processes are spawned, and spawn re-runs this file as `__mp_main__` in each child
# before its job. A worker needs nothing from the page, so it skips gradio (4 s to import)
# and the layout; job functions live in `troubleshooter.*`.
_WORKER = __name__ == "__mp_main__"
if __name__ == "__main__":
    # Options first: a mistyped option (or --help) is answered at once, before the slow imports,
    # and the layout below is built with the settings in force.
    from troubleshooter.ui import server as _server

    _server.apply(_server.settings_or_exit(sys.argv[1:]))
if not _WORKER:
    import gradio as gr

    from troubleshooter.ui import api, check, diagnose, host, questionnaire, recipe, specinput, speedup
    from troubleshooter.ui.glue import api_event, page_event, selected_row
    from troubleshooter.ui.server import SETTINGS



def gpu_queue() -> dict:
    """Check, speedup and device probes share one queue slot per GPU on this host (one on a
    CPU-only host); `jobs.device_lock` keeps two of them off the same device."""
    return dict(concurrency_id="gpu", concurrency_limit=host.gpu_slots())


FAST = dict(concurrency_limit=8)  # lint, questionnaire, explain: cheap and concurrent


def page(name: str) -> dict:
    """Page events get `ui_*` names (undocumented) so the documented API names stay free."""
    return dict(api_name=name, api_visibility="undocumented")


CSS = """
.status-box {min-height: 1.5em}
#header-device {font-size: 0.95em; opacity: 0.9}
#check-findings td:nth-child(1) {white-space: nowrap}
#check-findings td:nth-child(3) {min-width: 6em}
"""


def _diagnose_tab() -> None:
    with gr.Row():
        with gr.Column(scale=2):
            upload = gr.File(label="Upload a training script (.py) or notebook (.ipynb)",
                             file_types=[".py", ".ipynb"], elem_id="lint-upload")
            code = gr.Code(language="python", lines=16, max_lines=40, interactive=True,
                           label="…or paste your training code", elem_id="lint-code")
            run = gr.Button("Diagnose", variant="primary", elem_id="lint-run")
        with gr.Column(scale=3):
            status = gr.Markdown(elem_id="lint-status", elem_classes=["status-box"])
            table = gr.Dataframe(headers=diagnose.TABLE_HEADERS, label="Findings", wrap=True,
                                 interactive=False, elem_id="lint-findings",
                                 column_widths=["9%", "14%", "6%", "21%", "25%", "25%"])
            with gr.Row():
                md_file = gr.File(label="Report (Markdown)", interactive=False, elem_id="lint-md")
                json_file = gr.File(label="Report (JSON)", interactive=False, elem_id="lint-json")
            with gr.Accordion("Explain a rule (or click a finding)", open=True):
                rule = gr.Dropdown(choices=_safe(diagnose.rule_choices, []), label="Rule",
                                   value=None, elem_id="lint-rule")
                explanation = gr.Markdown(elem_id="lint-explanation")
            with gr.Accordion("Corrected script (mechanical, safe fixes)", open=False):
                fixed_note = gr.Markdown()
                fixed_code = gr.Code(language="python", label="Corrected script", interactive=False)
                diff = gr.Code(label="Diff", interactive=False)
                with gr.Row():
                    fixed_file = gr.File(label="Corrected script", interactive=False)
                    diff_file = gr.File(label="Diff", interactive=False)

    outputs = [status, table, md_file, json_file, rule, fixed_note, fixed_code, diff, fixed_file, diff_file]
    run.click(page_event(diagnose.ui_lint, len(outputs)), [code, upload], outputs, **FAST, **page("ui_lint"))
    table.select(selected_row(diagnose.rule_of_row), None, [rule], **FAST, **page("ui_pick_rule"))
    rule.change(page_event(diagnose.explain, 1, clear=False), [rule], [explanation],
                **FAST, **page("ui_explain_rule"))


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
                budget = gr.Slider(2, 300, value=30, step=1, label="Time budget (s)", elem_id="speed-budget")
                compile_ = gr.Checkbox(False, label="torch.compile each precision")
            run = gr.Button("Run speedup check", variant="primary", elem_id="speed-run")
        with gr.Column(scale=3):
            status = gr.Markdown(elem_id="speed-status", elem_classes=["status-box"])
            verdict = gr.Markdown(elem_id="speed-verdict")
            plot = gr.Plot(label="Step time and peak memory", show_label=False, elem_id="speed-plot")
            table = gr.Dataframe(headers=speedup.TABLE_HEADERS, label="Results", interactive=False,
                                 wrap=True, elem_id="speed-table",
                                 column_widths=["8%", "9%", "8%", "13%", "10%", "8%", "14%", "30%"])
            json_file = gr.File(label="Result (JSON)", interactive=False, elem_id="speed-json")
    outputs = [status, table, plot, verdict, json_file]
    run.click(page_event(speedup.ui_speedup, len(outputs)), [*model, device, precisions, budget, compile_],
              outputs, **gpu_queue(), **page("ui_speedup"))


def _check_tab() -> None:
    gr.Markdown("Runs your model for a few steps on this host and reports what mixed precision will do to it.")
    with gr.Row():
        with gr.Column(scale=2):
            model = _model_picker("check", weights=True)
            with gr.Row():
                device = _device_picker("check")
                steps = gr.Number(20, precision=0, minimum=1, maximum=check.MAX_UI_STEPS,
                                  label="Steps (skip-rate probe)", elem_id="check-steps")
            checks = gr.CheckboxGroup([(check.CHECK_LABELS[c], c) for c in check.CHECK_NAMES],
                                      value=list(check.CHECK_NAMES), label="Checks", elem_id="check-checks")
            run = gr.Button("Run checks", variant="primary", elem_id="check-run")
            with gr.Accordion("Inspect a checkpoint", open=False):
                ckpt = gr.File(label="Checkpoint (.pt/.pth/.bin/.ckpt/.safetensors); loaded without running code",
                               file_types=list(check.CHECKPOINT_KINDS), elem_id="check-ckpt")
                inspect_btn = gr.Button("Inspect", elem_id="check-inspect")
                inspect_md = gr.Markdown(elem_id="check-inspect-result")
                inspect_json = gr.JSON(label="Checkpoint report", open=False)
        with gr.Column(scale=3):
            status = gr.Markdown(elem_id="check-status", elem_classes=["status-box"])
            capability = gr.Markdown(elem_id="check-capability")
            findings = gr.Markdown(elem_id="check-findings")
            align = gr.Dataframe(headers=check.ALIGN_HEADERS, label="Tensor-core alignment (padded sizes)",
                                 interactive=False, wrap=True, elem_id="check-alignment")
            skip_md = gr.Markdown(elem_id="check-skiprate")
            skip_plot = gr.Plot(label="Loss scale per step (skipped steps marked)", show_label=False, elem_id="check-skiprate-plot")
            nan_md = gr.Markdown(elem_id="check-nan")
            head_md = gr.Markdown(elem_id="check-headroom")
            head_rows = gr.Dataframe(headers=check.HEADROOM_HEADERS, label="Activation headroom in fp16",
                                     interactive=False, elem_id="check-headroom-table")
            json_file = gr.File(label="Result (JSON)", interactive=False, elem_id="check-json")
    outputs = [status, capability, findings, align, skip_md, skip_plot, nan_md, head_md, head_rows, json_file]
    run.click(page_event(check.ui_check, len(outputs)), [*model, device, checks, steps], outputs,
              **gpu_queue(), **page("ui_check"))
    inspect_btn.click(page_event(check.ui_inspect, 2), [ckpt], [inspect_md, inspect_json],
                      **FAST, **page("ui_inspect"))


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
                regen_status = gr.Markdown()
    if not controls:
        return
    run.click(page_event(questionnaire.ui_recommend, 3 + len(options)), controls,
              [verdict, code, script, *options], **FAST, **page("ui_recommend"))
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


def _api_endpoints() -> None:
    """Named endpoints for gradio_client on hidden components (same functions as the page).
    A component's value is the parameter's default in the client, so optional ones have one."""
    with gr.Column(visible=False):
        code, file = gr.Textbox("", label="code"), gr.File(label="file", file_types=[".py", ".ipynb"])
        select, ignore = gr.Textbox("", label="select"), gr.Textbox("", label="ignore")
        report, md, js = gr.Textbox(label="report"), gr.File(label="report.md"), gr.File(label="report.json")
        gr.Button("lint").click(api_event(api.lint), [code, file, select, ignore], [report, md, js],
                                api_name="lint", **FAST)
        rule_id = gr.Textbox("", label="rule_id")
        rules_json, rule_md = gr.Textbox(label="rules"), gr.Textbox(label="explanation")
        gr.Button("rules").click(api_event(api.rules), [rule_id], [rules_json, rule_md], api_name="rules", **FAST)

        preset, yaml_text = gr.Textbox("", label="preset"), gr.Textbox("", label="yaml_text")
        spec_file = gr.File(label="spec_file", file_types=list(specinput.SPEC_KINDS))
        weights_file, device = gr.File(label="weights_file"), gr.Textbox("auto", label="device")
        precisions = gr.Textbox(",".join(speedup.PRECISIONS), label="precisions")
        budget, compile_ = gr.Number(30, label="budget_s"), gr.Checkbox(False, label="compile")
        result, png = gr.Textbox(label="result"), gr.File(label="plot.png")
        gr.Button("speedup").click(api_event(speedup.api_speedup),
                                   [preset, yaml_text, spec_file, device, precisions, budget, compile_],
                                   [result, png], api_name="speedup", **gpu_queue())
        checks = gr.Textbox(",".join(check.CHECK_NAMES), label="checks")
        steps, skip_png = gr.Number(20, label="steps", precision=0), gr.File(label="skiprate.png")
        gr.Button("check").click(api_event(check.api_check),
                                 [preset, yaml_text, spec_file, weights_file, device, checks, steps],
                                 [result, skip_png], api_name="check", **gpu_queue())
        cap = gr.Textbox(label="capability")
        gr.Button("capability").click(api_event(check.capability), [device], [cap], api_name="capability",
                                      **gpu_queue())
        ckpt, ckpt_report = gr.File(label="checkpoint"), gr.Textbox(label="report")
        gr.Button("inspect").click(api_event(check.inspect_upload), [ckpt], [ckpt_report], api_name="inspect", **FAST)

        answers, decision = gr.Textbox(label="answers"), gr.Textbox(label="decision")
        loop, loop_file = gr.Textbox(label="code"), gr.File(label="train_amp.py")
        gr.Button("recommend").click(api_event(questionnaire.api_recommend), [answers], [decision, loop, loop_file],
                                     api_name="recommend", **FAST)
        log_text, explained = gr.Textbox(label="text"), gr.Textbox(label="report")
        gr.Button("explain").click(api_event(questionnaire.api_explain), [log_text], [explained],
                                   api_name="explain", **FAST)
        options_json = gr.Textbox("{}", label="options")
        gr.Button("recipe").click(api_event(recipe.api_recipe), [options_json], [loop, loop_file],
                                  api_name="recipe", **FAST)


def build_demo() -> gr.Blocks:
    info = host.host_info()
    with gr.Blocks(title="AMP Troubleshooter") as blocks:
        gr.Markdown("# AMP Troubleshooter\nDiagnose and fix PyTorch FP16/BF16 mixed-precision training.")
        gr.Markdown(f"**This host:** {info['summary']} · uploaded Python model files: "
                    + ("**run** (--allow-exec)" if SETTINGS.allow_exec else "not run (start with --allow-exec)"),
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
        _api_endpoints()
    blocks.queue(default_concurrency_limit=8, max_size=64)  # a flood gets "queue full", not a stalled server
    return blocks


if not _WORKER:
    demo = build_demo()


def main() -> int:
    """Serve `demo` with the options parsed at the top of this file."""
    from troubleshooter.ui import server

    settings = server.SETTINGS
    if not server.is_loopback(settings.host) and settings.auth is None:
        print(f"warning: serving on {settings.host} without --auth: anyone who can reach the port can use it",
              file=sys.stderr)
    demo.launch(**server.launch_kwargs(settings), css=CSS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
