"""The real page in headless Chromium (Debian's, driven by Playwright): the four user actions,
a bad upload, and screenshots of each (tests/artifacts/, a few copied to docs/screenshots/)."""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.server]

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "tests" / "artifacts"
FIXTURES = ROOT / "tests" / "fixtures"
TIMEOUT_MS = 120_000


def expect(locator):
    from playwright.sync_api import expect as _expect

    return _expect(locator)


def _skip_reason() -> str | None:
    if not os.path.exists(CHROMIUM):
        return f"{CHROMIUM} is missing: apt-get install chromium chromium-driver (see README)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed: pip install -r requirements-dev.txt"
    return None


@pytest.fixture(scope="module")
def page(app_server):
    reason = _skip_reason()
    if reason:
        print(f"skipping browser tests: {reason}")
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM, headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run"],
        )
        context = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
        pg = context.new_page()
        pg.set_default_timeout(TIMEOUT_MS)
        from playwright.sync_api import expect as _expect

        _expect.set_options(timeout=TIMEOUT_MS)
        pg.goto(app_server.url, wait_until="load")  # gradio keeps connections open: no "network idle"
        pg.locator("#header-device").wait_for()
        yield pg
        context.close()
        browser.close()


@pytest.fixture(autouse=True)
def screenshot_on_failure(request, page):
    """A failing browser test leaves tests/artifacts/FAILED-<test>.png: the page as it was."""
    failed_before = request.session.testsfailed
    yield
    if request.session.testsfailed > failed_before:
        shot(page, f"FAILED-{request.node.name}")


def shot(page, name: str, docs: bool = False) -> None:
    path = ARTIFACTS / f"{name}.png"
    if docs:  # README pictures show the tab itself, not a toast left over from an earlier test
        page.evaluate("document.querySelectorAll('.toast-body').forEach(e => e.remove())")
    page.screenshot(path=str(path), full_page=True)
    if docs and os.environ.get("AMP_UPDATE_SCREENSHOTS"):
        dest = ROOT / "docs" / "screenshots"
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest / f"{name}.png")


def open_tab(page, title: str) -> None:
    page.get_by_role("tab", name=title).click()


def upload(page, elem_id: str, path: Path) -> None:
    page.locator(f"#{elem_id} input[type=file]").set_input_files(str(path))
    # wait for gradio to finish uploading: the file's row shows in the component. Found by its label:
    # the row's text is the name cut into stem and extension (`hangs .py`), shortened when long.
    page.locator(f"#{elem_id} [aria-label={json.dumps(path.name)}]").first.wait_for()


def test_header_shows_the_device(page):
    header = page.locator("#header-device")
    assert "This server:" in header.inner_text()


def test_diagnose_an_uploaded_script(page, tmp_path):
    open_tab(page, "Diagnose a script")
    script = tmp_path / "train_bad.py"
    script.write_text((FIXTURES / "lint" / "bad_AMP101.py").read_text()
                      + "\n" + (FIXTURES / "lint" / "bad_AMP106.py").read_text())
    upload(page, "lint-upload", script)
    page.locator("#lint-run").click()
    table = page.locator("#lint-findings")
    expect(table).to_contain_text("AMP101 clip-before-unscale")
    expect(table).to_contain_text("AMP106")
    expect(table).to_contain_text("clip_grad_norm_(model.parameters(), 1.0)")  # the offending line
    expect(page.locator("#lint-status")).to_contain_text(re.compile(r"\d+ errors?, \d+ warnings?"))
    expect(page.locator("#lint-explanation")).to_contain_text("Why it matters")
    shot(page, "diagnose", docs=True)
    table.get_by_text("AMP106 deprecated-amp-api").first.click()  # a finding's row explains its rule
    expect(page.locator("#lint-explanation")).to_contain_text("AMP106")
    with page.expect_download() as dl:
        page.locator("#lint-md a").first.click()
    saved = ARTIFACTS / "report.md"
    dl.value.save_as(str(saved))
    assert "AMP101" in saved.read_text()


