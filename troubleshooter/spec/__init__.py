"""Model specs: a YAML layer stack, a built-in preset, or (opt-in) a Python file -> `Workload`.

    from troubleshooter.spec import SpecSource, load_workload
    wl = load_workload(SpecSource.preset("gpt:d_model=128,n_layer=2"))

Bad specs raise one `SpecError` listing every problem; oversized ones are refused before
anything is allocated (limits: `TROUBLESHOOTER_MAX_PARAMS`, `TROUBLESHOOTER_MAX_MEMORY_GB`).
The command-line helpers, `SpecSource` and `EXAMPLE_YAML` import without torch, so building
the CLI parser stays cheap; the loaders import it on first use.
"""
from .cli_args import add_spec_arguments, source_from_args
from .example import EXAMPLE_YAML
from .presets import list_presets, preset_descriptions
from .source import SpecSource

_LAZY = {
    "load_workload": "loader", "run_with_workload": "loader", "precheck": "quick_check",
    "Limits": "estimate", "DEFAULT_MAX_PARAMS": "estimate", "DEFAULT_MAX_MEMORY_GB": "estimate",
    "ALLOWED_LAYERS": "layers",
}

__all__ = ["SpecSource", "EXAMPLE_YAML", "add_spec_arguments", "list_presets", "preset_descriptions",
           "source_from_args", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
