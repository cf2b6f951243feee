"""Every rule fires exactly where its bad fixture says (`# expect: AMPnnn`) and not on its good fixture."""
import re
from pathlib import Path

import pytest

from troubleshooter.lint import all_rules, explain_rule, get_rule, lint_text

FIXTURES = Path(__file__).parent / "fixtures" / "lint"
RULE_IDS = [r.id for r in all_rules()]
_EXPECT = re.compile(r"#\s*expect:\s*([A-Z0-9, ]+)")


def expected(text: str) -> set[tuple[int, str]]:
    out = set()
    for i, line in enumerate(text.splitlines(), 1):
        m = _EXPECT.search(line)
        if m:
            out |= {(i, r.strip()) for r in m.group(1).split(",") if r.strip()}
    return out


def findings_of(path: Path, rule_id: str, wanted: set[str]):
    report = lint_text(path.read_text(), str(path))
    assert not report.errors, report.errors
    return {(f.location.line, f.rule) for f in report.findings
            if f.severity.value != "info" or f.rule in wanted | {rule_id}}


def fixtures_for(rule_id: str, kind: str) -> list[Path]:
    return sorted(FIXTURES.glob(f"{kind}_{rule_id}*.py"))


@pytest.mark.parametrize("rule_id", RULE_IDS)
def test_bad_fixture_flags_expected_lines(rule_id):
    paths = fixtures_for(rule_id, "bad")
    assert paths, f"no bad_{rule_id}*.py fixture"
    for path in paths:
        want = expected(path.read_text())
        assert any(r == rule_id for _, r in want), f"{path.name} expects no {rule_id}"
        got = findings_of(path, rule_id, {r for _, r in want})
        assert got == want, f"{path.name}: missing {sorted(want - got)}, unexpected {sorted(got - want)}"


@pytest.mark.parametrize("rule_id", RULE_IDS)
def test_good_fixture_is_clean(rule_id):
    paths = fixtures_for(rule_id, "good")
    assert paths, f"no good_{rule_id}*.py fixture"
    for path in paths:
        got = findings_of(path, rule_id, set())
        assert got == set(), f"{path.name}: unexpected {sorted(got)}"


def test_catalogue_is_complete_and_documented():
    assert RULE_IDS == [f"AMP{n}" for n in [*range(101, 128), *range(130, 146), *range(150, 155)]]
    assert len(set(RULE_IDS)) == len(RULE_IDS)
    names = [r.name for r in all_rules()]
    assert len(set(names)) == len(names)
    for r in all_rules():
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)+", r.name), r.name
        assert r.severity in {"error", "warning", "info"}
        for attr in ("summary", "why", "example_bad", "example_good", "fix"):
            assert len(getattr(r, attr).strip()) > 10, (r.id, attr)
        text = explain_rule(r.id)
        assert r.id in text and "Why it matters" in text and r.example_good.strip() in text
        assert get_rule(r.id.lower()) is r


def test_severities_match_the_issue_table():
    errors = {"AMP101", "AMP103", "AMP109", "AMP111", "AMP112", "AMP113", "AMP115", "AMP116", "AMP125", "AMP152", "AMP153",
              "AMP130", "AMP131", "AMP132", "AMP136", "AMP137", "AMP141", "AMP143", "AMP144",
              "AMP127"}
    infos = {"AMP119", "AMP120", "AMP121", "AMP122", "AMP123"}
    for r in all_rules():
        want = "error" if r.id in errors else "info" if r.id in infos else "warning"
        assert r.severity == want, r.id


def test_examples_in_docs_behave():
    """The catalogue's own bad example is flagged by its rule (where it stands alone as a snippet)."""
    standalone = {"AMP101", "AMP104", "AMP106", "AMP112", "AMP113", "AMP114", "AMP116", "AMP118", "AMP121", "AMP125",
                  "AMP127"}
    for r in all_rules():
        if r.id in standalone:
            rules = {f.rule for f in lint_text("import torch\n" + r.example_bad).findings}
            assert r.id in rules, r.id


def test_user_docs_cover_every_rule():
    docs = (Path(__file__).parents[1] / "docs" / "lint.md").read_text()
    for r in all_rules():
        assert f"### {r.id} {r.name}" in docs, r.id


def _rules_at(src: str) -> set[tuple[str, int]]:
    return {(f.rule, f.location.line) for f in lint_text(src, "t.py").findings}


def test_scheduler_inside_if_scaler_is_still_per_iteration():
    """`if scaler:` only asks whether the fp16 path is on; it cannot tell a skipped step (whisper-finetune)."""
    src = ("import torch\n\ndef train_step(model, x, optimizer, lr_scheduler, use_amp):\n"
           "    scaler = torch.amp.GradScaler('cuda') if use_amp else None\n"
           "    with torch.autocast('cuda', enabled=use_amp):\n        loss = model(x).mean()\n"
           "    if scaler:\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n"
           "        lr_scheduler.step()\n        scaler.update()\n")
    assert ("AMP107", 10) in _rules_at(src)
    guarded = src.replace("        lr_scheduler.step()\n", "        if scaler.get_scale() >= 1.0:\n            lr_scheduler.step()\n")
    assert not any(r == "AMP107" for r, _ in _rules_at(guarded))


