"""Mixed-precision training, done right: autocast, GradScaler, clipping, accumulation, resume.

Runs as downloaded: it trains a small demo model on synthetic data, on CPU or GPU.

    python train_amp.py                 # overrides: --device cpu --max-steps 50 --batch-size 8 --lr 1e-3
# [option: checkpoint]
    python train_amp.py --resume        # continue from OUT_DIR/ckpt.pt exactly where it stopped
# [end]
# [option: distributed!=none]
#|     torchrun --standalone --nproc_per_node 2 train_amp.py    # one process per GPU
# [end]

Put your model and data in the section marked "YOUR MODEL AND DATA"; the loop around them
stays as it is. Every line that matters for mixed precision says why it is there.

Regenerate: python -m troubleshooter recipe --clip 1.0 --scheduler cosine --checkpoint --nan-guard --eval
"""
import argparse
# [option: distributed=ddp]
#| import contextlib
# [end]
import math
import os
import sys
import time
# [option: distributed=fsdp]
# [option: scaler]
#| import warnings
# [end]
# [end]

import torch
import torch.nn as nn
import torch.nn.functional as F
# [option: activation_checkpointing]
#| import torch.utils.checkpoint
# [end]
# [option: distributed!=none]
#| import torch.distributed as dist
# [end]
# [option: distributed=ddp]
#| from torch.nn.parallel import DistributedDataParallel as DDP
# [end]
# [option: distributed=fsdp]
#| from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
#| from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
# [option: checkpoint]
#| from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_model_state_dict
#| from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict
# [end]
# [option: scaler]
#| from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
# [end]
# [end]

# -----------------------------------------------------------------------------
# Config. Edit here; the names in [brackets] can also be overridden on the command line.
# [option: scaler]
PRECISION = "auto"   # [--precision] auto | bf16 | fp16 | fp32 (auto: bf16 if the device has it, else fp16 + GradScaler, else fp32)
# [else]
#| PRECISION = "bf16"   # [--precision] bf16 | fp32 (bf16 needs no loss scaling: it has float32's exponent range)
# [end]
MAX_STEPS = 100      # [--max-steps] optimizer steps; the LR schedule spans exactly these
BATCH_SIZE = 16      # [--batch-size] samples per micro-batch, per process
# [option: data=loader]
#| NUM_WORKERS = 2      # [--num-workers] DataLoader worker processes per training process (0: load in the main process)
# [end]
ACCUM_STEPS = 1      # micro-batches per optimizer step: effective batch = BATCH_SIZE * ACCUM_STEPS * processes
LR = 3e-3            # [--lr] peak learning rate
WEIGHT_DECAY = 0.01  # AdamW weight decay, for weights of rank >= 2 only
# [option: ema]
#| EMA_DECAY = 0.999    # exponential moving average of the weights: ema = decay * ema + (1 - decay) * weights
# [end]
# [option: clip]
GRAD_CLIP = 1.0      # clip the global gradient norm to this, measured on the true (unscaled) gradients
# [end]
# [option: scheduler=cosine]
WARMUP_STEPS = 10    # linear warm-up, then cosine decay to MIN_LR_FRACTION * LR at MAX_STEPS
MIN_LR_FRACTION = 0.1
# [end]
LOG_EVERY = 10       # progress line every K steps: the only time the loss is read back from the device
# [option: eval]
EVAL_EVERY = 50      # evaluate on held-out batches every K steps and at the end
EVAL_BATCHES = 4
# [end]
# [option: checkpoint]
CKPT_EVERY = 50      # save a checkpoint every K steps and at the end
# [end]
# [option: distributed=fsdp]
# [option: model=transformer]
#| FSDP_WRAP_CLASSES = {"Block"}  # module classes FSDP shards one by one; empty: by size (FSDP_MIN_PARAMS)
# [else]
#| FSDP_WRAP_CLASSES = set()  # module classes FSDP shards one by one; empty: by size (FSDP_MIN_PARAMS)
# [end]
#| FSDP_MIN_PARAMS = 1_000_000  # size policy: a unit per module holding this many parameters
# [end]
# [option: lora]
#| LORA_RANK = 8        # adapters (LoRA): rank of the trainable low-rank update of each adapted Linear
#| LORA_TARGETS = {"Block"}  # module classes whose Linear layers get adapters (add yours: "LlamaDecoderLayer")
# [end]
# [option: activation_checkpointing]
# [option: model=transformer]
#| CHECKPOINT_CLASSES = {"Block"}  # module classes whose activations are recomputed (add yours: "LlamaDecoderLayer")
# [else]
#| CHECKPOINT_CLASSES = {"ConvBlock"}  # module classes whose activations are recomputed (add your block class)
# [end]
# [end]
# [option: streak]
MAX_NONFINITE_STREAK = 20  # abort after this many update attempts in a row dropped for inf/NaN
# [end]
OUT_DIR = "out"      # [--out-dir] checkpoints and final weights
DEVICE = "auto"      # [--device] auto | cpu | cuda | cuda:N | mps
SEED = 0

