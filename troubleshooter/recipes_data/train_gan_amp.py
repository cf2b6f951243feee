"""Mixed precision with several models, optimizers and losses: a GAN, as the PyTorch AMP examples do it.

One GradScaler serves every optimizer: each loss is scaled and backpropagated, each optimizer is
stepped through scaler.step() (which skips that optimizer's update when its gradients hold inf/NaN),
and scaler.update() runs once per iteration, after all of them. The discriminator steps before the
generator's backward, which runs through the discriminator with its parameters frozen: no gradient
of the generator's loss ever reaches the discriminator's update.

    python train_gan_amp.py             # overrides: --device cpu --max-steps 300 --batch-size 128 --lr 1e-4
# [option: checkpoint]
    python train_gan_amp.py --resume    # continue from OUT_DIR/ckpt.pt exactly where it stopped
# [end]

Put your generator, discriminator and data in "YOUR MODELS AND DATA"; the loop stays as it is.

Regenerate: python -m troubleshooter recipe --clip 1.0 --checkpoint --nan-guard --model gan
"""
import argparse
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# -----------------------------------------------------------------------------
# Config. Edit here; the names in [brackets] can also be overridden on the command line.
# [option: scaler]
PRECISION = "auto"   # [--precision] auto | bf16 | fp16 | fp32 (auto: bf16 if the device has it, else fp16 + GradScaler, else fp32)
# [else]
#| PRECISION = "bf16"   # [--precision] bf16 | fp32 (bf16 needs no loss scaling: it has float32's exponent range)
# [end]
MAX_STEPS = 600      # [--max-steps] iterations: one discriminator and one generator update each
BATCH_SIZE = 64      # [--batch-size]
LR = 2e-4            # [--lr] for both optimizers (the DCGAN setting)
# [option: clip]
GRAD_CLIP = 1.0      # clip each model's gradient norm to this, measured on the true (unscaled) gradients
# [end]
# [option: nan_guard]
MAX_NONFINITE_STREAK = 20  # abort after this many iterations in a row with inf/NaN losses or gradients
# [end]
LOG_EVERY = 10       # progress line every K iterations
# [option: checkpoint]
CKPT_EVERY = 50      # save a checkpoint every K iterations and at the end
# [end]
OUT_DIR = "out"      # [--out-dir]
DEVICE = "auto"      # [--device] auto | cpu | cuda | cuda:N | mps
SEED = 0

parser = argparse.ArgumentParser(description="Mixed-precision GAN training loop (see the docstring).")
# [option: scaler]
parser.add_argument("--precision", choices=["auto", "bf16", "fp16", "fp32"], default=PRECISION)
# [else]
#| parser.add_argument("--precision", choices=["bf16", "fp32"], default=PRECISION)
# [end]
parser.add_argument("--max-steps", type=int, default=MAX_STEPS)
parser.add_argument("--batch-size", type=int, default=BATCH_SIZE)
parser.add_argument("--lr", type=float, default=LR)
parser.add_argument("--device", default=DEVICE)
parser.add_argument("--out-dir", default=OUT_DIR)
# [option: checkpoint]
parser.add_argument("--resume", nargs="?", const="", default=None, metavar="CKPT",
                    help="continue from CKPT (default: OUT_DIR/ckpt.pt)")
parser.add_argument("--stop-at", type=int, default=None, metavar="STEP",
                    help="stop after STEP iterations as if interrupted")
# [end]
args = parser.parse_args()
PRECISION, MAX_STEPS, BATCH_SIZE, LR = args.precision, args.max_steps, args.batch_size, args.lr
DEVICE, OUT_DIR = args.device, args.out_dir
if MAX_STEPS < 1 or BATCH_SIZE < 1 or not LR > 0:
    parser.error("--max-steps and --batch-size must be >= 1 and --lr > 0")
# [option: checkpoint]
stop_at = MAX_STEPS if args.stop_at is None else min(max(args.stop_at, 0), MAX_STEPS)
# [else]
#| stop_at = MAX_STEPS
# [end]

