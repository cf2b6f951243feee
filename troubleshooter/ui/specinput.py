"""Turn the model-picker inputs (preset + parameters, YAML editor, or an upload) into a SpecSource.

Shared by the Check and Speedup tabs and their API endpoints, so a model is described the
same way everywhere, and an uploaded Python file is refused unless the operator allowed it.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from ..errors import UserError
from . import common
from .server import SETTINGS

MODES = ("Preset", "YAML", "Upload")
SPEC_KINDS = (".yaml", ".yml", ".py")


def _spec():
    from .. import spec

    return spec


def presets() -> dict:
    """{name: {"params": {param: default}, "description": str}}."""
    spec = _spec()
    descriptions = spec.preset_descriptions()
    return {name: {"params": dict(params), "description": descriptions.get(name, "")}
            for name, params in spec.list_presets().items()}


def preset_names() -> list[str]:
    return list(presets())


def params_text(preset: str | None) -> str:
    """The preset's parameters with their defaults, `k=v,k=v`, for the parameters box."""
    info = presets().get(preset or "")
    if not info:
        return ""
    return ",".join(f"{k}={v}" for k, v in info["params"].items())


def preset_description(preset: str | None) -> str:
    info = presets().get(preset or "")
    if not info:
        return ""
    params = ", ".join(f"`{k}`={v}" for k, v in info["params"].items())
    return f"{info['description']}" + (f"\n\nParameters (defaults): {params}" if params else "")


def example_yaml() -> str:
    return _spec().EXAMPLE_YAML


def preset_source(preset: str | None, params: str | None):
    preset = (preset or "").strip()
    if not preset:
        raise UserError("pick a preset")
    params = ",".join(p.strip() for p in (params or "").replace("\n", ",").split(",") if p.strip())
    return _spec().SpecSource.preset(f"{preset}:{params}" if params else preset)


def _weights_dir(weights_upload) -> str:
    """A fresh directory holding only the uploaded weights (if any): the spec's base_dir.

    A spec typed into a web page must not reach files on the server, so relative `weights:`
    resolve here and absolute or `..` paths are refused (see `_confine_weights`).
    """
    folder = str(common.fresh_dir(prefix="amp-spec-"))
    path = common.upload_path(weights_upload)
    if path:
        common.check_size(path, SETTINGS.max_file_bytes)
        shutil.copyfile(path, os.path.join(folder, common.display_name(path)))
    return folder


def _confine_weights(text: str, folder: str) -> None:
    """Read the spec with the bounded loader (an alias bomb is refused here, before any value is
    built) and refuse a `weights:` path that leaves the spec's own upload folder."""
    data, _ = _spec_yaml().parse_yaml(text)
    weights = data.get("weights")
    if not isinstance(weights, str):
        return  # absent, or not a path: the schema says so with its line
    if os.path.isabs(os.path.expanduser(weights)) or ".." in Path(weights).parts:
        raise UserError(f"weights: {weights!r}: in the web app the weights file must be uploaded beside the spec "
                        "and named by its file name only")
    if not os.path.exists(os.path.join(folder, weights)):
        raise UserError(f"the spec names weights {weights!r}: upload that file in the 'weights' box too")


def _spec_yaml():
    from ..spec import yamlspec

    return yamlspec


def yaml_source(text: str | None, weights_upload=None):
    text = common.check_text_size(text, SETTINGS.max_file_bytes, "the YAML spec")
    if not text.strip():
        raise UserError("the YAML editor is empty: write a spec (the example shows the fields) or pick a preset")
    folder = _weights_dir(weights_upload)
    _confine_weights(text, folder)
    return _spec().SpecSource.yaml_text(text, base_dir=folder)


def upload_source(upload, weights_upload=None):
    """An uploaded YAML spec (read as text) or, with --allow-exec only, a Python model file."""
    path = common.upload_path(upload)
    if not path:
        raise UserError("upload a model spec (.yaml) or, if this server allows it, a Python model file (.py)")
    name = common.display_name(path)
    suffix = Path(name).suffix.lower()
    spec = _spec()
    if suffix in (".yaml", ".yml"):
        limit = _spec_yaml().MAX_SPEC_BYTES
        if os.path.getsize(path) > limit:  # refused before reading it, let alone parsing it
            raise UserError(f"{name} is {os.path.getsize(path):,} bytes, over the limit of {limit:,} for a "
                            "model spec (a layer stack is a few KiB)")
        text = common.read_text_upload(path, SETTINGS.max_file_bytes, SPEC_KINDS, "a model spec")
        return yaml_source(text, weights_upload)
    if suffix == ".py":
        common.read_text_upload(path, SETTINGS.max_file_bytes, SPEC_KINDS, "a Python model file")
        if not SETTINGS.allow_exec:
            raise UserError(
                f"{name} is a Python model file: this server does not run uploaded code. Use a YAML spec "
                "or a preset, or ask the operator to start the app with --allow-exec (it then runs in a "
                "child process with a time limit)"
            )
        return spec.SpecSource.python_file(path)
    raise UserError(f"{name}: expected a model spec (.yaml/.yml) or a Python model file (.py)")


def source_from_inputs(mode: str | None, preset: str | None, params: str | None,
                       yaml_text: str | None, upload, weights_upload=None):
    """The page's picker: `mode` says which of the three inputs is meant."""
    mode = mode or "Preset"
    if mode == "Preset":
        return preset_source(preset, params)
    if mode == "YAML":
        return yaml_source(yaml_text, weights_upload)
    if mode == "Upload":
        return upload_source(upload, weights_upload)
    raise UserError(f"unknown model source {mode!r}: use one of {', '.join(MODES)}")


def source_for_api(preset: str | None, yaml_text: str | None, upload, weights_upload=None):
    """The API's picker: the first given of an uploaded file, YAML text, a preset spec string."""
    if common.upload_path(upload):
        return upload_source(upload, weights_upload)
    if (yaml_text or "").strip():
        return yaml_source(yaml_text, weights_upload)
    if (preset or "").strip():
        name, _, params = preset.strip().partition(":")
        return preset_source(name, params)
    raise UserError("give a model: a preset (e.g. 'mlp' or 'gpt:d_model=256,n_layer=2'), YAML text, or a spec file")


def is_python(source) -> bool:
    return getattr(source, "kind", None) == "python"


def validate(source) -> None:
    """What can be refused without building the model (`spec.precheck`: hostile or malformed YAML,
    bad preset parameters, a preset too big by its computed size), answered in the server before
    a job is queued. The model itself is built only in the job, under the job's time limit, and
    Python files are only ever imported in their own child process."""
    if not is_python(source):
        _spec().precheck(source)