# -----------------------------------------------------------------------------
# Command line
parser = argparse.ArgumentParser(description="Mixed-precision training loop (see the docstring).")
# [option: scaler]
parser.add_argument("--precision", choices=["auto", "bf16", "fp16", "fp32"], default=PRECISION)
# [else]
#| parser.add_argument("--precision", choices=["bf16", "fp32"], default=PRECISION)
# [end]
parser.add_argument("--max-steps", type=int, default=MAX_STEPS)
parser.add_argument("--batch-size", type=int, default=BATCH_SIZE)
parser.add_argument("--lr", type=float, default=LR)
parser.add_argument("--device", default=DEVICE)
# [option: data=loader]
#| parser.add_argument("--num-workers", type=int, default=NUM_WORKERS)
# [end]
parser.add_argument("--out-dir", default=OUT_DIR)
# [option: load_weights]
#| parser.add_argument("--init-from", metavar="PATH", default=None,
#|                     help="start from these weights (a state_dict, or a checkpoint holding one under 'model'); "
#|                          "float16/bfloat16 weights load as float32 master weights")
# [end]
# [option: checkpoint]
parser.add_argument("--resume", nargs="?", const="", default=None, metavar="CKPT",
                    help="continue from CKPT (default: OUT_DIR/ckpt.pt)")
parser.add_argument("--stop-at", type=int, default=None, metavar="STEP",
                    help="stop after STEP steps as if interrupted (the LR schedule still spans --max-steps)")
# [else]
#| parser.add_argument("--resume", nargs="?", const="", default=None, help=argparse.SUPPRESS)
# [end]
args = parser.parse_args()
PRECISION, MAX_STEPS, BATCH_SIZE, LR = args.precision, args.max_steps, args.batch_size, args.lr
DEVICE, OUT_DIR = args.device, args.out_dir
# [option: data=loader]
#| NUM_WORKERS = max(0, args.num_workers)
# [end]
if MAX_STEPS < 1 or BATCH_SIZE < 1 or not LR > 0:
    parser.error("--max-steps and --batch-size must be >= 1 and --lr > 0")
# [option: checkpoint]
stop_at = MAX_STEPS if args.stop_at is None else min(max(args.stop_at, 0), MAX_STEPS)
# [else]
#| if args.resume is not None:
#|     parser.error("this recipe was generated without checkpoints: regenerate it with "
#|                  "`python -m troubleshooter recipe --checkpoint` to save and resume")
#| stop_at = MAX_STEPS
# [end]

# -----------------------------------------------------------------------------
# Device, processes and precision
# [option: distributed=none]
RANK, LOCAL_RANK, WORLD_SIZE = 0, 0, 1
# [else]
#| RANK = int(os.environ.get("RANK", 0))              # set by torchrun
#| LOCAL_RANK = int(os.environ.get("LOCAL_RANK", 0))
#| WORLD_SIZE = int(os.environ.get("WORLD_SIZE", 1))
# [end]
if DEVICE == "auto":
    DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
device = torch.device(DEVICE)
if device.type == "cuda":
    if device.index is None:
        device = torch.device("cuda", LOCAL_RANK)   # one GPU per process
    torch.cuda.set_device(device)
    # [option: tf32]
    #| # TF32: float32 matmuls and convolutions on Ampere+ tensor cores (float32 range, 10-bit products,
    #| # float32 accumulation): the fp32 speed-up for the ops autocast keeps in float32, or a whole fp32 run.
    #| torch.backends.cuda.matmul.allow_tf32 = True
    #| torch.backends.cudnn.allow_tf32 = True
    # [end]
    # [option: cudnn_benchmark]
    #| torch.backends.cudnn.benchmark = True  # fixed input shapes: cuDNN times its algorithms once, keeps the fastest
    # [end]
# [option: distributed!=none]
#| backend = "nccl" if device.type == "cuda" else "gloo"
#| if "RANK" in os.environ:
#|     dist.init_process_group(backend)
#| else:  # plain `python train_amp.py`: a world of one process, no launcher needed
#|     dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
# [end]


# [option: scaler]


