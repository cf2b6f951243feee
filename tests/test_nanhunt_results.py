"""Where the hooks keep a step's min/max (issue 28): 0-d views of a buffer reused from step to
step, read back in one slice; amin + amax for large float32/float64 CPU tensors. The values a
report shows must be those of the tensors themselves, step after step, whatever path was taken."""
import pytest
import torch
from torch import nn

from troubleshooter.engine import nanhooks
from troubleshooter.engine.nanhooks import HookSet


class Record(nn.Module):
    """Identity that keeps a copy of what passed (the expected min/max of the module before it)."""

    def __init__(self, seen):
        super().__init__()
        self.seen = seen

    def forward(self, x):
        self.seen.append(x.detach().clone())
        return x * 1.0


class Scale(nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.ones((), dtype=dtype))

    def forward(self, x):
        return x * self.weight


class ToDouble(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(4, 4).double()

    def forward(self, x):
        return self.inner(x.double()).float()


class Gate(nn.Module):
    """Doubles its input, or (`.relu`) applies a ReLU, whose output is an alias slot of its input
    (no reduction: the slot's view in the buffer is not written that step)."""

    def __init__(self):
        super().__init__()
        self.relu = False

    def forward(self, x):
        return torch.relu(x) if self.relu else x * 2


def outputs_by_module(model, run):
    """Each module's outputs in call order, captured by plain forward hooks of the test."""
    seen = {}
    handles = [m.register_forward_hook(lambda mod, i, o, n=n: seen.setdefault(n, []).append(o.detach().clone()))
               for n, m in model.named_modules() if n]
    try:
        run()
    finally:
        for h in handles:
            h.remove()
    return seen


def as_reported(x):
    """The report's float: values are read back as float32 (so are those of float64 tensors)."""
    return x.float().item()


def check_summary(rep, seen):
    for call in rep.calls:
        if not call["module"]:
            continue
        out = seen[call["module"]].pop(0)
        assert (call["min"], call["max"]) == (as_reported(out.min()), as_reported(out.max())), call["module"]


def test_values_are_each_steps_own_through_buffer_growth_and_reuse():
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(150)])  # > 512 values: the buffer grows in step 0
    hooks = HookSet(model).attach()
    try:
        for step in range(3):
            x = torch.randn(2, 4) * (step + 1)
            seen = outputs_by_module(model, lambda: model(x).sum().backward())
            rep = hooks.collect()
            assert rep.finite
            check_summary(rep, seen)
        with torch.no_grad():
            model[120].bias[0] = float("-inf")
        model(torch.randn(2, 4)).sum().backward()
        rep = hooks.collect()
        assert rep.forward["module"] == "120" and rep.forward["value"] == "-inf" and rep.forward["created"]
        with torch.no_grad():
            model[120].bias[0] = 0.0
        model.zero_grad()
        model(torch.randn(2, 4)).sum().backward()
        assert hooks.collect().finite  # the next step's values replace the bad ones
    finally:
        hooks.detach()


def test_two_dtypes_in_one_step_keep_their_values():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), ToDouble(), nn.Linear(4, 2))
    hooks = HookSet(model).attach()
    try:
        for _ in range(2):
            seen = outputs_by_module(model, lambda: model(torch.randn(3, 4)).sum().backward())
            rep = hooks.collect()
            assert rep.finite
            check_summary(rep, seen)
    finally:
        hooks.detach()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_large_cpu_tensors_use_amin_amax_with_the_same_verdict(dtype, value):
    n = nanhooks._SPLIT_FROM + 5  # a length that ends off the vector width
    seen = []
    model = nn.Sequential(Scale(dtype), Record(seen))
    x = torch.randn(1, n, dtype=dtype)
    hooks = HookSet(model).attach()
    try:
        model(x).sum().backward()
        rep = hooks.collect()
        assert rep.finite and rep.calls[0]["module"] == "0"
        assert (rep.calls[0]["min"], rep.calls[0]["max"]) == (as_reported(seen[0].min()), as_reported(seen[0].max()))
        x[0, -1] = float(value)  # the last element: the tail of the vectorised loop
        model(x).sum().backward()
        rep = hooks.collect()
    finally:
        hooks.detach()
    fwd = rep.forward
    assert fwd["module"] == "0" and fwd["value"] == value and not fwd["created"]
    assert "input batch" in fwd["source"]


