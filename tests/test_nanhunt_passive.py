"""Passive modules (ReLU-like maps, plain Sequential containers) get no hooks (issue 11.8), and
no localisation is lost: every planted fault is named as it was with every module hooked."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from troubleshooter.engine.nanhooks import HookSet


class Log(nn.Module):
    """Parameter-free but can make -inf from finite input: log(0) after a ReLU."""

    def forward(self, x):
        return torch.log(x)


class SqrtAtZero(nn.Module):
    """Finite forward (sqrt of exactly 0), infinite slope: a backward-only inf."""

    def forward(self, x):
        return torch.sqrt(x - x.detach())


class BigLeak(nn.Module):
    """A functional leaky ReLU with a huge slope in forward code: it CAN overflow, so its
    autograd node must not pass for a passive one (its saved slope is checked)."""

    def __init__(self):
        super().__init__()
        self.lin = negative_linear(8, 8)
        self.out = nn.Linear(8, 2)

    def forward(self, x):
        return self.out(F.leaky_relu(self.lin(x), negative_slope=1e38))


class MaskedSoftmax(nn.Module):
    """A fully masked row (-inf everywhere, made by code) turns into NaN in nn.Softmax."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.act = nn.ReLU()
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x):
        scores = self.act(self.lin(x))
        scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool), float("-inf"))
        return self.softmax(scores)


class ScaleInPlace(nn.Module):
    """Overflows its own input in place: its inputs must be read BEFORE the call (a user's
    module keeps its pre-hook; only built-in leaves that never write inputs lose it)."""

    def forward(self, x):
        return x.mul_(1e38)


def overflow_linear(n_in, n_out):
    lin = nn.Linear(n_in, n_out)
    with torch.no_grad():
        lin.weight.fill_(3e38)
    return lin


def constant_linear(n_in, n_out, value):
    """Outputs `value` everywhere (finite), whatever the input."""
    lin = nn.Linear(n_in, n_out)
    with torch.no_grad():
        lin.weight.zero_()
        lin.bias.fill_(value)
    return lin


def negative_linear(n_in, n_out):
    """Outputs -100 everywhere: a slope of 1e38 after it overflows to -inf."""
    return constant_linear(n_in, n_out, -100.0)


def cases():
    """(name, model builder) of planted faults; each built after manual_seed(0)."""
    return [
        ("overflow after relu", lambda: nn.Sequential(nn.Linear(8, 16), nn.ReLU(), overflow_linear(16, 2))),
        ("overflow after inplace relu",
         lambda: nn.Sequential(nn.Linear(8, 16), nn.ReLU(inplace=True), overflow_linear(16, 2))),
        ("log of relu zeros", lambda: nn.Sequential(nn.Linear(8, 16), nn.ReLU(), Log(), nn.Linear(16, 2))),
        ("backward sqrt at zero via relu",
         lambda: nn.Sequential(nn.Linear(8, 8), nn.ReLU(), SqrtAtZero(), nn.Linear(8, 2))),
        ("backward sqrt at zero via gelu in nested sequentials",
         lambda: nn.Sequential(nn.Sequential(nn.Linear(8, 8), nn.GELU()),
                               nn.Sequential(SqrtAtZero(), nn.Linear(8, 2)))),
        ("leaky relu with a huge slope (module)",
         lambda: nn.Sequential(negative_linear(8, 8), nn.LeakyReLU(1e38), nn.Linear(8, 2))),
        ("leaky relu with a huge slope (code)", BigLeak),
        ("masked softmax", MaskedSoftmax),
        ("in-place overflow in a user module",
         lambda: nn.Sequential(constant_linear(8, 8, 100.0), ScaleInPlace(), nn.Linear(8, 2))),
    ]


def hunt(build, skip: bool):
    torch.manual_seed(0)
    model = build()
    hooks = HookSet(model)
    hooks.skip_passive_modules = skip
    hooks.attach()
    try:
        torch.manual_seed(1)
        x = torch.randn(4, 8)
        model(x).square().mean().backward()
        return hooks.collect(), hooks
    finally:
        hooks.detach()


def brief(event):
    keys = ("module", "class", "phase", "created", "value", "grad_of")
    return None if event is None else {k: event.get(k) for k in keys}


# with every module hooked, the gradient blame stopped at the outer Sequential (the consumer
# that completed last); without its hooks it reaches the module inside: more precise, not equal
SHARPER = {"backward sqrt at zero via gelu in nested sequentials"}


@pytest.mark.parametrize("name,build", cases(), ids=[c[0] for c in cases()])
def test_same_verdict_as_with_every_module_hooked(name, build):
    new, _ = hunt(build, skip=True)
    old, _ = hunt(build, skip=False)
    assert not new.finite, name  # every case is a planted fault
    assert brief(new.forward) == brief(old.forward), name
    if name in SHARPER:
        assert old.backward["module"] == "1" and new.backward["module"] == "1.0"
        assert new.backward["module"].startswith(old.backward["module"] + ".")
    else:
        assert brief(new.backward) == brief(old.backward), name