def cpu_has_fast_bf16() -> bool:
    """bf16 on CPU only pays off with native instructions (AVX512-BF16 or AMX)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def pick_precision(device: torch.device) -> str:
    """bf16 where the hardware has it, else fp16 (+ GradScaler) where fp16 is fast, else fp32."""
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return "bf16"
        # Tensor cores (sm_70+), or CUDA cores with a 2x fp16 rate (P100 sm_60, Jetson sm_53/sm_62).
        cc = torch.cuda.get_device_capability(device)
        return "fp16" if cc[0] >= 7 or cc in ((5, 3), (6, 0), (6, 2)) else "fp32"
    if device.type == "cpu":
        return "bf16" if cpu_has_fast_bf16() else "fp32"
    if device.type == "mps":
        return "fp16"  # Apple GPUs: float16 is the native half type (GradScaler('mps') scales the loss)
    return "fp32"


if PRECISION == "auto":
    PRECISION = pick_precision(device)
# [end]
if PRECISION == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
    sys.exit("error: bf16 not supported on this GPU (it needs Ampere or newer): use fp16 with GradScaler "
             "(python -m troubleshooter recipe --precision fp16) or fp32")
# [option: scaler]
amp_dtype = torch.bfloat16 if PRECISION == "bf16" else torch.float16
# [else]
#| amp_dtype = torch.bfloat16
# [end]
# Autocast runs matmuls and convolutions in amp_dtype and keeps softmax, norms and losses in float32.
autocast_ctx = torch.autocast(device.type, dtype=amp_dtype, enabled=PRECISION != "fp32")

# -----------------------------------------------------------------------------
# YOUR MODEL AND DATA GO HERE. Replace build_model(), loss_fn() and get_batch(), keeping their
# signatures. The demo learns a synthetic task in a few dozen steps, so a falling loss shows
# the loop works before you plug in the real thing.
# [option: model=transformer]
VOCAB_SIZE = 64      # sizes in multiples of 8 (vocabularies: 64) keep the tensor cores busy
SEQ_LEN = 32
N_EMBD = 64
N_HEAD = 4
N_LAYER = 2
THROUGHPUT_UNIT, ITEMS_PER_SAMPLE = "tok", SEQ_LEN


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then an MLP."""

    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(N_EMBD)
        self.qkv = nn.Linear(N_EMBD, 3 * N_EMBD)
        self.proj = nn.Linear(N_EMBD, N_EMBD)
        self.ln2 = nn.LayerNorm(N_EMBD)
        self.mlp = nn.Sequential(nn.Linear(N_EMBD, 4 * N_EMBD), nn.GELU(), nn.Linear(4 * N_EMBD, N_EMBD))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, N_HEAD, C // N_HEAD).transpose(1, 2) for t in (q, k, v))
        # The fused attention kernel does its softmax in float32: no fp16 overflow in the scores.
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB_SIZE, N_EMBD)
        self.pos = nn.Embedding(SEQ_LEN, N_EMBD)
        self.blocks = nn.ModuleList(Block() for _ in range(N_LAYER))  # FSDP shards each block
        self.ln_f = nn.LayerNorm(N_EMBD)
        self.head = nn.Linear(N_EMBD, VOCAB_SIZE)

    def forward(self, input_ids, labels=None):
        x = self.tok(input_ids) + self.pos(torch.arange(input_ids.shape[1], device=input_ids.device))
        for block in self.blocks:
            x = block(x)
        # matmul rather than self.head(x): the 3-D result is a new tensor, not a view of a 2-D one,
        # so FSDP2 can hook the model's output for backward without warning about in-place views.
        logits = torch.matmul(self.ln_f(x), self.head.weight.t()) + self.head.bias
        if labels is None:
            return logits
        # Given labels it returns its own loss, as Hugging Face models do (output.loss / output["loss"]).
        return {"loss": loss_fn(logits, labels), "logits": logits}


def build_model() -> nn.Module:
    return TinyGPT()


def loss_fn(logits, targets):
    # cross_entropy runs in float32 under autocast: log-softmax in fp16 would overflow.
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def make_samples(gen: torch.Generator, n: int = BATCH_SIZE):
    """Synthetic language: every token is the previous one plus 7 (mod VOCAB_SIZE)."""
    start = torch.randint(VOCAB_SIZE, (n, 1), generator=gen)
    seq = (start + 7 * torch.arange(SEQ_LEN + 1)) % VOCAB_SIZE
    return seq[:, :-1], seq[:, 1:]
# [option: data=loader]


#| def as_example(x, y):
#|     """One dataset item, as a Hugging Face dataset gives it: a dict the model takes as keywords."""
#|     return {"input_ids": x, "labels": y}
# [end]
# [else]
#| IMAGE_SIZE = 16
#| IN_CHANNELS = 3
#| WIDTH = 32           # channel counts in multiples of 8 keep the tensor cores busy
#| NUM_CLASSES = 8
#| THROUGHPUT_UNIT, ITEMS_PER_SAMPLE = "img", 1
#|
#|
#| class ConvBlock(nn.Sequential):
#|     """Conv, BatchNorm (its statistics stay float32 under autocast), ReLU."""
#|
#|     def __init__(self, c_in: int, c_out: int, stride: int = 1):
#|         super().__init__(nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU())
#|
#|
#| class SmallCNN(nn.Module):
#|     def __init__(self):
#|         super().__init__()
#|         self.blocks = nn.Sequential(ConvBlock(IN_CHANNELS, WIDTH), ConvBlock(WIDTH, 2 * WIDTH, 2))
#|         self.head = nn.Linear(2 * WIDTH, NUM_CLASSES)
#|
#|     def forward(self, x):
#|         return self.head(self.blocks(x).mean(dim=(2, 3)))
#|
#|
#| def build_model() -> nn.Module:
#|     return SmallCNN()
#|
#|
#| def loss_fn(logits, targets):
#|     # cross_entropy runs in float32 under autocast: log-softmax in fp16 would overflow.
#|     return F.cross_entropy(logits, targets)
#|
#|
#| def make_samples(gen: torch.Generator, n: int = BATCH_SIZE):
#|     """Synthetic images: a fixed random pattern per class, plus noise."""
#|     patterns = torch.randn(NUM_CLASSES, IN_CHANNELS, IMAGE_SIZE, IMAGE_SIZE,
#|                            generator=torch.Generator().manual_seed(SEED))
#|     labels = torch.randint(NUM_CLASSES, (n,), generator=gen)
#|     noise = torch.randn(n, IN_CHANNELS, IMAGE_SIZE, IMAGE_SIZE, generator=gen)
#|     images = patterns[labels] + 0.5 * noise
#|     return images, labels
# [option: data=loader]
#|
#|
#| def as_example(x, y):
#|     """One dataset item: an (image, label) tuple, as torchvision datasets give it."""
#|     return x, y
# [end]
# [end]

