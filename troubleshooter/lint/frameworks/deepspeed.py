"""DeepSpeed: `deepspeed.initialize(...)`, its JSON config, and the engine's own loss scaling.

DeepSpeed is not installed here: read in microsoft/DeepSpeed at commit 38327e07 (version.txt
0.16.5; deepspeed/runtime/config.py, constants.py, engine.py, fp16/loss_scaler.py):

- config.py: `assert not (self.fp16_enabled and self.bfloat16_enabled), 'bfloat16 and fp16 modes
  cannot be simultaneously enabled'` (both `"fp16": {"enabled": true}` and `"bf16"` (or the old
  `"bfloat16"`) enabled fail at initialize).
- constants.py: `"loss_scale": 0` (the default) means dynamic loss scaling; any other number is a
  static scale that never adapts (no skip-and-halve, no growth). `initial_scale_power` defaults to 16.
- engine.py: `engine.backward(loss)` scales the loss itself under fp16; `engine.step()` unscales,
  clips with the config's `gradient_clipping`, skips the step on overflow (`skipped_steps`,
  `was_step_applied()`), and steps the LR scheduler it was given only when the step was applied.
  A scheduler kept outside the engine steps on overflow-skipped steps unless the script checks
  `was_step_applied()`. `save_checkpoint` stores the loss scaler with the optimizer.
- Under ZeRO the gradients live in the engine's partitions, not in `param.grad`; torch's
  `clip_grad_norm_` and a torch GradScaler see nothing or the wrong values. Messages it prints:
  "[deepspeed] OVERFLOW! Rank N Skipping step. Attempted loss scale: ..., reducing to ...",
  "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run."
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from operator import attrgetter

from ..analysis import kwarg, receiver, tail, text
from . import BF16, FP16, FP32, Setup, of, imports
from .configs import ConfigFile, configs_of
from .values import CONFIG, LITERAL, NOTHING, Value, literal_dict, resolve

_ARG = attrgetter("arg")
_DICT_MARKERS = frozenset({"zero_optimization", "train_micro_batch_size_per_gpu"})  # a dict display that is a config

NAME = "deepspeed"
DS_KEYS = {"zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size", "gradient_clipping",
           "gradient_accumulation_steps", "fp16", "bf16"}


@dataclass
class DSConfig:
    """A DeepSpeed config: a dict in the script or a JSON file, and where its keys are."""

    data: dict
    node: ast.AST  # the script line that names it (the dict itself, or the reference to the file)
    file: ConfigFile | None = None
    dict_node: ast.AST | None = None
    beside: bool = False  # may not be the config used: a JSON beside the script it does not name, or a default

    def where(self, *keys: str) -> str:
        if self.file is not None:
            return self.file.where(*keys)
        line = _key_line(self.dict_node, keys) if self.dict_node is not None else None
        return f"line {line or self.node.lineno}"

    def block(self, name: str) -> dict:
        for key in ([name, "bfloat16"] if name == "bf16" else [name]):
            b = self.data.get(key)
            if isinstance(b, dict):
                return b
        return {}

    def enabled(self, name: str):
        """True, False, "auto" (the HF integration fills it from TrainingArguments) or None (absent)."""
        b = self.block(name)
        if not b:
            return None
        return b.get("enabled", False)

    def precision(self) -> Value:
        fp16, bf16 = self.enabled("fp16"), self.enabled("bf16")
        opts = [p for p, on in ((FP16, fp16), (BF16, bf16)) if on is True]
        if "auto" in (fp16, bf16):
            return NOTHING
        how = CONFIG if self.file is not None else LITERAL
        key = "fp16" if fp16 is True else "bf16"
        return Value(tuple(opts) or (FP32,), how, f"{self.where(key, 'enabled')}: {key} enabled" if opts
                     else f"{self.where()}: neither fp16 nor bf16 enabled")


def _key_line(node: ast.AST, keys) -> int | None:
    for k in keys[:1]:
        if isinstance(node, ast.Dict):
            for kn, vn in zip(node.keys, node.values):
                if isinstance(kn, ast.Constant) and kn.value == k:
                    inner = _key_line(vn, keys[1:]) if len(keys) > 1 else None
                    return inner or kn.lineno
    return None


def _looks_like_ds(d: dict) -> bool:
    keys = set(d)
    return bool(keys & (DS_KEYS - {"fp16", "bf16"})) or isinstance(d.get("fp16"), dict) or isinstance(d.get("bf16"), dict)


def initialize_calls(m) -> list[ast.Call]:
    return [c for c in m.calls_named("initialize") if (m.names.qual(c.func) or "").startswith("deepspeed")]


def config_from(m, node: ast.AST | None) -> DSConfig | None:
    if node is None:
        return None
    target = node
    if isinstance(node, ast.Name):
        for v in m.assigns.get(node.id, []):
            if isinstance(v, (ast.Dict, ast.Call)):
                target = v
                break
    d = literal_dict(target, m)
    if d is not None:
        return DSConfig(d, node, None, target)
    r = resolve(m, node)
    for opt in r.options:
        if isinstance(opt, str):
            cfg = configs_of(m).named(opt)
            if cfg is not None:
                return DSConfig(cfg.data, node, cfg, beside=r.how != LITERAL)
    return None


def configs(m) -> list[DSConfig]:
    """The DeepSpeed configs this script uses: passed to deepspeed.initialize, to
    TrainingArguments(deepspeed=...), named by a `--deepspeed_config` default, written as a dict,
    or a DeepSpeed JSON beside the script (when the script uses DeepSpeed)."""
    def compute():
        out: list[DSConfig] = []
        seen: set[int] = set()

        def add(cfg):
            key = id(cfg.dict_node) if cfg is not None and cfg.dict_node is not None else \
                (cfg.file.path if cfg is not None and cfg.file is not None else None)
            if cfg is not None and key not in seen and _looks_like_ds(cfg.data):
                seen.add(key)  # one config named by initialize and written as a dict is one config
                out.append(cfg)
        for c in initialize_calls(m):
            add(config_from(m, kwarg(c, "config") or kwarg(c, "config_params")))
        for c in m.calls_named("TrainingArguments", "Seq2SeqTrainingArguments", "SFTConfig",
                               "DeepSpeedPlugin", "HfDeepSpeedConfig", "DeepSpeedStrategy"):
            kw = kwarg(c, "deepspeed") or kwarg(c, "hf_ds_config") or kwarg(c, "config") or (c.args[0] if c.args else None)
            add(config_from(m, kw))
        for node in m.of_class(ast.Dict):
            if any(k.__class__ is ast.Constant and k.value in _DICT_MARKERS for k in node.keys):
                d = literal_dict(node, m)
                if d and _looks_like_ds(d):
                    add(DSConfig(d, node, None, node))
        anchor = (initialize_calls(m) or [None])[0] or (m.tree.body[0] if m.tree.body else None)
        for acc in configs_of(m).of_kind("accelerate"):  # `accelerate launch` with a DeepSpeed plugin config
            named = acc.get("deepspeed_config", "deepspeed_config_file")
            cfg = configs_of(m).named(named) if isinstance(named, str) else None
            if cfg is not None and anchor is not None and imports(m, "accelerate"):
                add(DSConfig(cfg.data, anchor, cfg, beside=True))
        # the folder's listing first: with no config file beside the script, whether it uses DeepSpeed is not asked
        if anchor is not None and configs_of(m).may_have_beside() and (
                uses_deepspeed(m) or imports(m, "transformers", "trl", "accelerate")):
            # `--deepspeed ds_config.json` / `accelerate launch --deepspeed_config_file`: a DeepSpeed JSON beside
            # a Trainer or Accelerate script is probably the one it runs with (a warning, never an error)
            for cfg in configs_of(m).of_kind("deepspeed"):
                add(DSConfig(cfg.data, anchor, cfg, beside=True))
        return out
    return m.memo.get(("deepspeed_configs",), compute)


def uses_deepspeed(m) -> bool:
    return imports(m, "deepspeed") or bool(m.calls_named("DeepSpeedStrategy")) or (
        "deepspeed" in set(map(_ARG, m.of_class(ast.keyword)))  # class keywords too: checked below
        and any(k.arg == "deepspeed" for c in m.calls for k in c.keywords))


def engine_keys(m) -> tuple[set[str], set[str], set[str]]:
    """(engines, optimizers, schedulers) that deepspeed.initialize returns or was handed."""
    engines, opts, scheds = set(), set(), set()
    for node in m.of_class(ast.Assign):
        v = node.value
        if isinstance(v, ast.Call) and v in initialize_calls(m):
            for t in node.targets:
                elts = t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]
                for i, sub in enumerate(elts):
                    k = tail(sub)
                    if not k or k == "_":
                        continue
                    (engines if i == 0 else opts if i == 1 else scheds if i == 3 else set()).add(k)
            sched = kwarg(v, "lr_scheduler")
            if sched is not None and tail(sched):
                scheds.add(tail(sched))
    return engines, opts, scheds


def setups(m) -> list[Setup]:
    """This framework's setups in the file (computed once, by `find`)."""
    return of(m, NAME)


def find(m) -> list[Setup]:
    calls = initialize_calls(m)
    cfgs = configs(m)
    if not calls and not cfgs:
        return []
    engines, opts, scheds = engine_keys(m)
    precision = cfgs[0].precision() if cfgs else NOTHING
    node = calls[0] if calls else cfgs[0].node
    return [Setup(NAME, node, precision, frozenset(engines or {"model_engine", "engine"}),
                  f"deepspeed.initialize(...) (line {node.lineno})" if calls else f"the DeepSpeed config ({cfgs[0].where()})",
                  {"configs": cfgs, "optimizers": opts, "schedulers": scheds,
                   "unknown_because": "the DeepSpeed config is not in this file or beside it"})]


def owner(m, recv: str | None, scope) -> Setup | None:
    for s in setups(m):
        if recv in s.keys and initialize_calls(m):
            return s
    return None


def describe(node: ast.AST) -> str:
    return text(node)[:60]


def engine_step_calls(m, engines: set[str]) -> list[ast.Call]:
    return [c for c in m.calls_named("step") if receiver(c) is not None and tail(receiver(c)) in engines]
