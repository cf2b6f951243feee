"""The Gradio app's callbacks: plain functions over the library, one module per tab.

`page.py` only lays out components and wires events to these functions (`api.py` publishes them
as typed endpoints), so every behaviour
the page has can be tested by calling a function (tests/test_app_callbacks.py).
"""