# [option: lora]
#|
#|
#| class LoRALinear(nn.Module):
#|     """A frozen Linear plus a trainable low-rank update (LoRA): base(x) + B(A(x)) * alpha / rank.
#|
#|     The frozen base may sit in float16/bfloat16 (it gets no gradient, so it needs no float32 master
#|     copy); A and B stay float32, so the optimizer updates float32 weights and GradScaler unscales
#|     float32 gradients ('Attempting to unscale FP16 gradients.' is what float16 adapters would give)."""
#|
#|     def __init__(self, base: nn.Linear, rank: int):
#|         super().__init__()
#|         self.base = base
#|         device = base.weight.device
#|         self.lora_a = nn.Parameter(torch.randn(rank, base.in_features, device=device) / base.in_features ** 0.5)
#|         self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank, device=device))  # starts as the base
#|         self.scaling = 2.0  # alpha / rank with alpha = 2 * rank
#|
#|     def forward(self, x):
#|         return self.base(x) + F.linear(F.linear(x, self.lora_a), self.lora_b) * self.scaling
#|
#|
#| def add_lora(model: nn.Module) -> nn.Module:
#|     """Freeze the model, keep its frozen weights in the half dtype, and give the Linear layers of the
#|     LORA_TARGETS blocks float32 adapters: only the adapters train."""
#|     model.requires_grad_(False)
#|     if PRECISION != "fp32":
#|         model.to(amp_dtype)  # frozen: 2 bytes per parameter, no float32 master copy (a 13B base: 26 GB, not 52)
#|     for block in [m for m in model.modules() if type(m).__name__ in LORA_TARGETS]:
#|         for parent in list(block.modules()):
#|             for name, child in list(parent.named_children()):
#|                 if isinstance(child, nn.Linear):
#|                     setattr(parent, name, LoRALinear(child, LORA_RANK))
#|     return model
# [end]


def compute_loss(model: nn.Module, batch) -> torch.Tensor:
    """THE PLUG-IN POINT: one batch in, the scalar training loss out (called under autocast).

    A tuple/list batch (inputs, targets) runs loss_fn(model(inputs), targets). A dict batch (Hugging
    Face style: input_ids, attention_mask, labels, ...) runs model(**batch), and a model that computes
    its own loss returns it as output.loss (a ModelOutput), output["loss"], or first in a tuple.
    """
    if isinstance(batch, dict):
        out = model(**batch)
        if isinstance(out, torch.Tensor):
            return out
        if isinstance(out, dict) or hasattr(out, "keys"):
            return out["loss"]
        return out.loss if hasattr(out, "loss") else out[0]
    inputs, targets = batch
    return loss_fn(model(inputs), targets)


def to_device(batch):
    """Move a batch (tensor, tuple/list or dict of them) to the device."""
    if isinstance(batch, dict):
        return {k: to_device(v) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_device(v) for v in batch)
    if not isinstance(batch, torch.Tensor):
        return batch
    # [option: data=synthetic]
    if device.type == "cuda":
        batch = batch.pin_memory()  # page-locked: the copy below overlaps with compute
    # [end]
    # non_blocking: the host does not wait for the copy (with pinned memory, the GPU copies asynchronously).
    batch = batch.to(device, non_blocking=True)
    # [option: channels_last]
    #| if batch.dim() == 4:
    #|     batch = batch.contiguous(memory_format=torch.channels_last)  # NHWC: what tensor-core convolutions want
    # [end]
    return batch
# [option: data=synthetic]


def get_batch(split: str, index: int):
    """Batch number `index` of `split`, identical on every run: a resumed run sees the same data."""
    gen = torch.Generator().manual_seed(SEED + 2 * (index * WORLD_SIZE + RANK) + (split == "val"))
    return to_device(make_samples(gen))
# [else]
#|
#|
#| class DemoDataset(torch.utils.data.Dataset):
#|     """The demo task as a map-style dataset (item i is the same on every run). Replace with yours:
#|     any Dataset whose items are tuples (inputs, targets) or dicts (model keyword arguments)."""
#|
#|     def __init__(self, split: str, size: int):
#|         self.split, self.size = split, size
#|
#|     def __len__(self) -> int:
#|         return self.size
#|
#|     def __getitem__(self, i: int):
#|         gen = torch.Generator().manual_seed(SEED + 2 * i + (self.split == "val"))
#|         x, y = make_samples(gen, 1)
#|         return as_example(x[0], y[0])
#|
#|
#| datasets = {"train": DemoDataset("train", 4096), "val": DemoDataset("val", 256)}
#|
#|
#| def make_loader(split: str, epoch: int = 0, skip_batches: int = 0) -> torch.utils.data.DataLoader:
#|     """This process's share of `split` for one epoch, starting after `skip_batches` batches (resume)."""
#|     # DistributedSampler also without a process group: it splits the data into WORLD_SIZE disjoint
#|     # shards and, with set_epoch, shuffles each epoch differently but identically on every run.
#|     sampler = torch.utils.data.DistributedSampler(datasets[split], num_replicas=WORLD_SIZE, rank=RANK,
#|                                                   shuffle=split == "train", seed=SEED, drop_last=True)
#|     sampler.set_epoch(epoch)
#|     indices = list(sampler)[skip_batches * BATCH_SIZE:]
#|     return torch.utils.data.DataLoader(
#|         datasets[split], batch_size=BATCH_SIZE, sampler=indices, drop_last=True, num_workers=NUM_WORKERS,
#|         pin_memory=device.type == "cuda",  # page-locked batches: the copy to the GPU overlaps with compute
#|         persistent_workers=False)
#|
#|
#| def train_batches(start: int):
#|     """Training micro-batches, epoch after epoch, from micro-batch number `start` on: where a run
#|     resumed from a checkpoint at step S continues (S * ACCUM_STEPS micro-batches are done)."""
#|     per_epoch = len(datasets["train"]) // WORLD_SIZE // BATCH_SIZE
#|     if per_epoch < 1:
#|         sys.exit(f"error: the training set has fewer than BATCH_SIZE * processes = {BATCH_SIZE * WORLD_SIZE} items")
#|     epoch, offset = divmod(start, per_epoch)
#|     while True:
#|         for batch in make_loader("train", epoch, offset):
#|             yield to_device(batch)
#|         epoch, offset = epoch + 1, 0
# [end]


