"""AMP122 batchnorm-under-fp16."""
import ast

from ..analysis import tail
from ..lazy_re import lazy
from ._steps import training_regions
from .base import Hit, Rule

_BN_MODELS = lazy(r"^torchvision\.models\.(resnet|resnext|wide_resnet|densenet|mobilenet|efficientnet|regnet|"
                        r"inception|googlenet|mnasnet|shufflenet|vgg\d+_bn)")
_MODEL_PREFIXES = ("resnet", "resnext", "wide_resnet", "densenet", "mobilenet", "efficientnet", "regnet",
                   "inception", "googlenet", "mnasnet", "shufflenet", "vgg")
_BN = lazy(r"^(Sync)?BatchNorm(\d d)?$|^BatchNorm[123]d$|^SyncBatchNorm$")


class BatchnormUnderFp16(Rule):
    id = "AMP122"
    name = "batchnorm-under-fp16"
    severity = "info"
    summary = "BatchNorm layers trained under float16 autocast."
    why = ("BatchNorm statistics (mean/variance over the batch) are sensitive to float16's 10-bit mantissa and "
           "range; with small batches or large activations the running variance can overflow or lose precision. "
           "PyTorch keeps the BN parameters in float32, but the inputs and outputs are float16.")
    example_bad = """
self.bn = nn.BatchNorm2d(64)
with torch.autocast("cuda", dtype=torch.float16):
    loss = model(x)
"""
    example_good = """
self.bn = nn.BatchNorm2d(64)
with torch.autocast("cuda", dtype=torch.bfloat16):  # or keep BN in float32
    loss = model(x)
"""
    fix = ("Prefer bfloat16 autocast on GPUs that support it, or watch the skip rate and BN running statistics; "
           "GroupNorm/LayerNorm are less sensitive.")

    known_problems = 'autocast already runs batch norm in float32; the note is about the float16 activations around it.'
    references = ('https://pytorch.org/docs/stable/amp.html (Autocast op reference)',)

    def check(self, m):
        if not any(True for _ in training_regions(m, ("fp16",))):
            return
        for n in m.nodes:
            if not isinstance(n, ast.Call):
                continue
            t = tail(n.func) or ""
            if "Norm" not in t and not t.startswith(_MODEL_PREFIXES):
                continue
            if _BN.match(t):
                yield Hit.at(n, f"`{tail(n.func)}` is trained under float16 autocast")
            elif _BN_MODELS.match(m.names.qual(n.func) or ""):
                yield Hit.at(n, f"`{tail(n.func)}` (BatchNorm inside) is trained under float16 autocast")
