"""The named API endpoints, driven through gradio_client against `python app.py` on a loopback
port: uploads, downloads, readable errors, and a fast call answered while a speedup runs."""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.server

FIXTURES = Path(__file__).parent / "fixtures"
TINY_MLP = "mlp:hidden=32,depth=2,in_features=16,batch_size=8"
RUNNING = ("PROCESSING", "PROGRESS", "ITERATING")
ENDPOINTS = {"lint", "rules", "check", "inspect", "capability", "speedup", "recommend", "explain", "recipe",
             "trace"}


class JsonClient:
    """gradio_client's Client; endpoint results that are JSON text come back decoded."""

    def __init__(self, url: str, downloads: Path):
        from gradio_client import Client

        self.raw = Client(url, verbose=False, download_files=str(downloads))

    def predict(self, **kwargs):
        return _decode(self.raw.predict(**kwargs))

    def submit(self, **kwargs):
        return self.raw.submit(**kwargs)

    def view_api(self, **kwargs):
        return self.raw.view_api(**kwargs)


def _decode(out):
    if isinstance(out, (tuple, list)):  # several outputs (JSON itself always arrives as text)
        return tuple(_decode(o) for o in out)
    if isinstance(out, str) and out.startswith(("{", "[")):
        return json.loads(out)
    return out


@pytest.fixture(scope="module")
def client(app_server):
    return JsonClient(app_server.url, app_server.log_path.parent / "downloads")


def _app_error(client, match: str, **kwargs):
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError) as info:
        client.predict(**kwargs)
    assert match in str(info.value), str(info.value)
    assert "Traceback" not in str(info.value)
    return str(info.value)


def test_the_server_process_starts_without_torch(app_server):
    """The page is built from plain data (preset catalogue, the host probe's JSON answer): torch loads
    only in the job workers, never in the server (1.5 s and ~180 MiB less to start)."""
    assert app_server.torch_at_start is False


def test_every_named_endpoint_is_published_with_named_typed_outputs(client):
    named = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    assert ENDPOINTS <= {name.lstrip("/") for name in named}
    for name in named:  # each output named and described, with its type (not "1st: Any")
        for out in named[name]["returns"]:
            assert out["python_type"]["type"] != "Any" and out["python_type"]["description"], (name, out)
            assert not re.fullmatch(r"\d+(st|nd|rd|th)", out["label"]), (name, out)
    lint_out = [(o["label"], o["python_type"]["type"]) for o in named["/lint"]["returns"]]
    assert lint_out == [("report", "str"), ("report_md", "filepath"), ("report_json", "filepath"),
                        ("fixed_script", "str"), ("diff", "str"), ("fixed_file", "None | filepath"),
                        ("diff_file", "None | filepath")]  # new outputs appended: old positions hold


def test_lint_upload_and_download(client, tmp_path):
    from gradio_client import handle_file

    script = tmp_path / "train.py"
    script.write_text((FIXTURES / "lint" / "bad_AMP101.py").read_text())
    report, md_path, json_path, fixed, diff, fixed_path, diff_path = \
        client.predict(code="", file=handle_file(str(script)), api_name="/lint")
    rules = {f["rule"] for f in report["findings"]}
    assert "AMP101" in rules
    assert all(f["path"] == "train.py" for f in report["findings"])
    assert json.loads(Path(json_path).read_text()) == report  # the download is the same report
    md = Path(md_path).read_text()
    assert "AMP101" in md and Path(md_path).name == "train_amp_report.md"
    # the corrected script and its diff, as the page offers them
    assert "scaler.unscale_(" in fixed and "+" in diff and "unscale_" in diff
    assert Path(fixed_path).read_text() == fixed and Path(diff_path).read_text() == diff

    pasted, _, _, fixed, diff, fixed_path, _ = client.predict(code="import torch\nx = torch.zeros(3)\n",
                                                               api_name="/lint")
    assert pasted["findings"] == [] and fixed == diff == "" and fixed_path is None
    only, *_ = client.predict(code=script.read_text(), file=None, ignore="AMP101", api_name="/lint")
    assert "AMP101" not in {f["rule"] for f in only["findings"]}
    _app_error(client, "unknown rule", code="x = 1\n", file=None, select="AMP9", api_name="/lint")