# [option: distributed=fsdp]


#| def fsdp_units(model: nn.Module) -> list[nn.Module]:
#|     """The submodules FSDP shards one by one: those whose class is in FSDP_WRAP_CLASSES (transformer
#|     blocks: add yours, e.g. "LlamaDecoderLayer"), else by size: every module holding at least
#|     FSDP_MIN_PARAMS parameters not already in a smaller unit. Nothing has to be called `blocks`."""
#|     if FSDP_WRAP_CLASSES:
#|         return [m for m in model.modules() if type(m).__name__ in FSDP_WRAP_CLASSES]
#|     units, taken = [], set()
#|     for module in reversed(list(model.modules())[1:]):  # children before their parents
#|         free = [p for p in module.parameters() if id(p) not in taken]
#|         if sum(p.numel() for p in free) >= FSDP_MIN_PARAMS:
#|             units.append(module)
#|             taken.update(id(p) for p in free)
#|     return units
# [end]
# [option: activation_checkpointing]


#| def checkpoint_blocks(model: nn.Module, classes: set) -> int:
#|     """Recompute the activations of every submodule whose class is in `classes` during backward
#|     (non-reentrant checkpoint), wherever it sits in the model. Only `forward` is replaced, so the
#|     parameter names, the state_dict and the checkpoints stay those of the plain model."""
#|     blocks = [m for m in model.modules() if type(m).__name__ in classes]
#|     if not blocks:
#|         raise SystemExit(f"activation checkpointing: the model has no module of class {sorted(classes)}; "
#|                          "set CHECKPOINT_CLASSES to the class name of its repeated blocks")
#|     for block in blocks:
#|         plain = block.forward
#|
#|         def forward(*args, _block=block, _plain=plain, **kwargs):
#|             if not (_block.training and torch.is_grad_enabled()):
#|                 return _plain(*args, **kwargs)
#|             return torch.utils.checkpoint.checkpoint(_plain, *args, use_reentrant=False, **kwargs)
#|
#|         block.forward = forward
#|     return len(blocks)
# [end]


# -----------------------------------------------------------------------------
# Model, optimizer, schedule, scaler
torch.manual_seed(SEED)  # the same initial weights in every process
# The weights stay float32 (the "master weights"): autocast casts per op, the optimizer updates float32.
model = build_model().to(device)
# [option: load_weights]
#| if args.init_from:
#|     # Weights stored in float16/bfloat16 (a half-precision checkpoint, torch_dtype=torch.float16) become
#|     # float32 master weights: autocast computes in half precision, the optimizer updates float32.
#|     state = torch.load(args.init_from, map_location="cpu", weights_only=True)
#|     state = state.get("model", state)
#|     model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()})
#|     model.float()
#|     if RANK == 0:
#|         print(f"loaded {args.init_from} as float32 master weights", flush=True)
# [end]
# [option: lora]
#| model = add_lora(model)
#| if RANK == 0:
#|     trainable = [p for p in model.parameters() if p.requires_grad]
#|     frozen = [p for p in model.parameters() if not p.requires_grad]
#|     print(f"LoRA: {sum(p.numel() for p in trainable):,} trainable adapter parameters in "
#|           f"{trainable[0].dtype}, {sum(p.numel() for p in frozen):,} frozen in {frozen[0].dtype}", flush=True)
# [end]
# [option: activation_checkpointing]
#| # Activation checkpointing: each block's activations are recomputed in backward instead of stored,
#| # about a third more compute for a fraction of the activation memory. Autocast state is replayed.
#| checkpoint_blocks(model, CHECKPOINT_CLASSES)
# [end]
# [option: sync_batchnorm]
#| if device.type == "cuda":  # SyncBatchNorm needs GPU tensors; on CPU each process keeps plain BatchNorm
#|     # BatchNorm statistics over every GPU's micro-batch, not each GPU's few samples.
#|     model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
# [end]
# [option: channels_last]
#| model = model.to(memory_format=torch.channels_last)
# [end]
raw_model = model  # the plain module: its state_dict is what checkpoints hold
# [option: ema]
#| # An EMA copy of the float32 weights (and BatchNorm statistics), updated after every real optimizer
#| # step: often the better model to evaluate and ship. Skipped fp16 steps do not move it.
#| ema_model = torch.optim.swa_utils.AveragedModel(
#|     raw_model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(EMA_DECAY), use_buffers=True)
# [end]
# [option: compile]
#| model = torch.compile(model)
# [end]
# [option: distributed=ddp]
#| model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
# [end]
# [option: distributed=fsdp]
#| # FSDP2 casts the sharded float32 weights to amp_dtype for compute and reduces gradients in float32.
#| mp_policy = MixedPrecisionPolicy(param_dtype=None if PRECISION == "fp32" else amp_dtype, reduce_dtype=torch.float32)
#| for norm in [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]:
#|     # BatchNorm keeps float32 weights, like its float32 running statistics (autocast feeds it half inputs).
#|     fully_shard(norm, mp_policy=MixedPrecisionPolicy(param_dtype=None, reduce_dtype=torch.float32))
#| for unit in fsdp_units(model):
#|     fully_shard(unit, mp_policy=mp_policy)  # one unit's full weights in memory at a time
#| fully_shard(model, mp_policy=mp_policy)  # the rest (embeddings, head) as one more unit
# [end]

