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


# --- what people type, one family at a time (issue 26) ----------------------------------------------

@pytest.mark.parametrize("typed, name, cc, memory", [
    ("Tesla V100S-PCIE-32GB", "V100S", (7, 0), 32), ("V100S", "V100S", (7, 0), 32),
    ("NVIDIA H100 80GB HBM3", "H100", (9, 0), 80), ("NVIDIA H200", "H200", (9, 0), 141),
    ("NVIDIA H100 NVL", "H100 NVL", (9, 0), 94), ("Tesla T4G", "T4G", (7, 5), 16), ("NVIDIA L40S", "L40S", (8, 9), 48),
])
def test_nvidia_datacenter_names(typed, name, cc, memory):
    gpu = hardware.resolve_gpu(typed)
    assert (gpu.name, gpu.cc, gpu.memory_gb, gpu.known) == (name, cc, memory, True)


@pytest.mark.parametrize("typed, name, memory", [
    ("NVIDIA GeForce RTX 3060 Laptop GPU", "RTX 3060 Laptop", 6), ("RTX 4070 Laptop GPU", "RTX 4070 Laptop", 8),
    ("NVIDIA GeForce RTX 4090 Laptop GPU", "RTX 4090 Laptop", 16), ("RTX 2060 SUPER", "RTX 2060 SUPER", 8),
    ("NVIDIA GeForce RTX 3090Ti", "RTX 3090 Ti", 24), ("NVIDIA GeForce RTX 5090", "RTX 5090", 32),
])
def test_geforce_desktop_and_laptop_variants(typed, name, memory):
    gpu = hardware.resolve_gpu(typed)
    assert (gpu.name, gpu.memory_gb) == (name, memory)


@pytest.mark.parametrize("typed, name, memory, tensor_cores", [
    ("NVIDIA RTX 5880 Ada Generation", "RTX 5880 Ada", 48, True),
    ("NVIDIA RTX PRO 4500 Blackwell", "RTX PRO 4500 Blackwell", 32, True),
    ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "RTX PRO 6000 Blackwell", 96, True),
    ("NVIDIA T600", "NVIDIA T series (TU117)", None, False), ("Quadro T2000", "NVIDIA T series (TU117)", None, False),
    ("GeForce MX450", "GeForce MX450/MX550 (TU117)", 2, False),
])
def test_workstation_and_entry_level_cards(typed, name, memory, tensor_cores):
    gpu = hardware.resolve_gpu(typed)
    assert (gpu.name, gpu.memory_gb, gpu.tensor_cores) == (name, memory, tensor_cores)
    assert gpu.fp16_fast  # TU117 has no tensor cores but runs fp16 at twice the fp32 rate


def test_jetson_modules():
    assert hardware.resolve_gpu("Jetson AGX Thor").cc == (11, 0)  # sm_110 from CUDA 13 (sm_101 before)
    assert hardware.resolve_gpu("NVIDIA Jetson AGX Orin").cc == (8, 7)
    assert hardware.resolve_gpu("Jetson Nano").cc == (5, 3)


@pytest.mark.parametrize("typed, cc", [("sm_90a", (9, 0)), ("sm_100f", (10, 0)), ("sm_120", (12, 0)),
                                       ("compute_89", (8, 9)), ("8.6", (8, 6))])
def test_compute_capability_codes(typed, cc):
    assert hardware.resolve_gpu(typed).cc == cc


@pytest.mark.parametrize("typed, arch, memory", [
    ("MI308X", "CDNA3", None), ("AMD Instinct MI300X", "CDNA3", 192), ("MI250X", "CDNA2", 64),
    ("gfx942", "CDNA3", None), ("gfx90a", "CDNA2", None), ("gfx1100", "RDNA3", None), ("gfx1201", "RDNA4", None),
    ("Radeon RX 580", "GCN4", None), ("AMD Radeon Graphics", "AMD iGPU", None),
])
def test_amd_names_and_gfx_codes(typed, arch, memory):
    gpu = hardware.resolve_gpu(typed)
    assert (gpu.vendor, gpu.arch, gpu.memory_gb, gpu.known) == ("amd", arch, memory, True)
    if typed == "MI250X":  # each of the package's two GCDs is a 64 GB device in PyTorch
        assert any("two GCDs" in w for w in gpu.warnings)
    if arch == "AMD iGPU":
        assert not gpu.bf16 and not gpu.fp16_fast


def test_apple_and_intel():
    assert hardware.resolve_gpu("Apple M2 Max").backend == "mps"
    assert hardware.resolve_gpu("Intel Arc A770").backend == "xpu"


@pytest.mark.parametrize("typed, vendor", [("Habana Gaudi2", "intel"), ("Gaudi 3", "intel"), ("TPU v4", "google"),
                                           ("Snapdragon X Elite", "qualcomm"), ("AWS Trainium", "aws")])
def test_accelerators_that_are_not_gpus_are_said_to_be_unsupported(typed, vendor):
    from troubleshooter import questionnaire
    from troubleshooter.errors import UserError

    gpu = hardware.resolve_gpu(typed)
    assert not gpu.supported and gpu.vendor == vendor and "not a GPU" in gpu.warnings[0]
    with pytest.raises(UserError, match="not a GPU"):
        questionnaire.resolve_device(typed)


@pytest.mark.parametrize("typed", ["cuda", "cuda:0", "GPU", "nvidia"])
def test_a_device_type_is_not_a_model(typed):
    gpu = hardware.resolve_gpu(typed)
    assert not gpu.known and "kind of device" in gpu.warnings[0] and "nvidia-smi" in gpu.warnings[0]


def test_every_product_figure_has_a_source():
    import yaml
    from importlib import resources

    for name in ("gpu_products.yaml", "gpus.yaml"):
        data = yaml.safe_load(resources.files("troubleshooter.data").joinpath(name).read_text())
        sources = data["sources"]
        assert all(str(v).startswith("https://") for v in sources.values()), name
        groups = ("nvidia", "other", "accelerators") if name == "gpu_products.yaml" else ("architectures", "gpus")
        for group in groups:
            for entry in data[group]:
                assert entry.get("src") and all(s in sources for s in entry["src"]), (name, entry)
