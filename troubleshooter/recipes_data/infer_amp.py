"""Mixed-precision inference: the weights cast once to bf16/fp16, no GradScaler, no optimizer.

Inference has no gradients, so it needs neither loss scaling nor float32 master weights: the model
is cast to the half dtype (half the memory) and run in eval mode under torch.inference_mode(). The
first batches are compared with the float32 model, so a model that overflows float16 (often one
pretrained in bf16) stops the run before its outputs are used.

    python infer_amp.py                 # overrides: --device cpu --batches 20 --batch-size 64
# [option: load_weights]
    python infer_amp.py --init-from model.pt    # your weights (float32, float16 or bfloat16 files)
# [end]

Put your model and inputs in "YOUR MODEL AND INPUTS"; the loop stays as it is.

Regenerate: python -m troubleshooter recipe --load-weights --task inference
"""
import argparse
import copy
import sys
import time

import torch
import torch.nn as nn

# -----------------------------------------------------------------------------
# Config. Edit here; the names in [brackets] can also be overridden on the command line.
PRECISION = "auto"   # [--precision] auto | bf16 | fp16 | fp32 (auto: bf16 where the device has it, else fp16 on GPUs, else fp32)
BATCHES = 20         # [--batches] batches to run
BATCH_SIZE = 64      # [--batch-size]
CHECK_BATCHES = 2    # batches compared with the float32 model first
MAX_DISAGREEMENT = 0.02  # stop if more than this fraction of top-1 predictions differ from float32
LOG_EVERY = 10       # progress line every K batches
DEVICE = "auto"      # [--device] auto | cpu | cuda | cuda:N | mps
SEED = 0

parser = argparse.ArgumentParser(description="Mixed-precision inference (see the docstring).")
parser.add_argument("--precision", choices=["auto", "bf16", "fp16", "fp32"], default=PRECISION)
parser.add_argument("--batches", type=int, default=BATCHES)
parser.add_argument("--batch-size", type=int, default=BATCH_SIZE)
parser.add_argument("--device", default=DEVICE)
# [option: load_weights]
parser.add_argument("--init-from", metavar="PATH", default=None,
                    help="weights to run (a state_dict, or a checkpoint holding one under 'model')")
# [end]
args = parser.parse_args()
PRECISION, BATCHES, BATCH_SIZE, DEVICE = args.precision, args.batches, args.batch_size, args.device
if BATCHES < 1 or BATCH_SIZE < 1:
    parser.error("--batches and --batch-size must be >= 1")

if DEVICE == "auto":
    DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
device = torch.device(DEVICE)


def pick_precision(device: torch.device) -> str:
    """bf16 where the GPU has it natively, else fp16 on GPUs with fast fp16, else fp32 (CPUs: fp32)."""
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return "bf16"
        cc = torch.cuda.get_device_capability(device)
        return "fp16" if cc[0] >= 7 or cc in ((5, 3), (6, 0), (6, 2)) else "fp32"
    return "fp16" if device.type == "mps" else "fp32"


if PRECISION == "auto":
    PRECISION = pick_precision(device)
if PRECISION == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
    sys.exit("error: bf16 not supported on this GPU (it needs Ampere or newer): use --precision fp16 or fp32")
dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[PRECISION]

# -----------------------------------------------------------------------------
# YOUR MODEL AND INPUTS GO HERE. The demo classifies synthetic feature vectors.
IN_FEATURES, HIDDEN, NUM_CLASSES = 64, 256, 16  # multiples of 8 keep the tensor cores busy


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN), nn.GELU(), nn.LayerNorm(HIDDEN),
                         nn.Linear(HIDDEN, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, NUM_CLASSES))


def get_batch(index: int) -> torch.Tensor:
    """Batch `index` of inputs, the same on every run."""
    gen = torch.Generator().manual_seed(SEED + index)
    return torch.randn(BATCH_SIZE, IN_FEATURES, generator=gen).to(device)


# -----------------------------------------------------------------------------
torch.manual_seed(SEED)
model = build_model().to(device).eval()
# [option: load_weights]
if args.init_from:
    state = torch.load(args.init_from, map_location="cpu", weights_only=True)
    model.load_state_dict(state.get("model", state))  # copied into the float32 model whatever the file's dtype
    print(f"loaded {args.init_from}", flush=True)
# [end]
# The float32 reference for the first batches; then the weights are cast once: no master copy is
# needed without gradients, and every matmul runs in the half dtype (LayerNorm upcasts internally).
reference = copy.deepcopy(model) if PRECISION != "fp32" else None
model.to(dtype)
# [option: compile]
#| model = torch.compile(model)
# [end]

print(f"inference on {device} in {PRECISION} | {BATCHES} batches of {BATCH_SIZE}", flush=True)
with torch.inference_mode():
    if reference is not None:
        for index in range(CHECK_BATCHES):
            x = get_batch(index)
            want = reference(x)
            got = model(x.to(dtype)).float()  # outputs back to float32 for comparisons, metrics, NumPy
            if not torch.isfinite(got).all():
                sys.exit(f"error: non-finite outputs in {PRECISION}: the model overflows this dtype (a model "
                         "pretrained in bf16 often overflows fp16): use --precision bf16 or fp32")
            disagree = (got.argmax(-1) != want.argmax(-1)).float().mean().item()
            error = ((got - want).abs().max() / want.abs().max().clamp_min(1e-6)).item()
            print(f"check {index + 1}/{CHECK_BATCHES}: top-1 disagreement with float32 {disagree:.1%}, "
                  f"max relative error {error:.2e}", flush=True)
            if disagree > MAX_DISAGREEMENT:
                sys.exit(f"error: {disagree:.1%} of the {PRECISION} predictions differ from float32: keep "
                         "this model in float32 (or bf16), or find the layer that loses precision")
        del reference
    t_log = time.perf_counter()
    counts = torch.zeros(NUM_CLASSES, dtype=torch.long, device=device)
    for index in range(BATCHES):
        x = get_batch(CHECK_BATCHES + index).to(dtype)
        predictions = model(x).argmax(-1)
        counts += torch.bincount(predictions, minlength=NUM_CLASSES)
        if (index + 1) % LOG_EVERY == 0:
            rate = LOG_EVERY * BATCH_SIZE / (time.perf_counter() - t_log)
            print(f"batch {index + 1}/{BATCHES} | {rate:,.0f} samples/s", flush=True)
            t_log = time.perf_counter()
print(f"done: {BATCHES} batches in {PRECISION} | predictions per class {counts.tolist()}", flush=True)