# Weight decay on matmul/conv weights only: biases, norm scales and other 1-D parameters are not decayed.
decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
param_groups = [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}]
# Fused AdamW: the whole update in one kernel on CUDA.
optimizer = torch.optim.AdamW(param_groups, lr=LR, fused=device.type == "cuda")
# [option: scheduler=cosine]


def lr_factor(step: int) -> float:
    """Linear warm-up to LR, then cosine decay to MIN_LR_FRACTION * LR at MAX_STEPS."""
    if step < WARMUP_STEPS:
        return (step + 1) / WARMUP_STEPS
    progress = min(1.0, (step - WARMUP_STEPS) / max(1, MAX_STEPS - WARMUP_STEPS))
    return MIN_LR_FRACTION + (1 - MIN_LR_FRACTION) * 0.5 * (1 + math.cos(math.pi * progress))


scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
# [end]
# [option: scaler]
# fp16 gradients underflow to zero unless the loss is scaled up first. The scaler is disabled (a
# no-op) for bf16 and fp32, so this one loop serves every precision.
# [option: distributed=fsdp]
#| scaler = ShardedGradScaler(device.type, enabled=PRECISION == "fp16")  # agrees on inf/NaN across ranks
#| # The scaler's one-element scale meets DTensor gradients inside torch, which warns about it on every
#| # step; the replication it describes is what the scaler needs, so that one message is silenced.
#| warnings.filterwarnings("ignore", message="Found a non-scalar tensor with numel=1", category=UserWarning)
# [else]
scaler = torch.amp.GradScaler(device.type, enabled=PRECISION == "fp16")
# [end]
skipped_steps = 0  # fp16 steps the scaler skipped because a gradient overflowed
# [end]
# [option: nan_guard]
nonfinite_steps = 0  # steps dropped by the NaN guard because the loss or a gradient was inf/NaN
# [end]
# [option: streak]
nonfinite_streak = 0  # update attempts in a row that were dropped (NaN guard or fp16 overflow)
# [end]


def check_finite(weights: dict) -> None:
    """Never write inf/NaN weights: a checkpoint that holds them would poison every resumed run."""
    bad = [k for k, t in weights.items() if t.is_floating_point() and not torch.isfinite(t).all()]
    if bad:
        sys.exit(f"error: not saving: the weights hold inf/NaN ({', '.join(bad[:3])}"
                 f"{', ...' if len(bad) > 3 else ''}); the last good checkpoint is kept. "
                 "Localise the first non-finite module with `python -m troubleshooter check`.")
# [option: nan_guard]


def nonfinite_step(step: int, loss_sum: torch.Tensor, grad_norm: torch.Tensor) -> bool:
    """True (counted and reported) when this step's loss or gradient norm is inf/NaN.

    The gradient norm is computed for clipping anyway; reading the flag is one host sync per step.
    """
    global nonfinite_steps, nonfinite_streak
    if hasattr(grad_norm, "full_tensor"):  # FSDP2: a DTensor; its full value is the global norm
        grad_norm = grad_norm.full_tensor()
    bad = (~torch.isfinite(loss_sum) | ~torch.isfinite(grad_norm)).float()
    # [option: distributed!=none]
    #| dist.all_reduce(bad)  # every rank must make the same decision
    # [end]
    if not bad.item():
        return False
    nonfinite_steps += 1
    nonfinite_streak += 1
    if RANK == 0:
        print(f"step {step + 1}: non-finite loss or gradients, update skipped ({nonfinite_steps} so far)", flush=True)
    check_nonfinite_streak(step)
    return True
# [end]
# [option: streak]


def check_nonfinite_streak(step: int) -> None:
    """Abort, with a clear message, when every recent step was non-finite: the run has diverged."""
    if nonfinite_streak >= MAX_NONFINITE_STREAK:
        sys.exit(f"error: {nonfinite_streak} update attempts in a row had inf/NaN loss or gradients (at step "
                 f"{step + 1}): training diverged. Nothing non-finite was saved. Lower the learning rate, check the "
                 "data for inf/NaN, or compute unstable ops in float32; `python -m troubleshooter check` localises "
                 "the first non-finite module.")
# [end]


def model_state() -> dict:
    """The model's full float32 state_dict (under FSDP, gathered from every rank)."""
    # [option: distributed=fsdp]
    #| return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    # [else]
    return raw_model.state_dict()
    # [end]
# [option: eval]


# [option: data=loader]
#| val_batches = [batch for _, batch in zip(range(EVAL_BATCHES), make_loader("val"))]  # the same held-out batches each time
# [end]


@torch.no_grad()
def evaluate(model: nn.Module = model) -> float:
    """Mean loss on EVAL_BATCHES held-out batches, under the same autocast as training."""
    model.eval()
    total = torch.zeros((), device=device)
    for i in range(EVAL_BATCHES):
        # [option: data=synthetic]
        batch = get_batch("val", i)
        # [else]
        #| batch = to_device(val_batches[i])
        # [end]
        with autocast_ctx:
            total += compute_loss(model, batch)
    model.train()
    return total.item() / EVAL_BATCHES
# [end]
# [option: checkpoint]


ckpt_path = os.path.join(OUT_DIR, "ckpt.pt")


