"""Model specs: a YAML layer stack, a built-in preset, or (opt-in) a Python file -> `Workload`.

    from troubleshooter.spec import SpecSource, load_workload
    wl = load_workload(SpecSource.preset("gpt:d_model=128,n_layer=2"))

Bad specs raise one `SpecError` listing every problem; oversized ones are refused before
anything is allocated (limits: `TROUBLESHOOTER_MAX_PARAMS`, `TROUBLESHOOTER_MAX_MEMORY_GB`).
"""
from .cli_args import add_spec_arguments, source_from_args
from .estimate import DEFAULT_MAX_MEMORY_GB, DEFAULT_MAX_PARAMS, Limits
from .example import EXAMPLE_YAML
from .layers import ALLOWED_LAYERS
from .loader import load_workload, run_with_workload
from .presets import list_presets, preset_descriptions
from .source import SpecSource

__all__ = [
    "ALLOWED_LAYERS", "DEFAULT_MAX_MEMORY_GB", "DEFAULT_MAX_PARAMS", "EXAMPLE_YAML", "Limits",
    "SpecSource", "add_spec_arguments", "list_presets", "load_workload", "preset_descriptions",
    "run_with_workload", "source_from_args",
]