def test_the_one_error_is_the_first_row_and_the_infos_fold_away(page):
    """Issue 27: sorted by line, five padding hints filled the table and buried the only error."""
    open_tab(page, "Diagnose a script")
    clear = page.locator("#lint-upload button[aria-label='Clear']")
    if clear.count():  # an earlier test's upload
        clear.first.click()
        expect(clear).to_have_count(0)
    upload(page, "lint-upload", FIXTURES / "app" / "one_error.py")
    page.locator("#lint-run").click()
    status = page.locator("#lint-status")
    expect(status).to_contain_text("Results for one_error.py")
    expect(status).to_contain_text("1 error, 0 warnings, 5 infos")
    expect(status).to_be_in_viewport()
    first_row = page.locator("#lint-findings tbody tr").first
    expect(first_row).to_contain_text("ERROR")
    expect(first_row).to_contain_text("AMP101")
    expect(page.locator("#lint-findings")).not_to_contain_text("AMP121")
    infos = page.locator("#lint-info-findings")
    expect(infos).to_be_hidden()  # folded away until asked for
    page.locator("#lint-infos").get_by_text("5 infos").click()
    expect(infos).to_be_visible()
    expect(infos).to_contain_text("AMP121")


def test_binary_upload_shows_a_clear_error_and_page_stays_usable(page, tmp_path):
    open_tab(page, "Diagnose a script")
    page.locator("#lint-upload button[aria-label='Clear']").first.click()
    blob = tmp_path / "weights.py"
    blob.write_bytes(b"PK\x03\x04\x00\x00\x00\x00 binary checkpoint")
    upload(page, "lint-upload", blob)
    page.locator("#lint-run").click()
    expect(page.locator("#lint-status")).to_contain_text("weights.py: binary file")
    assert "Traceback" not in page.content()
    shot(page, "diagnose-binary-error")
    # still usable: clear the upload and lint pasted code
    page.locator("#lint-upload button[aria-label='Clear']").first.click()
    editor = page.locator("#lint-code .cm-content")
    editor.click()
    page.keyboard.insert_text("import torch\nscaler = torch.cuda.amp.GradScaler()\n")
    page.locator("#lint-run").click()
    expect(page.locator("#lint-findings")).to_contain_text("AMP106")
    expect(page.locator("#lint-status")).not_to_contain_text("Error")


def test_questionnaire_recommends_and_the_recipe_downloads(page):
    open_tab(page, "Questionnaire")
    page.locator("#q-detect").click()
    expect(page.locator("#q-detected")).to_contain_text("Detected on the server:")
    expect(page.locator("#q-gpu textarea")).not_to_have_value("")
    page.locator("#q-gpu textarea").fill("A100")
    page.locator("#q-symptoms").get_by_text("nan_loss").click()
    page.locator("#q-grad_clipping").get_by_role("checkbox").check()
    page.locator("#q-run").click()
    expect(page.locator("#q-recommendation")).to_contain_text("Recommendation: BF16")
    expect(page.locator("#q-recommendation")).to_be_in_viewport()  # the button is ~2,000 px below it
    expect(page.locator("#q-recommendation")).to_contain_text("clip")
    expect(page.locator("#q-code")).to_contain_text("autocast")
    with page.expect_download() as dl:
        page.locator("#q-script a").first.click()
    assert dl.value.suggested_filename == "train_amp.py"
    saved = ARTIFACTS / "train_amp.py"
    dl.value.save_as(str(saved))
    text = saved.read_text()
    assert 'PRECISION = "bf16"' in text and "clip_grad_norm_" in text
    compile(text, "train_amp.py", "exec")
    shot(page, "questionnaire", docs=True)


