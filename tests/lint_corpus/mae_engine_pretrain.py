# Corpus excerpt, abridged and rewritten for this test set (not a verbatim copy).
# Source: facebookresearch/mae engine_pretrain.py
# Kind: vision. Labels: tests/lint_corpus/labels.json
import math
import sys
import torch
import util.misc as misc
import util.lr_sched as lr_sched


def train_one_epoch(model, data_loader, optimizer, device, epoch, loss_scaler, log_writer=None, args=None):
    model.train(True)
    accum_iter = args.accum_iter
    optimizer.zero_grad()
    for data_iter_step, (samples, _) in enumerate(metric_logger.log_every(data_loader, print_freq, header)):
        if data_iter_step % accum_iter == 0:
            lr_sched.adjust_learning_rate(optimizer, data_iter_step / len(data_loader) + epoch, args)
        samples = samples.to(device, non_blocking=True)
        with torch.cuda.amp.autocast():
            loss, _, _ = model(samples, mask_ratio=args.mask_ratio)
        loss_value = loss.item()
        if not math.isfinite(loss_value):
            print("Loss is {}, stopping training".format(loss_value))
            sys.exit(1)
        loss /= accum_iter
        loss_scaler(loss, optimizer, parameters=model.parameters(),
                    update_grad=(data_iter_step + 1) % accum_iter == 0)
        if (data_iter_step + 1) % accum_iter == 0:
            optimizer.zero_grad()
        torch.cuda.synchronize()
