"""The nan check on YAML specs that once gave wrong or vague answers."""
import torch
from torch import nn

from troubleshooter.engine.nanhunt import hunt_nonfinite
from troubleshooter.workload import Workload


def _mse_workload(blow_up):
    def build():
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        with torch.no_grad():
            m[2].weight.mul_(blow_up)
        return m

    def make_batch(bs, device, gen):
        return (torch.randn(bs, 8, generator=gen).to(device),), torch.randn(bs, 4, generator=gen).to(device)

    return Workload("mse", build, make_batch, nn.functional.mse_loss,
                    lambda p: torch.optim.SGD(p, lr=0.1), 8)


def test_loss_overflow_message_names_the_kind_of_value_not_none():
    # outputs ~1e21 are finite in fp32, their square is not: the loss is inf, every output finite
    r = hunt_nonfinite(_mse_workload(1e22), "cpu", precisions=("fp32",))
    (f,) = r["findings"]
    assert (f.rule, f.precision) == ("AMP205", "fp32")
    assert f.location.module is None and f.data["output_module"] == "2"
    assert "the loss is inf in fp32" in f.message and "None" not in f.message
    assert r["precisions"]["fp32"]["loss_kind"] == "inf"
