"""`amp-troubleshooter app [--host ...]`: serve the web page and its Gradio API.

The same server as `python app.py` with the same options (`amp-troubleshooter app --help`).
It builds the page from `troubleshooter.ui.page.build_demo()` where the package has it (an
installed wheel); in a checkout without it, it runs the checkout's app.py with the same argv.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import runpy
import sys
from pathlib import Path

from ..errors import UserError


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "app", help="serve the web page and its Gradio API (options: amp-troubleshooter app --help)",
        description="Serve the AMP Troubleshooter page; every option of `python app.py` works here.",
        add_help=False)
    p.add_argument("app_args", nargs=argparse.REMAINDER, help="--host, --port, --auth, --allow-exec, ...")
    p.set_defaults(func=lambda args: launch(args.app_args))


def _checkout_app() -> Path | None:
    """app.py next to the package, when the package runs from a source checkout."""
    candidate = Path(__file__).resolve().parents[2] / "app.py"
    return candidate if candidate.is_file() else None


def _installed(name: str) -> bool:
    """Whether `name` can be imported, without importing it (gradio takes seconds)."""
    if name in sys.modules:
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def launch(argv: list[str]) -> int:
    if not _installed("gradio"):  # fail here, with the install hint, not deep in the page
        raise UserError("the app needs gradio, which is not installed here: "
                        "pip install 'amp-troubleshooter[app]' (or pip install -r requirements.txt)") from None
    page_name = f"{__package__.rsplit('.', 1)[0]}.ui.page"
    if _installed(page_name):
        from ..ui import server

        settings = server.settings_or_exit(argv)  # --help or a mistake: answered before gradio loads
        server.apply_and_probe(settings)  # the device probe runs while gradio loads
        page = importlib.import_module(page_name)
        if hasattr(page, "build_demo"):
            return _serve(page, settings)
    app_py = _checkout_app()
    if app_py is None:
        raise UserError("this installation has no page to serve (no troubleshooter.ui.page); "
                        "run `python app.py` from a checkout instead")
    sys.argv = [str(app_py), *argv]
    runpy.run_path(str(app_py), run_name="__main__")  # app.py exits with its own status
    return 0


def _serve(page, settings) -> int:
    from ..ui import server

    if hasattr(page, "serve"):  # the page's own way: settings, hardening, warm workers, launch
        return page.serve(settings)
    server.apply(settings)  # before building: the layout reads the settings (e.g. --allow-exec)
    if not server.is_loopback(settings.host) and settings.auth is None:
        print(f"warning: serving on {settings.host} without --auth: anyone who can reach the port can use it",
              file=sys.stderr)
    demo = page.build_demo()
    extra = {"css": page.CSS} if getattr(page, "CSS", None) else {}
    demo.launch(**server.launch_kwargs(settings), **extra)
    return 0