def test_lint_refuses_binary_and_empty_input_readably(client, tmp_path):
    from gradio_client import handle_file

    blob = tmp_path / "model.py"
    blob.write_bytes(b"\x80\x02ctorch\x00\x00\x01binary")
    _app_error(client, "binary file", code="", file=handle_file(str(blob)), api_name="/lint")
    _app_error(client, "nothing to diagnose", code="  ", file=None, api_name="/lint")


def test_rules_and_explanations(client):
    table, text = client.predict(rule_id="", api_name="/rules")
    assert {"AMP101", "AMP124"} <= {r["id"] for r in table}
    rule, text = client.predict(rule_id="amp101", api_name="/rules")
    assert rule["id"] == "AMP101" and "unscale_" in text
    _app_error(client, "unknown rule", rule_id="AMP999", api_name="/rules")


def test_capability_and_inspect(client, tmp_path):
    import torch
    from gradio_client import handle_file

    cap = client.predict(device="auto", api_name="/capability")
    assert cap["recommended_precision"] in ("fp32", "bf16", "fp16") and cap["reason"]

    ckpt = tmp_path / "model.pt"
    torch.save({"model": torch.nn.Linear(10, 3).half().state_dict(), "step": 3}, ckpt)
    report = client.predict(checkpoint=handle_file(str(ckpt)), api_name="/inspect")
    assert isinstance(report, dict) and "findings" in report
    assert report["path"] == "model.pt"  # the user's name for it, not the server's upload folder
    text = tmp_path / "notes.pt"
    text.write_text("not a checkpoint")
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError) as info:
        client.predict(checkpoint=handle_file(str(text)), api_name="/inspect")
    assert "notes.pt" in str(info.value) and "/tmp" not in str(info.value)


def test_check_an_uploaded_spec_and_bad_specs(client, tmp_path):
    from gradio_client import handle_file

    spec = tmp_path / "my_spec.yaml"
    spec.write_text((FIXTURES / "check" / "misaligned.yaml").read_text())
    result, png = client.predict(preset="", yaml_text="", spec_file=handle_file(str(spec)), weights_file=None,
                                 device="cpu", checks="alignment,skiprate", steps=4, api_name="/check")
    assert any(not r["aligned"] for r in result["alignment"])
    assert "AMP201" in {f["rule"] for f in result["findings"]}
    assert result["skiprate"]["summary"]["steps"] == 4
    assert result["skipped"].keys() == {"capability", "nan", "headroom"}
    if png is not None:
        assert Path(png).read_bytes()[:4] == b"\x89PNG"
    _app_error(client, "line", preset="", yaml_text="model:\n  layers: [\n", spec_file=None, weights_file=None,
               device="cpu", checks="alignment", steps=4, api_name="/check")
    _app_error(client, "unknown preset", preset="nosuch", yaml_text="", spec_file=None, weights_file=None,
               device="cpu", checks="alignment", steps=4, api_name="/check")
    _app_error(client, "weights", preset="", yaml_text="weights: /etc/passwd\n", spec_file=None,
               weights_file=None, device="cpu", checks="alignment", steps=4, api_name="/check")
    # the JSON is the CheckReport's, as `check --format json` prints it (plus the job's times)
    from troubleshooter.engine.check_report import CheckReport

    assert CheckReport.from_dict(result).to_dict() == result and result["job"]["device"] == "cpu"
    # options are judged by the engine's rules, in the page's words, before any worker starts
    for bad, match in [(dict(steps=2.5), "whole number"), (dict(checks="alignment,magic"), "unknown check"),
                       (dict(budget_s=-1), "seconds above 0"), (dict(device="cuda:7"), "cuda:7")]:
        text = _app_error(client, match, **{"preset": "mlp", "device": "cpu", "checks": "alignment", "steps": 2,
                                            "api_name": "/check", **bad})
        assert "--" not in text  # no command-line flag in an API message