def test_check_a_yaml_spec(page):
    open_tab(page, "Check a model")
    page.locator("#check-mode").get_by_text("YAML").click()
    editor = page.locator("#check-yaml .cm-content")
    expect(editor).to_contain_text("tiny-mlp")  # prefilled with the commented example
    example = editor.inner_text()
    editor.click()
    page.keyboard.press("Control+A")
    page.keyboard.insert_text("name: bad\nbatch_size: -3\nlayers:\n  - foo: 1\ninput: [1, 2]\n")
    page.locator("#check-run").click()  # below the picker: the problems must come into view, not only a toast
    status = page.locator("#check-status")
    expect(status).to_contain_text("4 problems in the spec")
    for problem in ("line 1: model", "line 5: input", "line 2: batch_size", "line 3: layers"):
        expect(status.get_by_text(problem)).to_be_in_viewport()
    editor.click()
    page.keyboard.press("Control+A")
    page.keyboard.insert_text(example)
    page.keyboard.press("Control+Home")  # the editor shows the spec from its start again
    page.locator("#check-steps input").fill("6")
    budget = page.locator("#check-budget input")  # the checks' shared time budget
    budget.fill("40")
    budget.press("Tab")
    page.locator("#check-run").click()
    expect(page.locator("#check-status")).to_contain_text("tiny-mlp")
    expect(page.locator("#check-status")).not_to_contain_text("problems")  # the failed run's text is gone
    expect(page.locator("#check-status")).to_be_in_viewport()
    expect(page.locator("#check-status")).to_contain_text("Time budget 40 s")  # the box reached the engine
    expect(page.locator("#check-alignment-summary")).to_contain_text("sizes checked")
    expect(page.locator("#check-alignment")).to_contain_text("out_features")
    expect(page.locator("#check-nan")).to_contain_text("bf16")
    expect(page.locator("#check-headroom-table")).to_contain_text("Linear")
    expect(page.locator("#check-capability")).to_contain_text("Recommended precision")
    expect(page.locator("#check-skiprate-plot img").first).to_be_visible()
    shot(page, "check", docs=True)


def test_speedup_on_a_tiny_preset(page):
    open_tab(page, "Speedup check")
    params = page.locator("#speed-params textarea")
    params.fill("hidden=32,depth=2,in_features=16,batch_size=8")
    budget = page.locator("#speed-budget input[type=number]")
    budget.fill("2")
    budget.press("Enter")
    page.locator("#speed-run").click()
    expect(page.locator("#speed-verdict")).to_contain_text("Verdict:", timeout=TIMEOUT_MS)
    expect(page.locator("#speed-status")).to_be_in_viewport()
    expect(page.locator("#speed-plot img").first).to_be_visible()
    table = page.locator("#speed-table")
    for precision in ("fp32", "fp16", "bf16", "tf32"):
        expect(table).to_contain_text(precision)
    shot(page, "speedup", docs=True)


def test_unparsable_script_is_not_called_clean_and_cannot_run_without_exec(page):
    open_tab(page, "Diagnose a script")
    clear = page.locator("#lint-upload button[aria-label='Clear']")
    if clear.count():
        clear.first.click()
    editor = page.locator("#lint-code .cm-content")
    editor.click()
    page.keyboard.press("Control+A")
    page.keyboard.press("Delete")
    page.keyboard.insert_text("def train(:\n    pass\n")
    page.locator("#lint-run").click()
    status = page.locator("#lint-status")
    expect(status).to_contain_text("could not analyse it")
    expect(status).to_contain_text("syntax error")
    expect(status).not_to_contain_text("no findings")
    page.get_by_text("Run it on this host (a few steps").first.click()  # open its accordion
    expect(page.locator("#trace-run")).to_be_disabled()
    expect(page.locator("#trace-disabled")).to_contain_text("--allow-exec")


def test_inspect_a_checkpoint_shows_its_summary(page, tmp_path):
    import torch

    open_tab(page, "Check a model")
    page.locator("#check-inspect-box").get_by_text("Inspect a checkpoint").first.click()
    ckpt = tmp_path / "weights_only.pt"
    torch.save(torch.nn.Linear(8, 4).half().state_dict(), ckpt)  # a bare state_dict: weights at the top level
    upload(page, "check-ckpt", ckpt)
    page.locator("#check-inspect").click()
    result = page.locator("#check-inspect-result")
    expect(result).to_contain_text("model weights at <top level>")
    expect(result).to_contain_text("float16")
    expect(result).not_to_contain_text("/tmp")
    expect(result).to_be_in_viewport()
    summary = result.locator("pre").first  # the CLI's summary: its long finding lines wrap in the box
    widths = summary.evaluate("e => [e.scrollWidth, e.clientWidth, Math.max(...e.innerText.split('\\n')"
                              ".map(l => l.length))]")
    assert widths[2] > 120, f"no line long enough to need wrapping: {widths}"
    assert widths[0] <= widths[1] + 1, f"the summary runs off the right edge: {widths}"
    shot(page, "inspect", docs=True)


