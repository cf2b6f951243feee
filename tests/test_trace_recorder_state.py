"""The Recorder's per-step protocol state where its usual case is answered without a Python
call (a cheaper path must keep the general one's result)."""
import gc

import torch

from troubleshooter.trace.recorder import Recorder


def test_a_scaled_output_is_forgotten_once_it_is_freed():
    rec = Recorder(10)
    scaler = torch.amp.GradScaler("cpu", enabled=True)
    loss = torch.tensor(1.5, requires_grad=True) * 2
    out = scaler.scale(loss)
    rec.on_scale(scaler, loss, out)
    assert rec.scaled_outputs[id(out)][0]() is out
    del out
    gc.collect()
    assert rec.scaled_outputs == {}


def test_update_clears_the_stages_of_its_own_scaler_only():
    rec = Recorder(10)
    mine, other = object(), object()
    for stages, left in (({(id(mine), 1): "stepped"}, {}),
                         ({(id(other), 1): "stepped"}, {(id(other), 1): "stepped"}),
                         ({(id(mine), 1): "unscaled", (id(mine), 2): "stepped", (id(other), 1): "stepped"},
                          {(id(other), 1): "stepped"})):
        rec.scaler_stage = dict(stages)
        rec._updated(id(mine), 4.0, 4.0, False)
        assert rec.scaler_stage == left
