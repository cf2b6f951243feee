"""`nanhunt` in a user's own loop: first bad module on the step it happens, one sync per step."""
import contextlib
import logging

import pytest
import torch
from torch import nn

import troubleshooter
from troubleshooter.engine import nanhooks
from troubleshooter.engine.nanhunt import NonFiniteError, nanhunt


class PoisonAt(nn.Module):
    """Identity until `.poison` is set: then writes NaN (or inf) into its output."""

    def __init__(self, value=float("nan")):
        super().__init__()
        self.poison = False
        self.value = value

    def forward(self, x):
        y = x * 1.0
        if self.poison:
            y = y.clone()
            y[0, 0] = self.value
        return y


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(inplace=True), PoisonAt(), nn.Linear(16, 2))


def train_step(model, x):
    model.zero_grad(set_to_none=True)
    model(x).square().mean().backward()


def no_hooks_left(model):
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules()) and all(
        not p._backward_hooks for p in model.parameters())


def test_reports_first_bad_module_on_the_step_it_happens_and_cleans_up():
    model, x = make_model(), torch.randn(4, 8)
    with nanhunt(model, log=False) as hunt:
        results = []
        for step in range(4):
            model[2].poison = step == 2
            train_step(model, x)
            results.append(hunt.step())
    assert results[0] is None and results[1] is None and results[3] is None
    event = results[2]
    assert event["step"] == 2 and hunt.report is event and len(hunt.events) == 1
    fwd = event["forward"]
    assert (fwd["module"], fwd["class"], fwd["dtype"], fwd["kind"]) == ("2", "PoisonAt", "float32", "nan")
    assert fwd["created"] and fwd["inputs_finite"] and fwd["input_max_abs"][0] > 0
    assert "module '2' (PoisonAt" in event["message"] and "creates the nan" in event["message"]
    assert no_hooks_left(model)


@contextlib.contextmanager
def forbid_host_sync():
    """Make the tensor methods that synchronise with the device fail while training runs."""
    names = ("item", "tolist", "cpu", "__bool__", "__float__")
    saved = {n: getattr(torch.Tensor, n) for n in names}

    def fail(*args, **kwargs):
        raise AssertionError("host sync inside a hook")

    try:
        for n in names:
            setattr(torch.Tensor, n, fail)
        yield
    finally:
        for n, f in saved.items():
            setattr(torch.Tensor, n, f)


def test_one_host_sync_per_step(monkeypatch):
    calls = []
    real = nanhooks._to_host
    monkeypatch.setattr(nanhooks, "_to_host", lambda vals: calls.append(len(vals)) or real(vals))
    model, x = make_model(), torch.randn(4, 8)
    with nanhunt(model, log=False) as hunt:
        for _ in range(3):
            with forbid_host_sync():
                train_step(model, x)
            hunt.step()
    assert len(calls) == 3 and all(n > 0 for n in calls)


def test_raise_on_nonfinite_and_backward_culprit():
    class SqrtThenLinear(nn.Module):  # functional sqrt in the parent's own forward: finite forward, inf grad
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(8, 8)
            self.b = nn.Linear(8, 2)

        def forward(self, x):
            h = self.a(x)
            return self.b(torch.sqrt(h - h.detach()))  # sqrt at exactly 0: infinite slope

    model, x = SqrtThenLinear(), torch.randn(4, 8)
    with pytest.raises(NonFiniteError) as err:
        with nanhunt(model, raise_on_nonfinite=True, log=False) as hunt:
            train_step(model, x)
            hunt.step()
    event = err.value.event
    assert event["forward"] is None
    bwd = event["backward"]
    assert bwd["module"] == "" and bwd["grad_of"] == "forward code" and bwd["grad_input_from"] == "a"
    assert "backward" in str(err.value) and no_hooks_left(model)


def test_every_n_steps_skips_the_unchecked_ones():
    model, x = make_model(), torch.randn(4, 8)
    with nanhunt(model, every=2, log=False) as hunt:
        for step in range(4):
            model[2].poison = step == 1  # step 1 is not checked
            train_step(model, x)
            hunt.step()
    assert hunt.events == [] and hunt.steps == 4


def test_without_step_calls_reports_at_next_forward_and_at_exit(caplog):
    model, x = make_model(), torch.randn(4, 8)
    with caplog.at_level(logging.WARNING, logger="troubleshooter.nanhunt"):
        with nanhunt(model) as hunt:
            train_step(model, x)
            model[2].poison = True
            train_step(model, x)  # its report comes at the next forward (auto-step) ...
            model[2].poison = False
            train_step(model, x)
            assert [e["step"] for e in hunt.events] == [1]
            model[2].poison = True
            train_step(model, x)  # ... or when the block ends
    assert [e["step"] for e in hunt.events] == [1, 3]
    assert sum("module '2' (PoisonAt" in r.getMessage() for r in caplog.records) == 2


def test_reused_module_inplace_and_dict_outputs():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)
            self.act = nn.ReLU(inplace=True)
            self.log = Log()

        def forward(self, x):
            h = self.act(self.lin(x))
            h = self.lin(h) - 50.0  # second call of the same module
            return self.log(h)["out"]

    class Log(nn.Module):
        def forward(self, x):
            return {"out": torch.log(x), "aux": x}

    model = Net()
    with nanhunt(model, log=False) as hunt:
        train_step(model, torch.randn(4, 8))
        event = hunt.step()
    fwd = event["forward"]
    # the second call of 'lin' is finite; the log creates the NaN from finite (negative) inputs
    assert fwd["module"] == "log" and fwd["created"] and fwd["output_max_abs"][0] == "nan"