def test_a_slot_not_written_this_step_does_not_show_an_earlier_steps_value():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), Gate(), nn.Linear(4, 2))
    hooks = HookSet(model).attach()
    try:
        with torch.no_grad():
            model[0].bias[0] = float("-inf")
        model(torch.randn(3, 4)).sum().backward()
        assert not hooks.collect().finite  # the gate's output slot held -inf
        with torch.no_grad():
            model[0].bias[0] = 0.0
        model[1].relu = True  # the same slot is now an alias: its buffer view keeps the -inf
        model.zero_grad()
        model(torch.randn(3, 4)).sum().backward()
        rep = hooks.collect()
        assert rep.finite, (rep.forward, rep.backward)
        assert {c["module"]: c["finite"] for c in rep.calls}["1"]
    finally:
        hooks.detach()


def test_slots_without_values_read_as_zero_even_where_an_earlier_step_wrote():
    """forward=False: module outputs get a slot but no reduction; a second forward in the step
    puts them where the first step's gradients were written."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    x = torch.randn(3, 4)
    hooks = HookSet(model, forward=False).attach()
    try:
        model(x).sum().backward()
        assert hooks.collect().finite
        (model(x).sum() + model(x).sum()).backward()
        rep = hooks.collect()
    finally:
        hooks.detach()
    assert rep.finite and rep.n_calls == 6
    assert all(c["min"] == c["max"] == 0.0 for c in rep.calls)


def test_hook_sets_alive_together_never_share_a_buffer_and_a_detached_ones_is_reused():
    torch.manual_seed(0)
    bad, good = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)), nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    with torch.no_grad():
        bad[1].bias[0] = float("nan")
    a, b = HookSet(bad).attach(), HookSet(good).attach()
    try:
        for _ in range(2):
            bad(torch.randn(3, 4)).sum().backward()
            good(torch.randn(3, 4)).sum().backward()  # written between a's writes and a's collect
            rep_a, rep_b = a.collect(), b.collect()
            assert rep_a.forward["module"] == "1" and rep_a.forward["value"] == "nan" and rep_b.finite
        buffers = {id(kept[0]) for kept in (*a._results.values(), *b._results.values())}
        assert len(buffers) == 2
    finally:
        a.detach()
        b.detach()
    c = HookSet(good).attach()
    try:
        good(torch.randn(3, 4)).sum().backward()
        assert c.collect().finite
        assert {id(kept[0]) for kept in c._results.values()} <= buffers  # handed back, taken again
    finally:
        c.detach()


@pytest.mark.parametrize("numel", [64, 40000])  # `aminmax`, and `amin` + `amax` (float32 CPU >= 32 K)
def test_a_zero_extreme_is_reported_as_zero_whatever_the_kernel_and_the_sign_of_its_zeros(numel):
    """Which signed zero a min/max kernel returns depends on the kernel and on where the -0.0s
    lie (issue 28: the split into amin/amax changed it); the per-call summary reports 0.0."""
    model = nn.Sequential(Scale(torch.float32), Scale(torch.float32))
    zeros = torch.zeros(numel)
    zeros[::2] = -0.0  # -0.0 and 0.0 interleaved: the vectorised loop and the tail disagree
    hooks = HookSet(model).attach()
    try:
        for x in (zeros, -zeros, torch.full((numel,), -0.0)):
            model(x)
            calls = hooks.collect().calls
            for call in calls:
                assert (call["min"], call["max"]) == (0.0, 0.0) and str(call["min"]) == str(call["max"]) == "0.0"
                assert call["constant"] and call["finite"]
    finally:
        hooks.detach()
