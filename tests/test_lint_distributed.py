"""Where the distributed lint rules (AMP150-AMP154) stop: the cases other rules own, and the
shapes of code each must leave alone (beyond the bad/good fixtures of tests/test_lint_rules.py)."""
from troubleshooter.lint import lint_text

HEAD = ("import contextlib\nimport torch\nimport torch.distributed as dist\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, MixedPrecision\n")


def rules(src: str, prefix: str = "AMP15") -> list[tuple[str, int, str]]:
    return [(f.rule, f.location.line, f.severity.value) for f in lint_text(HEAD + src, "t.py").findings
            if f.rule.startswith(prefix)]


def test_float16_compute_without_a_scaler_is_left_to_amp135():
    src = ("model = FSDP(model, mixed_precision=MixedPrecision(param_dtype=torch.float16, reduce_dtype=torch.float16))\n"
           "model(x).mean().backward()\noptimizer.step()\n")
    assert rules(src) == []
    assert rules(src.replace("param_dtype=torch.float16", "param_dtype=torch.bfloat16")) == [("AMP150", 6, "warning")]


def test_a_policy_in_a_file_that_does_not_train_is_info():
    assert rules("mp = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float16)\n") == \
        [("AMP150", 6, "info")]


def test_no_sync_chosen_per_micro_step_is_not_never_synchronised():
    src = ("model = DDP(model)\nfor i, x in enumerate(loader):\n"
           "    with model.no_sync() if (i + 1) % 4 else contextlib.nullcontext():\n"
           "        (model(x).mean() / 4).backward()\n    if (i + 1) % 4 == 0:\n        optimizer.step()\n")
    assert rules(src) == []
    assert rules(src.replace("model.no_sync() if (i + 1) % 4 else contextlib.nullcontext()", "model.no_sync()")) == \
        [("AMP152", 8, "error")]


def test_a_rank_test_through_a_helper_is_a_warning_and_a_plain_one_an_error():
    load = "    scaler.load_state_dict(torch.load('ckpt.pt')['scaler'])\n"
    scaler = "scaler = torch.amp.GradScaler('cuda')\n"
    assert rules(scaler + "if dist.get_rank() == 0:\n" + load) == [("AMP153", 8, "error")]
    assert rules(scaler + "if local_rank in (-1, 0):\n" + load) == [("AMP153", 8, "error")]
    assert rules(scaler + "if is_main_process():\n" + load) == [("AMP153", 8, "warning")]
    assert rules(scaler + "if args.resume:\n" + load) == []
