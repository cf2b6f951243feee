"""The only gradio-aware helpers: error handling and progress for events.

Tab modules stay plain (they raise `UserError`, take an optional `progress(fraction, msg)`);
these wrappers turn that into what a page or an API client needs:
- page events never raise: the error goes into the tab's status box (and a toast) and the
  other outputs are cleared, so the page stays usable;
- API events raise `gr.Error(message)`, which gradio_client surfaces as the exception text;
- a `progress` parameter becomes a `gr.Progress` tracker.
"""
from __future__ import annotations

import functools
import inspect
import json
from typing import Callable

import gradio as gr

from . import common


def _progress_relay(tracker):
    if tracker is None:
        return None

    def relay(fraction: float, message: str = "") -> None:
        tracker(fraction, desc=message or None)

    return relay


def _with_progress(fn: Callable) -> Callable:
    """Give `fn`'s `progress` parameter a `gr.Progress()` default so gradio injects a tracker."""
    sig = inspect.signature(fn)
    if "progress" not in sig.parameters:
        return fn
    params = [p.replace(default=gr.Progress()) if p.name == "progress" else p for p in sig.parameters.values()]
    new_sig = sig.replace(parameters=params)

    def wrapper(*args, **kwargs):
        bound = new_sig.bind(*args, **kwargs)
        tracker = bound.arguments.get("progress")
        bound.arguments["progress"] = _progress_relay(tracker if isinstance(tracker, gr.Progress) else None)
        return fn(*bound.args, **bound.kwargs)

    wrapper.__signature__ = new_sig
    wrapper.__name__ = getattr(fn, "__name__", "event")
    wrapper.__doc__ = fn.__doc__
    return wrapper


def page_event(fn: Callable, n_outputs: int, status_index: int = 0, clear: bool = True) -> Callable:
    """Wrap a page callback: on error, show it in output `status_index`, clear (or keep) the rest."""
    inner = _with_progress(fn)

    @functools.wraps(inner)
    def wrapper(*args, **kwargs):
        try:
            return inner(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - every error becomes a message in the page
            message = common.error_message(exc)
            gr.Warning(message.splitlines()[0][:300], title="Could not do that")
            blank = None if clear else gr.skip()
            out = [blank] * n_outputs
            out[status_index] = common.error_markdown(message)
            return out[0] if n_outputs == 1 else tuple(out)

    return wrapper


def selected_row(fn: Callable) -> Callable:
    """A table's select event -> `fn(row values)`; on no usable row, leave the output as it is."""

    def wrapper(evt: gr.SelectData):
        value = fn(getattr(evt, "row_value", None))
        return gr.skip() if value is None else value

    wrapper.__name__ = getattr(fn, "__name__", "select")
    return wrapper


def as_json_text(value):
    """dict/list -> JSON text. gradio_client treats any dict with a string "path" key in a
    result as a file to download (lint findings have one), so data travels as JSON text."""
    if isinstance(value, (dict, list)):
        return json.dumps(value, indent=2, default=str, ensure_ascii=False)
    return value


def api_event(fn: Callable) -> Callable:
    """Wrap an API function: a user's mistake becomes `gr.Error` with the readable message;
    dict/list results become JSON text (see `as_json_text`)."""
    inner = _with_progress(fn)

    @functools.wraps(inner)
    def wrapper(*args, **kwargs):
        try:
            out = inner(*args, **kwargs)
        except gr.Error:
            raise
        except Exception as exc:  # noqa: BLE001
            raise gr.Error(common.error_message(exc), print_exception=False) from None
        return tuple(as_json_text(o) for o in out) if isinstance(out, tuple) else as_json_text(out)

    return wrapper
