"""A parameter's gradient hook takes a short path for the usual CPU gradient (its parameter's
dtype, dense, no gradient of its own) and the full checks otherwise (issue 28): both paths
report the same."""
import torch
from torch import nn

from troubleshooter.engine.nanhooks import HookSet


def _first_backward(model, x, **backward):
    hooks = HookSet(model).attach()
    try:
        loss = model(x).sum()
        loss.backward(**backward)
        return hooks.collect().backward
    finally:
        hooks.detach()


def _bad_weight_grad(module):
    """A user's hook that makes the weight's gradient +inf, as an overflow in its backward would."""
    return module.weight.register_hook(lambda g: torch.full_like(g, float("inf")))


def test_a_dtype_changed_after_attach_and_a_double_gradient_are_reported_alike():
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
    handle = _bad_weight_grad(model[1])
    hooks = HookSet(model).attach()
    try:
        model(x).sum().backward()
        as_float = hooks.collect().backward
        model.double()  # after attach: the gradients no longer have the dtype read at attach
        model(x.double()).sum().backward()
        as_double = hooks.collect().backward
    finally:
        hooks.detach()
        handle.remove()
    assert as_float["parameter"] == as_double["parameter"] == "1.weight"
    assert as_float["value"] == as_double["value"] == "inf"


def test_a_gradient_that_needs_a_gradient_and_a_sparse_one_are_handled():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
    handle = _bad_weight_grad(model[0])
    try:
        event = _first_backward(model, torch.randn(4, 8), create_graph=True)  # gradients require grad
    finally:
        handle.remove()
    assert event["parameter"] == "0.weight" and event["value"] == "inf"
    emb = nn.Embedding(10, 4, sparse=True)  # a sparse gradient cannot hold a min/max: not measured
    assert _first_backward(emb, torch.tensor([1, 2, 3])) is None
