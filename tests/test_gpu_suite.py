"""bench/gpu_suite.py: the one command that measures every GPU path, known to work on a CPU.

The device machine has torch but neither pydantic nor gradio; these tests run the suite's CPU
dry run (tiny sizes, the same code paths) and check what it writes, and that what needs no
pydantic or gradio runs without them."""
from __future__ import annotations

import importlib
import sys

import pytest


def test_a_preset_loads_without_pydantic(monkeypatch):
    """Only a YAML spec is validated by pydantic: presets must load where it is missing."""
    import troubleshooter.spec as spec_package

    monkeypatch.setitem(sys.modules, "pydantic", None)  # `import pydantic` raises ImportError
    for name in ("loader", "yamlspec", "schema"):  # imported afresh, put back afterwards
        monkeypatch.delitem(sys.modules, f"troubleshooter.spec.{name}", raising=False)
        if name in vars(spec_package):
            monkeypatch.setattr(spec_package, name, vars(spec_package)[name])
    loader = importlib.import_module("troubleshooter.spec.loader")
    from troubleshooter.spec import SpecSource

    workload = loader.load_workload(SpecSource.preset("mlp:hidden=16,depth=2,in_features=8,batch_size=4"))
    assert workload.name.startswith("mlp") and workload.batch_size == 4
    with pytest.raises(ImportError):
        loader.load_workload(SpecSource.yaml_text("model:\n  layers: [ReLU]\ninput: {shape: [2, 4]}\n"))