def test_planted_faults_are_named_at_the_module_that_makes_them():
    def first(build):
        rep, _ = hunt(build, skip=True)
        return rep.forward or rep.backward

    by_name = dict(cases())
    ev = first(by_name["overflow after relu"])
    assert (ev["module"], ev["created"], ev["value"]) == ("2", True, "inf")  # the ReLU changed nothing
    ev = first(by_name["overflow after inplace relu"])
    assert (ev["module"], ev["created"]) == ("2", True)
    ev = first(by_name["log of relu zeros"])  # a parameter-free module that CAN make one is hooked
    assert (ev["module"], ev["class"], ev["created"], ev["value"]) == ("2", "Log", True, "-inf")
    ev = first(by_name["backward sqrt at zero via relu"])  # fully masked by ReLU's backward: still seen
    assert (ev["phase"], ev["module"], ev["class"]) == ("backward", "2", "SqrtAtZero")
    ev = first(by_name["backward sqrt at zero via gelu in nested sequentials"])
    assert (ev["phase"], ev["module"], ev["class"]) == ("backward", "1.0", "SqrtAtZero")
    ev = first(by_name["leaky relu with a huge slope (module)"])
    assert (ev["module"], ev["class"], ev["created"], ev["value"]) == ("1", "LeakyReLU", True, "-inf")
    ev = first(by_name["leaky relu with a huge slope (code)"])  # not mistaken for a passive map
    assert (ev["module"], ev["created"]) == ("out", False)
    assert "forward()" in ev["source"]
    ev = first(by_name["in-place overflow in a user module"])  # inputs seen before the write
    assert (ev["module"], ev["class"], ev["created"], ev["value"]) == ("1", "ScaleInPlace", True, "inf")
    ev = first(by_name["masked softmax"])  # the -inf came from code; Softmax turned it into NaN
    assert (ev["module"], ev["class"], ev["value"], ev["created"]) == ("softmax", "Softmax", "nan", False)


def test_passive_modules_and_covered_containers_carry_no_hooks():
    torch.manual_seed(0)
    inner = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))  # all children hooked: no hooks of its own
    tail = nn.Sequential(nn.Linear(8, 8), nn.ReLU())  # ends in an unhooked ReLU: keeps its hooks
    model = nn.Sequential(inner, nn.ReLU(), nn.Dropout(0.0), nn.Dropout(0.5), nn.LeakyReLU(2.0), tail)
    hooks = HookSet(model).attach()
    try:
        hooked = {name for name, m in model.named_modules() if m._forward_hooks}
        assert hooked == {"", "0.0", "0.1", "3", "4", "5", "5.0"}
        model(torch.randn(4, 8)).sum().backward()
        rep = hooks.collect()
        assert rep.finite
        assert [c["module"] for c in rep.calls] == ["0.0", "0.1", "3", "4", "5.0", "5", ""]
    finally:
        hooks.detach()
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_relu_output_is_not_reduced_again():
    """The ReLU's output is an alias of the Linear's output (no second aminmax), and the
    backward blame walks through the alias to the module that consumed it."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    counts = {}
    for skip in (True, False):
        rep, hooks = hunt(lambda: model, skip)
        assert rep.finite
        counts[skip] = rep.n_calls
    assert counts == {True: 3, False: 4}  # Linear, Linear, root (and the ReLU when hooked)


@pytest.mark.parametrize("poison", [False, True])
def test_per_call_summary_gives_each_output_max_abs_on_finite_and_non_finite_steps(poison):
    """`StepReport.calls` is built on first use, from the raw (min, max) pairs when the step was
    finite and from the analysed values otherwise: both give each call's true max |output|,
    through the alias of an unhooked ReLU too."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    outputs = {}
    handles = [m.register_forward_hook(lambda mod, i, o, n=n: outputs.__setitem__(n, o.detach().clone()))
               for n, m in model.named_modules()]
    if poison:
        with torch.no_grad():
            model[2].bias[1] = float("inf")
    hooks = HookSet(model).attach()
    try:
        model(-torch.rand(4, 8) * 3).sum().backward()
        rep = hooks.collect()
    finally:
        hooks.detach()
        for h in handles:
            h.remove()
    assert rep.finite is not poison
    summary = {c["module"]: c for c in rep.calls}
    assert set(summary) == {"0", "2", ""}
    assert summary["0"]["finite"] and summary["0"]["max_abs"] == pytest.approx(outputs["0"].abs().max().item())
    assert summary["2"]["finite"] is not poison and summary[""]["finite"] is not poison
    if not poison:
        assert summary["2"]["max_abs"] == pytest.approx(outputs["2"].abs().max().item())
        assert summary[""]["max_abs"] == summary["2"]["max_abs"]
    assert rep.calls is rep.calls  # built once
