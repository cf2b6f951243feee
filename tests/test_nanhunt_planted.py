"""A fault planted at every module of a small CNN, MLP and transformer is named as it always was
(issue 28: the hooks are tuned for speed again and again; which module is "first" must not move).

Each case plants one non-finite value with a user's hook set before the hunt's (a module's
forward output, the gradient of its output, or the first gradient its autograd node hands to one
of its parameters), runs one training step with `HookSet`, and compares the step's forward and
backward reports with the record in tests/fixtures/nanhunt/planted_faults.json, made with the
hooks of main at 26cfa6b. Finite magnitudes are compared as "finite" only (their last digits
depend on the CPU's kernels); everything else - module, class, parameter, phase, kind, value,
call index, blame - must match exactly.

Regenerate the record only for a deliberate change of the reports:
    python tests/test_nanhunt_planted.py            # writes the fixture from this tree's hooks
"""
from __future__ import annotations

import functools
import json
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from troubleshooter.engine.nanhooks import HookSet
from troubleshooter.spec import SpecSource, load_workload

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "nanhunt" / "planted_faults.json"
PRESETS = ("cnn:width=4,image_size=8,batch_size=2",
           "mlp:in_features=8,hidden=8,depth=3,num_classes=3,batch_size=2",
           "gpt:vocab_size=32,d_model=16,n_layer=1,n_head=2,seq_len=4,batch_size=2")
WHERE = ("forward", "grad_output", "grad_param")


@functools.cache
def _workload(preset: str):
    return load_workload(SpecSource.preset(preset))  # ~35 ms: once per preset


def _build(preset: str):
    workload = _workload(preset)
    torch.manual_seed(0)
    model = workload.build_model()
    model.train()
    return workload, model, workload.batch(torch.device("cpu"), seed=0)


def _plant(module: torch.nn.Module, where: str):
    """A user's forward hook, registered before the hunt's, that makes one value non-finite."""
    def forward_hook(mod, args, output):
        if not isinstance(output, torch.Tensor):
            return None
        if where == "forward":
            return output * float("nan")
        node = output.grad_fn
        if where == "grad_output" and output.requires_grad:
            output.register_hook(lambda g: g * float("inf"))
        elif where == "grad_param" and node is not None:
            def post(grad_inputs, grad_outputs):  # the first parameter gradient the node hands on
                out = list(grad_inputs)
                for i, (fn, _) in enumerate(node.next_functions):
                    if fn is not None and type(fn).__name__ == "AccumulateGrad" and out[i] is not None:
                        out[i] = out[i] * -float("inf")
                        break
                return tuple(out)
            node.register_hook(post)
        return None
    return module.register_forward_hook(forward_hook)


def _shape(x):
    """The report with finite numbers replaced by "finite" (their digits are the CPU's)."""
    if isinstance(x, dict):
        return {k: _shape(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_shape(v) for v in x]
    if isinstance(x, float):
        return "finite" if math.isfinite(x) else str(x)
    return x


def _cases(preset: str):
    """(case name, module, where) for every leaf module and every kind of fault it can take."""
    _, model, _ = _build(preset)
    for name, module in model.named_modules():
        if not name or module._modules:
            continue
        for where in WHERE:
            if where == "grad_param" and not any(p.requires_grad for p in module.parameters(recurse=False)):
                continue
            yield f"{name}:{where}", name, where


def run_case(preset: str, name: str, where: str, hookset: type = HookSet) -> dict:
    """One planted step: the report as the fixture holds it."""
    workload, model, batch = _build(preset)
    handle = _plant(model.get_submodule(name), where)
    hooks = hookset(model).attach()
    try:
        loss = workload.loss(model, batch)
        loss.backward()
        rep = hooks.collect()
    finally:
        hooks.detach()
        handle.remove()
    return _shape({"forward": rep.forward, "backward": rep.backward, "loss_grad_nonfinite": rep.loss_grad_nonfinite})


def _record() -> dict:
    return json.loads(FIXTURE.read_text())


@pytest.mark.parametrize("preset", PRESETS)
def test_a_fault_planted_at_any_module_is_named_as_before(preset):
    expected = _record()[preset]
    cases = list(_cases(preset))
    assert sorted(expected) == sorted(case for case, _, _ in cases)  # the same modules, the same faults
    for case, name, where in cases:
        assert run_case(preset, name, where) == expected[case], case


def test_the_record_holds_real_faults():
    """Most plants are found (a gradient planted where nothing reads it, or under a ReLU's mask, may not be)."""
    record = _record()
    for preset in PRESETS:
        found = [case for case, rep in record[preset].items() if rep["forward"] or rep["backward"]]
        assert len(found) >= 0.8 * len(record[preset]), preset
        assert any(rep["backward"] and rep["backward"].get("grad_of") == "parameter"
                   for rep in record[preset].values())


def main(hookset: type = HookSet) -> None:
    record = {preset: {case: run_case(preset, name, where, hookset) for case, name, where in _cases(preset)}
              for preset in PRESETS}
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    FIXTURE.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"wrote {FIXTURE}: {sum(len(v) for v in record.values())} cases")


if __name__ == "__main__":
    main()