def test_lint_answers_while_speedups_run_one_at_a_time(client):
    """Two speedups queue behind each other (one device, one job); lint is answered meanwhile.
    Judged by each job's own start/end times from the server, not by polled (maybe stale) status."""
    first = client.submit(preset=TINY_MLP, yaml_text="", spec_file=None, device="cpu",
                          precisions="fp32,bf16", budget_s=4, compile=False, api_name="/speedup")
    second = client.submit(preset=TINY_MLP, precisions="fp32", budget_s=1, api_name="/speedup")  # defaults
    deadline = time.monotonic() + 60  # wait until the first job is really running
    while time.monotonic() < deadline and first.status().code.name not in RUNNING:
        time.sleep(0.1)
    t0 = time.monotonic()
    report, *_ = client.predict(code=(FIXTURES / "lint" / "bad_AMP106.py").read_text(), file=None,
                                api_name="/lint")
    lint_done, lint_s = time.time(), time.monotonic() - t0
    assert {f["rule"] for f in report["findings"]} >= {"AMP106"}
    assert lint_s < 10, f"lint took {lint_s:.1f} s while a speedup ran"

    result, png = _decode(first.result(timeout=180))
    other = _decode(second.result(timeout=180))[0]
    a, b = sorted((result["job"], other["job"]), key=lambda j: j["started"])
    assert a["finished"] <= b["started"], f"two jobs ran on one device at once: {a} {b}"
    assert result["job"]["started"] < lint_done < result["job"]["finished"], \
        "lint was not answered while the first speedup ran: the test proves nothing"
    # a 4 s budget on a loaded host may leave bf16 untimed: then it is listed with the reason
    assert set(result["results"]) | set(result["skipped"]) == {"fp32", "bf16"} and "fp32" in result["results"]
    assert result["verdict"]["recommendation"]
    assert Path(png).read_bytes()[:4] == b"\x89PNG"
    assert set(other["results"]) == {"fp32"}


def test_questionnaire_recipe_and_explain(client):
    decision, code, path = client.predict(answers=json.dumps({"gpu": "T4", "symptoms": ["nan_loss"],
                                                              "grad_clipping": True}), api_name="/recommend")
    assert decision["precision"] == "fp16" and decision["reasons"]
    assert decision["recipe_options"]["precision"] == "fp16"
    assert Path(path).name == "train_amp.py" and Path(path).read_text() == code
    assert "GradScaler" in code and "unscale_" in code
    compile(code, "train_amp.py", "exec")
    _app_error(client, "symptoms", answers='{"gpu": "T4", "symptoms": ["bogus"]}', api_name="/recommend")
    _app_error(client, "JSON object", answers="gpu=T4", api_name="/recommend")

    default_code, _ = client.predict(api_name="/recipe")  # every option at its default
    assert "GradScaler" in default_code
    code, path = client.predict(options='{"precision": "bf16", "accum": 4}', api_name="/recipe")
    assert 'PRECISION = "bf16"' in code and Path(path).read_text() == code
    _app_error(client, "channels", options='{"channels_last": true, "model": "transformer"}', api_name="/recipe")

    report = client.predict(text="RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\nloss: nan",
                            api_name="/explain")
    assert {"oom", "nan_loss"} <= set(report["symptoms"])
    _app_error(client, "paste an error", text="  ", api_name="/explain")


def test_lint_reads_uploads_like_the_cli(client, tmp_path):
    """A latin-1 script with a PEP 263 line lints as `lint FILE` does; a 3 MB one is refused as there."""
    from gradio_client import handle_file

    from troubleshooter.lint import lint_paths

    latin = tmp_path / "modele.py"
    latin.write_bytes(("# -*- coding: latin-1 -*-\n# réglage\n" + (FIXTURES / "lint" / "bad_AMP106.py").read_text())
                      .encode("latin-1"))
    report, *_ = client.predict(code="", file=handle_file(str(latin)), api_name="/lint")
    cli = lint_paths([str(latin)])
    assert not report["errors"]
    assert [(f["rule"], f["line"]) for f in report["findings"]] == [(f.rule, f.location.line) for f in cli.findings]
    big = tmp_path / "huge.py"
    big.write_bytes(b"x = 1\n" * 600_000)
    _app_error(client, "up to 2 MB", code="", file=handle_file(str(big)), api_name="/lint")


def test_trace_is_refused_readably_without_allow_exec(client, tmp_path):
    from gradio_client import handle_file

    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    _app_error(client, "--allow-exec", script=handle_file(str(script)), api_name="/trace")


# The operator's --allow-exec server (a hanging model file, trace, hostile callers) is driven by
# tests/test_app_hostile.py, which starts the only one.
