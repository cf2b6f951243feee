# Corpus excerpt, abridged and rewritten for this test set (not a verbatim copy).
# Source: lyuwenyu/RT-DETR rtdetr_pytorch/src/solver/det_engine.py
# Kind: detection. Labels: tests/lint_corpus/labels.json
import math
import sys
import torch


def train_one_epoch(model, criterion, data_loader, optimizer, device, epoch, max_norm=0, **kwargs):
    model.train()
    criterion.train()
    ema = kwargs.get('ema', None)
    scaler = kwargs.get('scaler', None)
    for samples, targets in metric_logger.log_every(data_loader, print_freq, header):
        samples = samples.to(device)
        targets = [{k: v.to(device) for k, v in t.items()} for t in targets]
        if scaler is not None:
            with torch.autocast(device_type=str(device), cache_enabled=True):
                outputs = model(samples, targets)
            with torch.autocast(device_type=str(device), enabled=False):
                loss_dict = criterion(outputs, targets)
            loss = sum(loss_dict.values())
            scaler.scale(loss).backward()
            if max_norm > 0:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
        else:
            outputs = model(samples, targets)
            loss_dict = criterion(outputs, targets)
            loss = sum(loss_dict.values())
            optimizer.zero_grad()
            loss.backward()
            if max_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            optimizer.step()
        if ema is not None:
            ema.update(model)
