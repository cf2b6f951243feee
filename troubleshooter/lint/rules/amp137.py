"""AMP137 deepspeed-with-grad-scaler."""
import ast

from ..analysis import func_tail, receiver, tail
from ..frameworks import deepspeed
from .base import Hit, Rule


class DeepSpeedWithGradScaler(Rule):
    id = "AMP137"
    name = "deepspeed-with-grad-scaler"
    severity = "error"
    summary = "A torch `GradScaler` used around a DeepSpeed engine (`engine.backward(scaler.scale(loss))`, `scaler.step(...)`)."
    why = ("The DeepSpeed engine does its own loss scaling under fp16 (the config's `fp16` block) and its own "
           "unscale, clip and skip in `engine.step()`; under ZeRO the gradients are partitioned and not in "
           "`param.grad`. A torch GradScaler on top multiplies the loss a second time and its `unscale_`/`step` "
           "never see the engine's gradients: updates are scaled wrong and overflows are not skipped by it.")
    example_bad = """
model_engine, optimizer, _, _ = deepspeed.initialize(model=model, config="ds_config.json")
scaler = torch.amp.GradScaler("cuda")
with torch.autocast("cuda", dtype=torch.float16):
    loss = model_engine(batch)
model_engine.backward(scaler.scale(loss))
model_engine.step()
"""
    example_good = """
model_engine, optimizer, _, _ = deepspeed.initialize(model=model, config="ds_config.json")  # "fp16": {"enabled": true}
loss = model_engine(batch)
model_engine.backward(loss)
model_engine.step()
"""
    fix = "Drop the GradScaler: enable `fp16` (dynamic loss scaling) or `bf16` in the DeepSpeed config and call `engine.backward(loss)` / `engine.step()`."
    known_problems = "Only a GradScaler built in the same file as `deepspeed.initialize` is seen."
    references = ("https://www.deepspeed.ai/docs/config-json/#fp16-training-options",)

    def check(self, m):
        if not deepspeed.initialize_calls(m) or not m.scaler_ctor:
            return
        engines, opts, _ = deepspeed.engine_keys(m)
        engines = engines or {"model_engine", "engine"}
        reported = False
        for c in m.calls:
            r = receiver(c)
            if func_tail(c) == "backward" and r is not None and tail(r) in engines and c.args:
                a = c.args[0]
                if isinstance(a, ast.Call) and func_tail(a) == "scale" and receiver(a) is not None \
                        and m.is_scaler(tail(receiver(a))):
                    reported = True
                    yield Hit.at(c, f"`{tail(r)}.backward(...)` is given a loss the GradScaler already scaled: DeepSpeed "
                                    "scales (fp16) and unscales it itself, so this scale is never undone",
                                 "call `engine.backward(loss)` and drop the GradScaler", framework="deepspeed")
            if func_tail(c) == "step" and r is not None and m.is_scaler(tail(r)) and c.args and \
                    (tail(c.args[0]) in opts | engines):
                reported = True
                yield Hit.at(c, f"`{tail(r)}.step({tail(c.args[0])})` steps the DeepSpeed optimizer through a torch "
                                "GradScaler: the engine's gradients are its own (partitioned under ZeRO, scaled by its "
                                "loss scaler)", "step with `engine.step()` and drop the GradScaler", framework="deepspeed")
        if not reported:
            for key, ctors in m.scaler_ctor.items():
                if m.scaler_enabled(key):
                    yield Hit.at(ctors[0], f"a torch GradScaler (`{key}`) in a script that trains with a DeepSpeed engine, "
                                           "which does its own loss scaling", "drop it: DeepSpeed's config `fp16` block "
                                           "scales the loss", framework="deepspeed").lowered("warning")
                    break