def test_gradscaler_skip_is_not_a_bug_unless_it_persists():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    with torch.no_grad():
        model[2].weight.mul_(1e4)  # scaled fp16 gradients overflow every step
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
    x = torch.randn(4, 8)
    with pytest.raises(NonFiniteError) as err:
        with nanhunt(model, scaler=scaler, raise_on_nonfinite=True, patience=2, log=False) as hunt:
            for _ in range(5):
                opt.zero_grad()
                with torch.autocast("cpu", dtype=torch.float16):
                    loss = model(x).float().square().mean()
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                hunt.step()
    assert hunt.skipped_steps == 2 and hunt.events[0]["skipped"] and hunt.events[0]["autocast"] == "float16"
    assert err.value.event["persistent"] and err.value.event["consecutive"] == 3


def test_hooks_do_not_change_results_and_bad_arguments_are_refused():
    model, x = make_model(), torch.randn(4, 8)
    train_step(model, x)
    plain = [p.grad.clone() for p in model.parameters()]
    with nanhunt(model, log=False) as hunt:
        train_step(model, x)
        hunt.step()
    assert all(torch.equal(a, p.grad) for a, p in zip(plain, model.parameters()))
    assert troubleshooter.nanhunt is nanhunt
    with pytest.raises(TypeError):
        nanhunt(object())
    with pytest.raises(ValueError):
        nanhunt(model, every=0)


class SqrtAtZero(nn.Module):
    """Finite forward (sqrt of exactly 0), infinite slope: a backward-only inf."""

    def forward(self, x):
        return torch.sqrt(x - x.detach())


def test_backward_blame_passes_through_activations_to_the_module_that_made_it():
    for act in (nn.GELU(), nn.ReLU(), nn.Tanh()):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 8), act, SqrtAtZero(), nn.Linear(8, 2))
        with nanhunt(model, log=False) as hunt:
            train_step(model, torch.randn(4, 8))
            event = hunt.step()
        assert event["forward"] is None, act
        assert event["backward"]["module"] == "2" and event["backward"]["class"] == "SqrtAtZero", act


def test_ignored_modules_are_not_hooked():
    class MaskMaker(nn.Module):  # returns -inf on purpose, like an additive attention mask
        def forward(self, x):
            return torch.full_like(x, float("-inf")).triu(1)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.mask = MaskMaker()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            return torch.softmax(self.lin(x) + self.mask(x), dim=-1)

    model, x = Net(), torch.randn(8, 8)
    with nanhunt(model, log=False) as hunt:
        model(x).sum().backward()
        assert hunt.step()["forward"]["module"] == "mask"
    with nanhunt(model, ignore=["mask*"], log=False) as hunt:
        model(x).sum().backward()
        assert hunt.step() is None


def test_odd_tensors_do_not_break_training():
    class Odd(nn.Module):  # float8, complex, sparse, integer and empty tensors in and out
        def forward(self, x):
            f8 = x.to(torch.float8_e4m3fn)
            return x * 2, f8, torch.complex(x, x), x.to_sparse(), x.long(), x[:0]

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.odd = Odd()
            self.lin = nn.Linear(8, 2)

        def forward(self, x):
            y, f8, c, sp, i, e = self.odd(x)
            return self.lin(y + f8.float() + c.real)

    model = Net()
    with nanhunt(model, log=False) as hunt:
        model(torch.randn(4, 8)).sum().backward()
        assert hunt.step() is None
        model.odd.forward = lambda x: (x * float("nan"),) + Odd.forward(model.odd, x)[1:]
        model(torch.randn(4, 8)).sum().backward()
        assert hunt.step()["forward"]["module"] == "odd"


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_an_infinite_weight_gradient_from_finite_values_is_found_with_its_sign(sign):
    """An overflow in the weight-gradient GEMM alone (finite input, output and output gradient)
    is named at that parameter, +inf or -inf as it is (issue 11.7: -inf is not printed as inf)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    with torch.no_grad():
        model[1].weight.fill_(1e-3)
    x = torch.full((8, 4), 3e38)  # finite; Linear(0)'s output ~1e38 * small weights stays finite
    hooks = nanhooks.HookSet(model).attach()
    try:
        model[0].weight.data.fill_(1e-39 / 4)
        (model(x).sum() * sign * 1e3).backward()
        rep = hooks.collect()
    finally:
        hooks.detach()
    assert rep.forward is None
    b = rep.backward
    assert b["grad_of"] == "parameter" and b["parameter"] in ("0.weight", "1.weight")
    assert b["value"] == ("inf" if sign > 0 else "-inf")


def test_every_method_registered_as_a_hook_is_a_named_entry_point():
    """Who times the hooks (the trace's stated own cost, bench/nan_inhook.py) wraps the methods in
    HOOK_ENTRY_POINTS; one registered but not listed would run untimed (`_out_grad` was)."""
    import inspect
    import re

    from troubleshooter.engine import nanhooks

    registered = {name for line in inspect.getsource(nanhooks).splitlines() if "hook" in line  # register_*hook(...)
                  for name in re.findall(r"partial\(self\.(_\w+)", line)}
    assert registered and registered <= set(nanhooks.HOOK_ENTRY_POINTS), registered - set(nanhooks.HOOK_ENTRY_POINTS)
