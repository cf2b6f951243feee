"""AMP Troubleshooter web app: `python app.py --help` for the serving options.

The page is built by `troubleshooter.ui.page`; this file only starts it. `demo` is built on
first use, so a worker process (spawn re-runs this file) never imports gradio.
"""
import sys


def __getattr__(name: str):
    """`app.demo` for tools that import this file (e.g. `gradio app.py`), built on first use."""
    if name == "demo":
        from troubleshooter.ui.page import build_demo

        demo = globals()["demo"] = build_demo()
        return demo
    raise AttributeError(name)


if __name__ == "__main__":
    from troubleshooter.ui import server

    settings = server.settings_or_exit(sys.argv[1:])  # --help or a mistake: answered before gradio loads
    server.apply_and_probe(settings)  # the device probe runs while gradio loads
    from troubleshooter.ui.page import serve

    sys.exit(serve(settings))