def test_accumulation_counted_in_samples_is_not_an_unnormalised_loss():
    """accumulate = nbs / batch_size (YOLO family, loss summed over samples in another file): no AMP108."""
    loop = ("import torch\nscaler = torch.amp.GradScaler('cuda')\n{count}\n"
            "for i, (x, y) in enumerate(loader):\n    with torch.autocast('cuda'):\n        loss = compute_loss(model(x), y)\n"
            "    scaler.scale(loss).backward()\n    if i % accumulate == 0:\n        scaler.step(optimizer)\n"
            "        scaler.update()\n        optimizer.zero_grad()\n")
    assert not any(r == "AMP108" for r, _ in _rules_at(loop.format(count="accumulate = max(round(64 / batch_size), 1)")))
    assert any(r == "AMP108" for r, _ in _rules_at(loop.format(count="accumulate = 4")))


def test_half_checkpoint_reads_the_dict_written_above_the_save():
    """DALLE-pytorch: a first save of a dict without weights, the weights added further down for a second save."""
    src = ("import torch\nmodel = Net().cuda().half()\nopt = torch.optim.Adam(model.parameters())\n"
           "def save(path, ds):\n    obj = {'epoch': 1}\n    if ds:\n        obj = {**obj, 'weights': 'see deepspeed'}\n"
           "        torch.save(obj, path)\n        return\n"
           "    obj = {**obj, 'weights': model.state_dict(), 'opt': opt.state_dict()}\n    torch.save(obj, path)\n"
           "for x in data:\n    loss = model(x).float().mean()\n    loss.backward()\n    opt.step()\n    opt.zero_grad()\n")
    got = {line for r, line in _rules_at(src) if r == "AMP124"}
    assert got == {11}


def test_checkpoint_helper_given_the_scaler_on_the_amp_path_only():
    """SlowFast: `cu.save_checkpoint(dir, model, optimizer, epoch, cfg, scaler if mixed else None)` saves it."""
    src = ("import torch\nimport utils.checkpoint as cu\nscaler = torch.amp.GradScaler('cuda', enabled=mixed)\n"
           "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
           "cu.save_checkpoint(out, model, opt, epoch, cfg, {arg})\n")
    assert not any(r == "AMP110" for r, _ in _rules_at(src.format(arg="scaler if mixed else None")))
    assert ("AMP110", 5) in _rules_at(src.format(arg="None"))


def test_matrix_vector_linear_is_not_padded():
    """modded-nanogpt `nn.Linear(12, 1)` gate: padding 12 to 16 buys nothing for one output."""
    src = "import torch.nn as nn\ngate = nn.Linear(12, 1)\nproj = nn.Linear(12, 64)\n"
    assert {(r, line) for r, line in _rules_at(src) if r == "AMP121"} == {("AMP121", 3)}


def test_delayed_actor_update_is_not_accumulation():
    """cleanrl TD3/DDPG: the critic steps every iteration, the actor every `policy_frequency` steps."""
    src = ("import torch\nfor global_step in range(1000):\n    qf_loss = critic_loss()\n    q_optimizer.zero_grad()\n"
           "    qf_loss.backward()\n{critic_step}"
           "    if global_step % policy_frequency == 0:\n        actor_loss = -q(obs).mean()\n"
           "        actor_optimizer.zero_grad()\n        actor_loss.backward()\n        actor_optimizer.step()\n")
    assert not any(r == "AMP108" for r, _ in _rules_at(src.format(critic_step="    q_optimizer.step()\n")))
    accumulating = ("import torch\nfor i, b in enumerate(loader):\n    loss = model(b)\n    loss.backward()\n"
                    "    if (i + 1) % accum == 0:\n        optimizer.step()\n        optimizer.zero_grad()\n")
    assert any(r == "AMP108" for r, _ in _rules_at(accumulating))


def test_framework_loss_scaler_is_not_a_gradscaler():
    """Vendored mmcv (LAVIS): its own LossScaler class and its dynamic `loss_scale` property."""
    src = ("import torch\n\nclass LossScaler:\n    @staticmethod\n    def _has_inf_or_nan(x):\n        return False\n\n"
           "    def has_overflow(self, params):\n        return any(LossScaler._has_inf_or_nan(p.grad) for p in params)\n\n\n"
           "class Fp16OptimizerHook:\n    def after_train_iter(self, runner):\n"
           "        scaled_loss = runner.outputs['loss'] * self.loss_scaler.loss_scale\n        scaled_loss.backward()\n")
    found = {r for r, _ in _rules_at(src)}
    assert "AMP118" not in found and "AMP114" not in found


def test_scaler_never_scales_message_is_what_torch_raises():
    """AMP127 quotes torch's own error: an enabled GradScaler (the CPU one runs here) that never scaled
    raises exactly that on its first update() / unscale_(); a disabled one does nothing."""
    torch = pytest.importorskip("torch")
    src = ("import torch\nscaler = torch.amp.GradScaler('cpu')\nloss.backward()\noptimizer.step()\n"
           "scaler.{call}\n")
    for call, method in (("update()", "update"), ("unscale_(optimizer)", "unscale_")):
        (finding,) = lint_text(src.format(call=call)).findings
        quoted = re.search(r"AssertionError: (.*?)`", finding.message).group(1)
        model = torch.nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.ones(1, 2)).sum().backward()
        optimizer.step()
        with pytest.raises(AssertionError, match=re.escape(quoted)):
            getattr(torch.amp.GradScaler("cpu"), method)(*([optimizer] if method == "unscale_" else []))
        torch.amp.GradScaler("cpu", enabled=False).update()
    assert lint_text(src.format(call="update()").replace("'cpu'", "'cpu', enabled=False")).findings == []
    flagged = lint_text(src.format(call="update()").replace("'cpu'", "'cpu', enabled=use_amp")).findings
    assert [(f.rule, f.severity.value) for f in flagged] == [("AMP127", "warning")]
