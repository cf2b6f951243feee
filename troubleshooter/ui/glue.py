"""The page's only gradio-aware helper: errors and progress for events.

Tab modules stay plain (they raise `UserError`, take an optional `progress(fraction, msg)`);
`page_event` turns that into what a page needs: the event never raises, the reason goes into
the tab's status box (and a toast), the other outputs are cleared, and a `gr.Progress` tracker
is relayed as `progress`. API endpoints have their own typed functions (`api.py`).
"""
from __future__ import annotations

from typing import Callable

import gradio as gr

from . import common


def _relay(tracker):
    def relay(fraction: float, message: str = "") -> None:
        tracker(fraction, desc=message or None)

    return relay


def page_event(fn: Callable, n_outputs: int, status_index: int = 0, clear: bool = True,
               progress: bool = False, blank: dict | None = None) -> Callable:
    """Wrap a page callback: on error, show it in output `status_index`, clear (or keep) the rest
    (`blank` maps an output's index to a function making what clears it when None cannot, e.g.
    a hidden layout: made then, since a component made while the page is built joins the page).
    With `progress`, gradio injects a tracker and `fn` gets it as its `progress` callable."""

    def call(args: tuple, kwargs: dict):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - every error becomes a message in the page
            message = common.error_message(exc)
            gr.Warning(message.splitlines()[0][:300], title="Could not do that")
            out = [None if clear else gr.skip()] * n_outputs
            for index, make in (blank or {}).items():
                out[index] = make() if clear else gr.skip()
            out[status_index] = common.error_markdown(message)
            return out[0] if n_outputs == 1 else tuple(out)

    if progress:
        def wrapper(*args, progress=gr.Progress()):  # noqa: B008 - gradio's injection marker
            return call(args, {"progress": _relay(progress)})
    else:
        def wrapper(*args):
            return call(args, {})
    wrapper.__name__ = getattr(fn, "__name__", "event")
    wrapper.__doc__ = fn.__doc__
    return wrapper


def scroll_to(elem_id: str) -> str:
    """Browser-side code for an event's `js`: bring element `elem_id` into view (top of the
    window), so a result that appears away from the button that asked for it is seen at once."""
    return ("() => { const el = document.getElementById(%r); "
            "if (el) el.scrollIntoView({behavior: 'instant', block: 'start'}); }" % elem_id)


def row_select(fn: Callable) -> Callable:
    """A table's select event -> `fn(state, clicked index)`; on no usable row, leave the output."""

    def wrapper(state, evt: gr.SelectData):
        value = fn(state, getattr(evt, "index", None))
        return gr.skip() if value is None else value

    wrapper.__name__ = getattr(fn, "__name__", "select")
    return wrapper
