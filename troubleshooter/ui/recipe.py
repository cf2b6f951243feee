"""Recipe builder: the training-loop generator's options as controls, the rendered loop, its file."""
from __future__ import annotations


from ..bounded import load_json
from ..errors import UserError
from . import common

FILENAME = "train_amp.py"
_EXAMPLE = '{"precision": "bf16", "clip": 1.0}'


def options_meta() -> list[dict]:
    """Each option of `recipes.recipe_options()`: name, type, choices, default, help."""
    from ..recipes import recipe_options

    return recipe_options()


def _clean(meta: dict, value):
    """A control's value -> the option value (empty numbers of optional options are None)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if meta["type"] in ("int", "float") and isinstance(value, str):  # optional numbers come as text
        try:
            value = float(value.strip())
        except ValueError:
            raise UserError(f"{meta['flag']}: expected a number, not {value!r}") from None
    if meta["type"] == "int":
        if isinstance(value, float) and value != int(value):
            raise UserError(f"{meta['flag']} must be a whole number, not {value}")
        return int(value)
    if meta["type"] == "float":
        return float(value)
    if meta["type"] == "bool":
        return bool(value)
    return value


def options_from_controls(*values) -> dict:
    """Control values in `options_meta()` order -> {name: value}."""
    metas = options_meta()
    return {m["name"]: _clean(m, v) for m, v in zip(metas, values)}


def controls_from_options(options: dict) -> list:
    """{name: value} -> one value per control, defaults where `options` says nothing."""
    out = []
    for m in options_meta():
        value = options.get(m["name"], m.get("default"))
        out.append(value if value is not None else (None if m["type"] in ("int", "float") else m.get("default")))
    return out


def render(options: dict) -> tuple[str, str]:
    """(the generated script, its path for download as train_amp.py); UserError on bad combinations."""
    from ..recipes import render_recipe

    code = render_recipe(**options)  # None: the option's default (or off, for optional ones)
    return code, common.write_download(FILENAME, code)


def parse_options(options) -> dict:
    """API input: a JSON object (text or dict) of option names -> values."""
    if options is None or (isinstance(options, str) and not options.strip()):
        return {}
    if isinstance(options, dict):
        return dict(options)
    try:
        value = load_json(str(options), "options")
    except ValueError as exc:
        raise UserError(f"options must be a JSON object like {_EXAMPLE}: {exc}") from None
    if not isinstance(value, dict):
        raise UserError(f"options must be a JSON object like {_EXAMPLE}")
    return value


def ui_render(*values) -> tuple[str, str, str]:
    """The Regenerate button: (status, code, file)."""
    options = options_from_controls(*values)
    code, path = render(options)
    from ..recipes import recipe_command

    return f"Generated with `{recipe_command(options)}`", code, path