def save_checkpoint(step: int) -> None:
    """Everything a resumed run needs to continue exactly as if it had never stopped."""
    weights = model_state()
    # [option: distributed=fsdp]
    #| optim_state = get_optimizer_state_dict(
    #|     model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    # [else]
    optim_state = optimizer.state_dict()
    # [end]
    if RANK != 0:
        return
    check_finite(weights)
    if any(t.is_floating_point() and t.dtype != torch.float32 for t in weights.values()):
        raise RuntimeError("refusing to save a half-precision training checkpoint: keep float32 weights")
    ckpt = {
        "model": weights,  # float32 master weights: resuming from half weights would lose precision
        "optimizer": optim_state,
        # [option: ema]
        #| "ema": ema_model.state_dict(),
        # [end]
        # [option: scheduler=cosine]
        "scheduler": scheduler.state_dict(),
        # [end]
        # [option: scaler]
        # The loss scale and its growth tracker: without them a resumed fp16 run starts again at
        # 65536 and skips steps while the scale comes back down.
        "scaler": scaler.state_dict(),
        "skipped_steps": skipped_steps,
        # [end]
        # [option: nan_guard]
        "nonfinite_steps": nonfinite_steps,
        # [end]
        "step": step,
        "batches_seen": batches_seen,  # micro-batches consumed (more than step * ACCUM_STEPS after dropped steps)
        "precision": PRECISION,
        "rng": {"cpu": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None},
    }
    os.makedirs(OUT_DIR, exist_ok=True)
    torch.save(ckpt, ckpt_path + ".tmp")
    os.replace(ckpt_path + ".tmp", ckpt_path)  # atomic: a crash mid-save never leaves half a checkpoint
    print(f"step {step}: saved {ckpt_path}", flush=True)


start_step = start_batches = 0
if args.resume is not None:
    path = args.resume or ckpt_path
    if not os.path.exists(path):
        sys.exit(f"error: no checkpoint at {path}")
    ckpt = torch.load(path, map_location="cpu", weights_only=True)  # weights_only: loading runs no code
    if ckpt["precision"] != PRECISION:
        sys.exit(f"error: {path} was trained in {ckpt['precision']}, not {PRECISION}: pass --precision {ckpt['precision']}")
    # [option: distributed=fsdp]
    #| full = StateDictOptions(full_state_dict=True)
    #| set_model_state_dict(model, ckpt["model"], options=full)
    #| set_optimizer_state_dict(model, optimizer, ckpt["optimizer"], options=full)
    # [else]
    raw_model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    # [end]
    # [option: ema]
    #| ema_model.load_state_dict(ckpt["ema"])
    # [end]
    # [option: scheduler=cosine]
    scheduler.load_state_dict(ckpt["scheduler"])
    # [end]
    # [option: scaler]
    scaler.load_state_dict(ckpt["scaler"])
    skipped_steps = ckpt["skipped_steps"]
    # [end]
    # [option: nan_guard]
    nonfinite_steps = ckpt["nonfinite_steps"]
    # [end]
    start_step, start_batches = ckpt["step"], ckpt["batches_seen"]
    torch.set_rng_state(ckpt["rng"]["cpu"])
    if device.type == "cuda" and ckpt["rng"]["cuda"] is not None:
        torch.cuda.set_rng_state(ckpt["rng"]["cuda"], device)
    if RANK == 0:
        print(f"resumed from {path} at step {start_step}", flush=True)
# [else]
#|
#|
#| start_step = start_batches = 0
# [end]

# -----------------------------------------------------------------------------
# Training
if RANK == 0:
    print(f"training on {device} in {PRECISION} | {WORLD_SIZE} process(es) | steps {start_step}..{stop_at}", flush=True)