@pytest.fixture(scope="module")
def exec_page(page):
    """A second server, started as an operator would for trusted users, in its own tab of the
    same browser (one Playwright per process)."""
    from tests.test_app_harness import AppServer

    server = AppServer("--allow-exec", "--job-timeout", "20")
    pg = page.context.browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        pg.set_default_timeout(TIMEOUT_MS)
        pg.goto(server.url, wait_until="load")
        pg.locator("#header-device").wait_for()
        yield pg
    finally:
        pg.close()
        server.close()


def test_with_allow_exec_a_hanging_model_ends_readably_and_a_second_run_replaces_the_first(exec_page, tmp_path):
    page = exec_page
    open_tab(page, "Check a model")
    page.locator("#check-mode").get_by_text("Upload").click()
    model = tmp_path / "hangs.py"
    model.write_text("import time\ndef build_model():\n    time.sleep(900)\ndef make_batch(batch_size):\n    return None\n")
    upload(page, "check-spec-file", model)
    page.locator("#check-run").click()
    status = page.locator("#check-status")
    expect(status).to_contain_text("time limit of 20 s", timeout=90_000)
    for leak in ("/tmp", "_job", "Traceback"):
        expect(status).not_to_contain_text(leak)

    # a second run replaces the first: status, table, plot and reports all belong to the new script
    open_tab(page, "Diagnose a script")
    page.locator("#lint-code .cm-content").click()
    page.keyboard.insert_text(SCALED_LOOP)
    page.get_by_text("Run it on this host (a few steps").first.click()
    page.locator("#trace-steps input").fill("2")
    page.locator("#trace-run").click()
    trace_status = page.locator("#trace-status")
    expect(trace_status).to_contain_text(re.compile(r"Ran pasted\.py|not available"))
    expect(trace_status).not_to_contain_text("/tmp")
    if "not available" in trace_status.inner_text():
        return  # no trace module in this build: the sentence is the result
    expect(page.locator("#lint-status")).to_contain_text("Results for pasted.py")
    expect(page.locator("#lint-findings")).to_contain_text("AMP101")  # the pasted loop clips before unscaling
    stopped = "time limit" in trace_status.inner_text() + page.locator("#lint-findings").inner_text()
    if not stopped:  # (a loaded host can spend the server's 20 s limit before the loop: no scale to plot)
        expect(page.locator("#trace-plot")).to_be_visible()  # its GradScaler ran
    expect(trace_status).to_be_in_viewport()

    plain = tmp_path / "plain_run.py"
    plain.write_text("import torch\nprint(torch.ones(2).sum())\n")
    upload(page, "lint-upload", plain)  # the upload is what runs now
    page.locator("#trace-run").click()
    expect(trace_status).to_contain_text("Ran plain_run.py")
    expect(trace_status).not_to_contain_text("pasted.py")
    expect(page.locator("#lint-status")).to_contain_text("Results for plain_run.py")
    expect(page.locator("#lint-findings")).not_to_contain_text("AMP101")
    expect(page.locator("#trace-plot")).to_be_hidden()  # no GradScaler ran in this one
    expect(page.locator("#lint-md")).to_contain_text("plain_run")
    expect(trace_status).to_be_in_viewport()


SCALED_LOOP = """import torch
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu")
for step in range(2):
    with torch.autocast("cpu", dtype=torch.float16):
        loss = model(torch.randn(4, 8)).float().pow(2).mean()
    scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
"""
