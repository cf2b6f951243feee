# Corpus excerpt, abridged and rewritten for this test set (not a verbatim copy).
# Source: huggingface/pytorch-image-models train.py
# Kind: vision. Labels: tests/lint_corpus/labels.json
from functools import partial
import torch
from timm.utils import NativeScaler, CheckpointSaver


def main():
    device = torch.device(args.device)
    amp_autocast = suppress
    loss_scaler = None
    if use_amp == 'native':
        amp_dtype = torch.bfloat16 if args.amp_dtype == 'bfloat16' else torch.float16
        amp_autocast = partial(torch.autocast, device_type=device.type, dtype=amp_dtype)
        if device.type in ('cuda',) and amp_dtype == torch.float16:
            loss_scaler = NativeScaler(device=device.type)
    saver = CheckpointSaver(model=model, optimizer=optimizer, args=args, model_ema=model_ema,
                            amp_scaler=loss_scaler, checkpoint_dir=output_dir, recovery_dir=output_dir)


def train_one_epoch(epoch, model, loader, optimizer, loss_fn, args, device, amp_autocast=suppress, loss_scaler=None):
    accum_steps = args.grad_accum_steps
    for batch_idx, (input, target) in enumerate(loader):
        need_update = (batch_idx + 1) % accum_steps == 0

        def _forward():
            with amp_autocast():
                output = model(input)
                loss = loss_fn(output, target)
            if accum_steps > 1:
                loss /= accum_steps
            return loss

        def _backward(_loss):
            if loss_scaler is not None:
                loss_scaler(_loss, optimizer, clip_grad=args.clip_grad, clip_mode=args.clip_mode,
                            parameters=model.parameters(), create_graph=second_order, need_update=need_update)
            else:
                _loss.backward(create_graph=second_order)
                if need_update:
                    if args.clip_grad is not None:
                        dispatch_clip_grad(model.parameters(), value=args.clip_grad, mode=args.clip_mode)
                    optimizer.step()

        loss = _forward()
        _backward(loss)
        if need_update:
            optimizer.zero_grad()