items_per_step = BATCH_SIZE * ACCUM_STEPS * WORLD_SIZE * ITEMS_PER_SAMPLE
# [option: data=loader]
#| batches = train_batches(start_batches)  # a resumed run continues at the next unseen batch
# [end]
model.train()
t_log, window_steps = time.perf_counter(), 0
# MAX_STEPS counts real optimizer updates: a dropped step (fp16 overflow, NaN guard) is retried on the
# next batches, so the LR schedule, which only advances on real updates, always runs to its end.
step, batches_seen, evaluated_at = start_step, start_batches, None
while True:
    # `step` optimizer updates are done at this point; `batches_seen` micro-batches were consumed.
    last = step == stop_at
    # [option: eval]
    if step != evaluated_at and (step % EVAL_EVERY == 0 or last):
        val_loss = evaluate()
        if RANK == 0:
            print(f"step {step}: val loss {val_loss:.4f}", flush=True)
        # [option: ema]
        #| ema_loss = evaluate(ema_model)
        #| if RANK == 0:
        #|     print(f"step {step}: EMA val loss {ema_loss:.4f}", flush=True)
        # [end]
        t_log, window_steps = time.perf_counter(), 0
    # [end]
    # [option: checkpoint]
    if step != evaluated_at and step > start_step and (step % CKPT_EVERY == 0 or last):
        save_checkpoint(step)
        t_log, window_steps = time.perf_counter(), 0
    # [end]
    if last:
        break
    evaluated_at = step  # a dropped attempt comes back here with the same step: no second evaluation

    # Forward and backward over ACCUM_STEPS micro-batches; gradients add up in .grad.
    loss_sum = torch.zeros((), device=device)
    for micro in range(ACCUM_STEPS):
        # [option: data=synthetic]
        batch = get_batch("train", batches_seen + micro)
        # [else]
        #| batch = next(batches)
        # [end]
        # [option: distributed=fsdp]
        #| # Reduce-scatter gradients only on the last micro-batch: one communication per optimizer step.
        #| model.set_requires_gradient_sync(micro == ACCUM_STEPS - 1)
        # [end]
        # [option: distributed=ddp]
        #| # All-reduce gradients only on the last micro-batch (one communication per optimizer step): the
        #| # other micro-batches run their forward under DDP's no_sync(), so their backward only accumulates.
        #| grad_sync = contextlib.nullcontext() if micro == ACCUM_STEPS - 1 else model.no_sync()
        #| with grad_sync, autocast_ctx:
        # [else]
        with autocast_ctx:
        # [end]
            # Divide by ACCUM_STEPS: the summed micro-batch gradients then equal the whole batch's mean.
            loss = compute_loss(model, batch) / ACCUM_STEPS
        # backward() outside autocast: each op's backward runs in the dtype its forward used.
        # [option: scaler]
        scaler.scale(loss).backward()  # fp16: the scaled loss keeps small gradients from flushing to zero
        # [else]
        #| loss.backward()
        # [end]
        loss_sum += loss.detach()  # stays on the device: no host sync per micro-batch
    batches_seen += ACCUM_STEPS

    # The optimizer step, once per ACCUM_STEPS micro-batches.
    # [option: grad_norm]
    # [option: scaler]
    scaler.unscale_(optimizer)  # divide the gradients by the scale first: clip and check the true gradients
    # [end]
    # [option: clip]
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
    # [else]
    #| grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf)  # the norm only, no clipping
    # [end]
    # [end]
    # [option: nan_guard]
    # NaN guard: an inf/NaN loss or gradient would poison every weight it touches: drop the update.
    # [option: scaler]
    # Under fp16 the GradScaler does this itself (scaler.step skips, scaler.update lowers the scale).
    if PRECISION != "fp16" and nonfinite_step(step, loss_sum, grad_norm):
    # [else]
    #| if nonfinite_step(step, loss_sum, grad_norm):
    # [end]
        optimizer.zero_grad(set_to_none=True)
        continue
    # [end]

    # [option: scaler]
    scaler.step(optimizer)  # skips the update if any gradient is inf/NaN
    scale_before = scaler.get_scale()
    scaler.update()  # once per optimizer step: lowers the scale after an overflow, grows it slowly otherwise
    # The scale only drops when the step was skipped. Reading it makes the host wait for the GPU every
    # step: the price of an exact LR schedule (GPT-2 small on an H200: fp16 at 0.79x bf16's tokens/s
    # with this check, 0.98x without it).
    stepped = scaler.get_scale() >= scale_before
    skipped_steps += not stepped
    nonfinite_streak = 0 if stepped else nonfinite_streak + 1
    optimizer.zero_grad(set_to_none=True)  # frees the gradients instead of writing zeros into them
    if not stepped:  # skipped: the LR schedule must not advance (it would eat the warm-up); retried
        check_nonfinite_streak(step)
        continue
    # [option: scheduler=cosine]
    scheduler.step()
    # [end]
    # [else]
    #| optimizer.step()
    #| optimizer.zero_grad(set_to_none=True)  # frees the gradients instead of writing zeros into them
    # [option: nan_guard]
    #| nonfinite_streak = 0
    # [end]
    # [option: scheduler=cosine]
    #| scheduler.step()
    # [end]
    # [end]
    # [option: ema]
    #| ema_model.update_parameters(raw_model)
    # [end]
    step += 1
    window_steps += 1

    if step % LOG_EVERY == 0 and RANK == 0:
        # .item() waits for the device to finish: do it only when printing.
        rate = window_steps * items_per_step / (time.perf_counter() - t_log)
        line = f"step {step}/{MAX_STEPS} | loss {loss_sum.item():.4f} | lr {optimizer.param_groups[0]['lr']:.2e}"
        # [option: clip]
        line += f" | grad norm {float(grad_norm):.3f}"
        # [end]
        # [option: scaler]
        line += f" | scale {scaler.get_scale():g} | skipped {skipped_steps}"
        # [end]
        # [option: nan_guard]
        line += f" | non-finite {nonfinite_steps}"
        # [end]
        print(f"{line} | {rate:,.0f} {THROUGHPUT_UNIT}/s", flush=True)
        t_log, window_steps = time.perf_counter(), 0

# [option: not checkpoint]
#| weights = model_state()  # float32 weights only: enough to use the model, not to resume training
# [end]
if RANK == 0:
    # [option: not checkpoint]
    #| check_finite(weights)
    #| os.makedirs(OUT_DIR, exist_ok=True)
    #| torch.save(weights, os.path.join(OUT_DIR, "model.pt"))
    # [option: ema]
    #| torch.save(ema_model.module.state_dict(), os.path.join(OUT_DIR, "model_ema.pt"))
    # [end]
    # [end]
    summary = f"done: {stop_at} steps"
    # [option: scaler]
    summary += f" | fp16 steps skipped by the scaler: {skipped_steps}"
    # [end]
    # [option: nan_guard]
    summary += f" | non-finite steps skipped: {nonfinite_steps}"
    # [end]
    print(summary, flush=True)
# [option: distributed!=none]
#| dist.barrier()  # every rank finishes its collectives first: gloo aborts a group torn down mid-operation
#| dist.destroy_process_group()
# [end]
