"""One seeded build copied for every precision (the speedup check's models)."""
import torch
from torch import nn

from troubleshooter.engine.training_step import SeededStart, build
from troubleshooter.workload import Workload


def _workload(model_cls=None, builds=None):
    def build_model():
        if builds is not None:
            builds.append(1)
        return (model_cls or (lambda: nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.5), nn.Linear(16, 4))))()

    return Workload(name="w", build_model=build_model,
                    make_batch=lambda bs, device, gen: ((torch.randn(bs, 8, generator=gen),), None),
                    loss_fn=lambda out, target: out.float().pow(2).mean(),
                    make_optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1), batch_size=4)


def _weights(model):
    return [p.detach().clone() for p in model.state_dict().values()]


def test_every_copy_starts_from_the_seeded_build_and_the_model_is_built_once():
    builds = []
    w = _workload(builds=builds)
    start = SeededStart(w, seed=3)
    models = [start.build(torch.device("cpu"), last=i == 2) for i in range(3)]
    reference, _ = build(w, torch.device("cpu"), seed=3)
    assert len(builds) == 2  # one for the three copies, one for the reference
    for model, opt in models:
        assert model.training and isinstance(opt, torch.optim.SGD)
        assert all(torch.equal(a, b) for a, b in zip(_weights(model), _weights(reference)))
    # distinct modules: training one leaves the others' start untouched
    assert len({id(m) for m, _ in models}) == 3
    with torch.no_grad():
        next(models[0][0].parameters()).add_(1.0)
    assert torch.equal(_weights(models[1][0])[0], _weights(reference)[0])


def test_each_copy_sees_the_same_random_stream():
    """Reseeded after each copy, so dropout masks match across precisions."""
    start = SeededStart(_workload(), seed=0)
    outs = []
    for _ in range(2):
        model, _ = start.build(torch.device("cpu"))
        outs.append(model(torch.ones(2, 8)))
    assert torch.equal(outs[0], outs[1])


class _NoCopy(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def __deepcopy__(self, memo):
        raise TypeError("this module cannot be deep-copied")


def test_a_module_that_refuses_deepcopy_is_rebuilt_from_the_seed():
    builds = []
    start = SeededStart(_workload(_NoCopy, builds), seed=1)
    a, _ = start.build(torch.device("cpu"))
    b, _ = start.build(torch.device("cpu"))
    assert torch.equal(a.lin.weight, b.lin.weight) and a is not b
    assert len(builds) == 3  # the kept build, then a seeded rebuild per copy that could not be made


def test_inside_shared_start_build_copies_one_build_and_leaves_the_rng_as_a_fresh_build_would():
    from troubleshooter.engine.training_step import shared_start

    builds = []
    w = _workload(builds=builds)
    fresh, _ = build(w, torch.device("cpu"), seed=5)
    after_fresh = torch.rand(3)
    with shared_start(w, seed=5):
        copies = [build(w, torch.device("cpu"), seed=5) for _ in range(3)]
        after_copy = torch.rand(3)
        other_seed, _ = build(w, torch.device("cpu"), seed=6)  # another seed: a fresh build
    assert len(builds) == 1 + 1 + 1
    assert torch.equal(after_copy, after_fresh)  # batches and dropout masks as before
    for model, _ in copies:
        assert all(torch.equal(a, b) for a, b in zip(_weights(model), _weights(fresh)))
    assert not torch.equal(_weights(other_seed)[0], _weights(fresh)[0])
    build(w, torch.device("cpu"), seed=5)  # outside: fresh again
    assert len(builds) == 4


def test_a_build_that_lands_off_the_cpu_is_not_kept(monkeypatch):
    """A user's build_model() that returns a GPU model: keeping it would hold GPU memory."""
    from troubleshooter.engine import training_step

    monkeypatch.setattr(training_step, "_on_cpu", lambda model: False)
    builds = []
    start = SeededStart(_workload(builds=builds), seed=0)
    a, _ = start.build(torch.device("cpu"))
    b, _ = start.build(torch.device("cpu"))
    assert len(builds) == 2 and a is not b
    assert torch.equal(_weights(a)[0], _weights(b)[0])
