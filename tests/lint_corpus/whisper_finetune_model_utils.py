# Corpus excerpt, abridged (retry loop and evaluation left out) for this test set.
# Source: i4Ds/whisper-finetune src/whisper_finetune/model/model_utils.py
# Kind: speech. Labels: tests/lint_corpus/labels.json
import copy
from dataclasses import asdict
from typing import Iterator

import torch
import torch.nn.functional as F
from whisper.model import Whisper


def train_step(
    model: Whisper,
    train_iter: Iterator,
    optimizer: torch.optim.Optimizer,
    lr_scheduler: torch.optim.lr_scheduler.LambdaLR,
    t_config: dict,
) -> float:
    model.train()
    total_loss = 0.0
    mixed_precision_training = t_config["mixed_precision_training"]
    accum_grad_steps = t_config["accum_grad_steps"]
    max_grad_norm = t_config["max_grad_norm"]
    mp_dtype = torch.float16 if t_config["mp_dtype"] == "fp16" else torch.bfloat16

    # Setup grad scaler, if using fp16
    if mixed_precision_training:
        scaler = torch.cuda.amp.GradScaler()
    else:
        scaler = None

    for _ in range(accum_grad_steps):
        x, y_in, y_out = next(train_iter)
        x, y_in, y_out = x.to(model.device), y_in.to(model.device), y_out.to(model.device)
        with torch.autocast(device_type="cuda", enabled=mixed_precision_training, dtype=mp_dtype):
            audio_features = model.embed_audio(x)
            logits = model.logits(y_in, audio_features=audio_features)
            loss = F.cross_entropy(logits.transpose(1, 2), y_out)

            loss = loss / accum_grad_steps
        if scaler:
            scaler.scale(loss).backward()
        else:
            loss.backward()
        total_loss += loss.item()

    if scaler:
        # Unscales the gradients of optimizer's assigned params in-place
        scaler.unscale_(optimizer)

    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)

    if scaler:
        scaler.step(optimizer)
        lr_scheduler.step()
        scaler.update()
    else:
        optimizer.step()
        lr_scheduler.step()

    optimizer.zero_grad()

    return total_loss


def save_model(model: Whisper, save_path: str) -> None:
    # save model in half precision to save space
    model = copy.deepcopy(model).half()
    # save model weights and config in a dictionary that can be loaded with `whisper.load_model`
    torch.save({"model_state_dict": model.state_dict(), "dims": asdict(model.dims)}, save_path)