if DEVICE == "auto":
    DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
device = torch.device(DEVICE)
# [option: scaler]


def pick_precision(device: torch.device) -> str:
    """bf16 where the GPU has it natively, else fp16 (+ GradScaler) where fp16 is fast, else fp32."""
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return "bf16"
        cc = torch.cuda.get_device_capability(device)
        return "fp16" if cc[0] >= 7 or cc in ((5, 3), (6, 0), (6, 2)) else "fp32"
    return "fp16" if device.type == "mps" else "fp32"


if PRECISION == "auto":
    PRECISION = pick_precision(device)
amp_dtype = torch.bfloat16 if PRECISION == "bf16" else torch.float16
# [else]
#| amp_dtype = torch.bfloat16
# [end]
if PRECISION == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
    sys.exit("error: bf16 not supported on this GPU (it needs Ampere or newer): use --precision fp16 or fp32")
autocast_ctx = torch.autocast(device.type, dtype=amp_dtype, enabled=PRECISION != "fp32")

# -----------------------------------------------------------------------------
# YOUR MODELS AND DATA GO HERE. The demo learns a ring of 8 Gaussians in 2-D.
NOISE_DIM = 16
HIDDEN = 64          # multiples of 8 keep the tensor cores busy


def build_generator() -> nn.Module:
    return nn.Sequential(nn.Linear(NOISE_DIM, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                         nn.Linear(HIDDEN, 2))


def build_discriminator() -> nn.Module:
    return nn.Sequential(nn.Linear(2, HIDDEN), nn.LeakyReLU(0.2), nn.Linear(HIDDEN, HIDDEN), nn.LeakyReLU(0.2),
                         nn.Linear(HIDDEN, 1))  # logits: the loss applies the sigmoid in float32


def real_batch(step: int) -> torch.Tensor:
    """Batch `step` of real samples, identical on every run (a resumed run sees the same data)."""
    gen = torch.Generator().manual_seed(SEED + step)
    angle = torch.randint(8, (BATCH_SIZE,), generator=gen) * (2 * torch.pi / 8)
    centers = torch.stack([angle.cos(), angle.sin()], dim=1) * 2
    return (centers + 0.05 * torch.randn(BATCH_SIZE, 2, generator=gen)).to(device)


def gan_loss(logits: torch.Tensor, real: bool) -> torch.Tensor:
    # binary_cross_entropy_with_logits runs in float32 under autocast (plain BCE is refused there).
    return F.binary_cross_entropy_with_logits(logits, torch.full_like(logits, float(real)))


# -----------------------------------------------------------------------------
torch.manual_seed(SEED)
generator, discriminator = build_generator().to(device), build_discriminator().to(device)  # float32 weights
opt_g = torch.optim.Adam(generator.parameters(), lr=LR, betas=(0.5, 0.999))
opt_d = torch.optim.Adam(discriminator.parameters(), lr=LR, betas=(0.5, 0.999))
# [option: scaler]
# ONE scaler for every model and optimizer: one loss scale, one update() per iteration.
scaler = torch.amp.GradScaler(device.type, enabled=PRECISION == "fp16")
skipped = 0  # iterations in which the scaler skipped at least one optimizer's update
# [end]
# [option: nan_guard]
nonfinite_steps = nonfinite_streak = 0  # iterations dropped because a loss or gradient was inf/NaN
# [end]


def check_finite(weights: dict) -> None:
    """Never write inf/NaN weights."""
    bad = [k for k, t in weights.items() if t.is_floating_point() and not torch.isfinite(t).all()]
    if bad:
        sys.exit(f"error: not saving: the weights hold inf/NaN ({', '.join(bad[:3])}); the last good "
                 "checkpoint is kept. `python -m troubleshooter check` localises the first non-finite module.")
# [option: checkpoint]


ckpt_path = os.path.join(OUT_DIR, "ckpt.pt")


def save_checkpoint(step: int) -> None:
    """Both models, both optimizers, the loss-scale state, the step and the RNG: a resume continues exactly."""
    g, d = generator.state_dict(), discriminator.state_dict()
    check_finite({**{f"generator.{k}": v for k, v in g.items()}, **{f"discriminator.{k}": v for k, v in d.items()}})
    ckpt = {"generator": g, "discriminator": d, "opt_g": opt_g.state_dict(), "opt_d": opt_d.state_dict(),
            # [option: scaler]
            "scaler": scaler.state_dict(), "skipped": skipped,
            # [end]
            # [option: nan_guard]
            "nonfinite_steps": nonfinite_steps,
            # [end]
            "step": step, "precision": PRECISION, "rng": torch.get_rng_state()}
    os.makedirs(OUT_DIR, exist_ok=True)
    torch.save(ckpt, ckpt_path + ".tmp")
    os.replace(ckpt_path + ".tmp", ckpt_path)  # atomic
    print(f"step {step}: saved {ckpt_path}", flush=True)


start_step = 0
if args.resume is not None:
    path = args.resume or ckpt_path
    if not os.path.exists(path):
        sys.exit(f"error: no checkpoint at {path}")
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    if ckpt["precision"] != PRECISION:
        sys.exit(f"error: {path} was trained in {ckpt['precision']}, not {PRECISION}: pass --precision {ckpt['precision']}")
    generator.load_state_dict(ckpt["generator"])
    discriminator.load_state_dict(ckpt["discriminator"])
    opt_g.load_state_dict(ckpt["opt_g"])
    opt_d.load_state_dict(ckpt["opt_d"])
    # [option: scaler]
    scaler.load_state_dict(ckpt["scaler"])
    skipped = ckpt["skipped"]
    # [end]
    # [option: nan_guard]
    nonfinite_steps = ckpt["nonfinite_steps"]
    # [end]
    start_step = ckpt["step"]
    torch.set_rng_state(ckpt["rng"])
    print(f"resumed from {path} at step {start_step}", flush=True)
# [else]
#|
#|
#| start_step = 0
# [end]
# [option: nan_guard]


def nonfinite(*values: torch.Tensor) -> bool:
    """True when any loss or gradient norm is inf/NaN (one host sync per iteration)."""
    return not bool(torch.stack([v.float() for v in values]).isfinite().all())
# [end]


# -----------------------------------------------------------------------------
print(f"training a GAN on {device} in {PRECISION} | steps {start_step}..{stop_at}", flush=True)
t_log = time.perf_counter()
for step in range(start_step, stop_at):
    real = real_batch(step)
    z = torch.randn(BATCH_SIZE, NOISE_DIM, device=device)
    # [option: nan_guard]
    dropped = False  # an update of this iteration was dropped for inf/NaN losses or gradients
    # [end]

    # Discriminator: real -> 1, fake -> 0. fake.detach(): no generator gradients from this loss.
    opt_d.zero_grad(set_to_none=True)
    with autocast_ctx:
        fake = generator(z)
        loss_d = gan_loss(discriminator(real), True) + gan_loss(discriminator(fake.detach()), False)
    # [option: scaler]
    scaler.scale(loss_d).backward()
    # [option: grad_norm]
    scaler.unscale_(opt_d)  # true gradients before clipping/checking; once per optimizer per iteration
    # [end]
    # [else]
    #| loss_d.backward()
    # [end]
    # [option: clip]
    norm_d = torch.nn.utils.clip_grad_norm_(discriminator.parameters(), GRAD_CLIP)
    # [else]
    # [option: nan_guard]
    #| norm_d = torch.nn.utils.clip_grad_norm_(discriminator.parameters(), float("inf"))  # the norm only
    # [end]
    # [end]
    # The discriminator steps NOW, before the generator's backward: that backward runs through the
    # discriminator, and whatever it wrote into the discriminator's .grad (the generator's loss, scaled
    # by the loss scale under fp16) would otherwise be part of this update.
    # [option: nan_guard]
    # [option: scaler]
    if PRECISION != "fp16" and nonfinite(loss_d, norm_d):  # under fp16, scaler.step skips it by itself
    # [else]
    #| if nonfinite(loss_d, norm_d):
    # [end]
        dropped = True
    else:
        # [option: scaler]
        scaler.step(opt_d)
        # [else]
        #| opt_d.step()
        # [end]
    # [else]
    # [option: scaler]
    #| scaler.step(opt_d)
    # [else]
    #| opt_d.step()
    # [end]
    # [end]

    # Generator: make the discriminator say 1 on fakes. The discriminator is frozen for this backward:
    # the gradient flows through it to the generator without writing into its parameters' .grad.
    opt_g.zero_grad(set_to_none=True)
    discriminator.requires_grad_(False)
    with autocast_ctx:
        loss_g = gan_loss(discriminator(fake), True)
    # [option: scaler]
    scaler.scale(loss_g).backward()
    # [else]
    #| loss_g.backward()
    # [end]
    discriminator.requires_grad_(True)
    # [option: scaler]
    # [option: grad_norm]
    scaler.unscale_(opt_g)
    # [end]
    # [end]
    # [option: clip]
    norm_g = torch.nn.utils.clip_grad_norm_(generator.parameters(), GRAD_CLIP)
    # [else]
    # [option: nan_guard]
    #| norm_g = torch.nn.utils.clip_grad_norm_(generator.parameters(), float("inf"))
    # [end]
    # [end]
    # [option: nan_guard]
    # [option: scaler]
    if PRECISION != "fp16" and nonfinite(loss_g, norm_g):
    # [else]
    #| if nonfinite(loss_g, norm_g):
    # [end]
        dropped = True
    else:
        # [option: scaler]
        scaler.step(opt_g)
        # [else]
        #| opt_g.step()
        # [end]
    # [else]
    # [option: scaler]
    #| scaler.step(opt_g)
    # [else]
    #| opt_g.step()
    # [end]
    # [end]
    # [option: scaler]
    # ONE update() per iteration, after every optimizer has stepped through the scaler.
    scale_before = scaler.get_scale()
    scaler.update()
    skipped += scaler.get_scale() < scale_before
    # [end]
    # [option: nan_guard]
    if dropped:
        nonfinite_steps += 1
        nonfinite_streak += 1
        print(f"step {step + 1}: non-finite loss or gradients, update skipped ({nonfinite_steps} so far)", flush=True)
        if nonfinite_streak >= MAX_NONFINITE_STREAK:
            sys.exit(f"error: {nonfinite_streak} iterations in a row had inf/NaN losses or gradients: training "
                     "diverged. Nothing non-finite was saved. Lower the learning rate or check the data.")
    else:
        nonfinite_streak = 0
    # [end]

    if (step + 1) % LOG_EVERY == 0:
        line = f"step {step + 1}/{MAX_STEPS} | loss_d {loss_d.item():.4f} | loss_g {loss_g.item():.4f}"
        # [option: scaler]
        line += f" | scale {scaler.get_scale():g} | skipped {skipped}"
        # [end]
        print(f"{line} | {LOG_EVERY / (time.perf_counter() - t_log):.1f} it/s", flush=True)
        t_log = time.perf_counter()
    # [option: checkpoint]
    if (step + 1) % CKPT_EVERY == 0 or step + 1 == stop_at:
        save_checkpoint(step + 1)
    # [end]

# [option: not checkpoint]
#| check_finite({**generator.state_dict(), **discriminator.state_dict()})
#| os.makedirs(OUT_DIR, exist_ok=True)
#| torch.save({"generator": generator.state_dict(), "discriminator": discriminator.state_dict()},
#|            os.path.join(OUT_DIR, "model.pt"))
# [end]
with torch.no_grad():
    samples = generator(torch.randn(1024, NOISE_DIM, device=device)).float()
radius = samples.norm(dim=1).mean().item()
summary = f"done: {stop_at} steps | mean radius of generated samples {radius:.2f} (the real ring: 2.00)"
# [option: scaler]
summary += f" | iterations with a skipped update: {skipped}"
# [end]
print(summary, flush=True)
