import pytest

from troubleshooter import hardware


@pytest.mark.parametrize("device_name, model, arch", [
    ("NVIDIA H100 80GB HBM3", "H100", "Hopper"),
    ("NVIDIA H100 PCIe", "H100 PCIe", "Hopper"),
    ("Tesla V100-SXM2-16GB", "V100", "Volta"),
    ("Tesla T4", "T4", "Turing"),
    ("NVIDIA A100-SXM4-80GB", "A100", "Ampere"),
    ("NVIDIA A10G", "A10G", "Ampere"),
    ("NVIDIA GeForce RTX 4090", "RTX 4090", "Ada"),
    ("NVIDIA L40S", "L40S", "Ada"),
    ("NVIDIA L4", "L4", "Ada"),
    ("rtx 4090", "RTX 4090", "Ada"),
])
def test_find_gpu(device_name, model, arch):
    gpu = hardware.find_gpu(device_name)
    assert gpu is not None and gpu.name == model and gpu.architecture.name == arch


def test_unknown_gpu_and_peak():
    assert hardware.find_gpu("Some Future Accelerator") is None
    assert hardware.peak_tflops("Tesla V100", "bf16") is None  # no bf16 tensor cores on Volta
    assert hardware.peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == pytest.approx(989.4)


def test_architecture_by_compute_capability():
    assert hardware.architecture_for("7.0").bf16 is False
    assert hardware.architecture_for((8, 6)).bf16 is True
    assert hardware.architecture_for("8.9").fp8 is True
    assert hardware.architecture_for("8.0").fp8 is False
    assert hardware.architecture_for("12.0").name == "Blackwell"


def test_padded_size_is_shared_by_lint_and_engine():
    from troubleshooter.engine import alignment

    assert hardware.padded_size(127, 8) == 128 and hardware.padded_size(128, 8) == 128
    assert hardware.padded_size(50257, hardware.VOCAB_MULTIPLE) == 50304
    assert alignment.padded_size is hardware.padded_size


def test_names_match_whole_words_and_memory_in_the_name_wins():
    assert hardware.find_gpu("NVIDIA L40").name == "L40"  # not the L4
    assert hardware.find_gpu("NVIDIA L40S").name == "L40S"
    assert hardware.resolve_gpu("RTX 2080").name == "RTX 2080"  # not the 2080 Ti
    assert hardware.resolve_gpu("A100 40GB").memory_gb == 40 and hardware.resolve_gpu("A100").memory_gb == 80
    assert hardware.resolve_gpu("V100 16GB").memory_gb == 16
    assert hardware.cc_from_text("NVIDIA GeForce RTX 3080 (sm_86, 10 GB)") == (8, 6)
    assert hardware.memory_from_text("NVIDIA GeForce RTX 3080 (sm_86, 10 GB)") == 10


def test_resolve_gpu_never_refuses():
    gpu = hardware.resolve_gpu("Mystery Card")
    assert not gpu.known and gpu.warnings and gpu.fp16_fast and not gpu.bf16
    assert hardware.resolve_gpu("NVIDIA RTX 5060").arch == "Blackwell"  # a family, not a listed product


def test_a_bare_name_sold_in_two_sizes_records_them_and_a_size_in_the_name_does_not():
    bare = hardware.resolve_gpu("A100")
    assert bare.memory_gb == 80 and bare.memory_sizes_gb == (40, 80)
    assert bare.to_dict()["memory_sizes_gb"] == [40, 80]
    sized = hardware.resolve_gpu("NVIDIA A100-SXM4-40GB")
    assert sized.memory_gb == 40 and sized.memory_sizes_gb == ()
    assert hardware.resolve_gpu("H100").memory_sizes_gb == ()  # one size when the name says H100


def test_memory_advice_says_which_size_it_assumed_only_when_the_size_decides():
    from troubleshooter import questionnaire as q

    def warnings(gpu, params):
        return q.decide(q.validate_answers({"gpu": gpu, "model_family": "transformer",
                                            "params_millions": params})).warnings

    assumed = [w for w in warnings("V100", 1500) if "assumed the 32 GB V100" in w]
    assert assumed and "'V100 16GB'" in assumed[0]  # 24 GB of fp32 weights/grads/AdamW: fits 32, not 16
    assert not any("assumed" in w for w in warnings("V100", 300))  # fits either size
    assert not any("assumed" in w for w in warnings("V100 16GB", 1500))  # the size was given
