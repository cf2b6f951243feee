"""AMP125 autocast-without-device-type."""
import ast

from .base import Hit, Rule

# `torch.autocast` and `torch.amp.autocast` are one class whose first parameter, device_type, has no
# default; only the deprecated `torch.cuda.amp.autocast` / `torch.cpu.amp.autocast` imply a device.
_DEVICE_GENERIC = {"torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast"}


class AutocastWithoutDeviceType(Rule):
    id = "AMP125"
    name = "autocast-without-device-type"
    severity = "error"
    summary = "`torch.autocast(...)` / `torch.amp.autocast(...)` called without `device_type` (e.g. `torch.amp.autocast(enabled=use_amp)`)."
    why = ("Unlike the deprecated `torch.cuda.amp.autocast`, the device-generic autocast has no default device: "
           "the call raises `TypeError: autocast.__init__() missing 1 required positional argument: "
           "'device_type'` as soon as it runs, with `enabled=False` too. It often appears when "
           "`torch.cuda.amp.autocast(enabled=...)` is migrated by changing only the module path.")
    example_bad = """
with torch.amp.autocast(enabled=use_amp):
    loss = model(x)
"""
    example_good = """
with torch.amp.autocast("cuda", enabled=use_amp):
    loss = model(x)
"""
    fix = 'Pass the device first: `torch.amp.autocast("cuda", ...)` (or `device_type=device.type`).'

    known_problems = 'A call behind `**kwargs` may carry the device and is not reported.'
    references = ('https://pytorch.org/docs/stable/amp.html (torch.autocast)',)

    def check(self, m):
        for n, q in m.calls_resolving(lambda last: last == "autocast"):  # every name of _DEVICE_GENERIC
            if n.args:
                continue
            if any(k.arg is None or k.arg == "device_type" for k in n.keywords):
                continue  # **kwargs may carry the device
            if q in _DEVICE_GENERIC:
                yield Hit.at(n, f"`{ast.unparse(n.func)}(...)` has no `device_type`: it raises TypeError "
                                "(missing required argument 'device_type') when it runs")
