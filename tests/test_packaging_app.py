"""`amp-troubleshooter app`: serves the packaged page when there is one, else the checkout's app.py,
with app.py's own options. The page and gradio are stand-ins here (no server starts)."""
import importlib.machinery
import importlib.util
import sys
import types

import pytest

from troubleshooter.cli import main
from troubleshooter.commands import app as app_command
from troubleshooter.ui import server

PAGE = "troubleshooter.ui.page"


@pytest.fixture
def fake_gradio(monkeypatch):
    monkeypatch.setitem(sys.modules, "gradio", types.ModuleType("gradio"))
    yield
    server.apply(server.Settings())  # the command applies settings process-wide


def fake_page(monkeypatch, calls: dict):
    class Demo:
        def launch(self, **kwargs):
            calls["launch"] = kwargs

    def build_demo():
        calls["allow_exec_at_build"] = server.SETTINGS.allow_exec
        return Demo()

    page = types.ModuleType(PAGE)
    page.__spec__ = importlib.machinery.ModuleSpec(PAGE, None)
    page.build_demo = build_demo
    monkeypatch.setitem(sys.modules, PAGE, page)


def test_packaged_page_is_served_with_the_apps_options(fake_gradio, monkeypatch):
    calls = {}
    fake_page(monkeypatch, calls)
    assert main(["app", "--port", "7011", "--allow-exec"]) == 0
    assert calls["allow_exec_at_build"] is True  # settings are in force before the layout is built
    assert calls["launch"]["server_port"] == 7011 and calls["launch"]["server_name"] == "127.0.0.1"


def test_bad_app_option_is_one_line_and_status_2(fake_gradio, monkeypatch, capsys):
    fake_page(monkeypatch, {})
    with pytest.raises(SystemExit) as stop:
        main(["app", "--port", "0"])
    assert stop.value.code == 2 and capsys.readouterr().err.startswith("error: --port")


def test_without_a_packaged_page_the_checkout_app_py_runs_with_the_same_argv(fake_gradio, monkeypatch):
    if importlib.util.find_spec(PAGE) is not None:
        pytest.skip("this tree packages the page; the app.py fallback is not used")
    ran = {}
    monkeypatch.setattr(app_command.runpy, "run_path",
                        lambda path, run_name: ran.update(path=path, argv=list(sys.argv), run_name=run_name))
    monkeypatch.setattr(sys, "argv", ["amp-troubleshooter", "app", "--port", "7012"])
    assert main(["app", "--port", "7012"]) == 0
    assert ran["path"].endswith("app.py") and ran["argv"][1:] == ["--port", "7012"] and ran["run_name"] == "__main__"


def test_no_page_and_no_checkout_is_a_clear_error(fake_gradio, monkeypatch, capsys):
    if importlib.util.find_spec(PAGE) is not None:
        pytest.skip("this tree packages the page")
    monkeypatch.setattr(app_command, "_checkout_app", lambda: None)
    assert main(["app"]) == 2
    assert "no page to serve" in capsys.readouterr().err
