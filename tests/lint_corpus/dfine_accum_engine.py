# Corpus excerpt, abridged and rewritten for this test set (not a verbatim copy).
# Source: an RT-DETR/D-FINE derived det_engine.py with accumulation (public file found by `autocast(device_type=str(device)`)
# Kind: detection. Labels: tests/lint_corpus/labels.json
import torch


def train_one_epoch(model, criterion, data_loader, optimizer, device, epoch, max_norm=0, **kwargs):
    scaler = kwargs.get("scaler", None)
    accum_steps = kwargs.get("accum_steps", 1)
    for i, (samples, targets) in enumerate(data_loader):
        samples = samples.to(device)
        if scaler is not None:
            with torch.autocast(device_type=str(device), cache_enabled=False):
                outputs = model(samples, targets=targets)
            loss_dict = criterion(outputs, targets)
            loss_raw = sum(loss_dict.values())
            loss = loss_raw / accum_steps
            scaler.scale(loss).backward()
            if (i + 1) % accum_steps == 0:
                if max_norm > 0:
                    scaler.unscale_(optimizer)
                    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
        else:
            outputs = model(samples, targets=targets)
            loss_dict = criterion(outputs, targets)
            loss = sum(loss_dict.values()) / accum_steps
            loss.backward()
            if (i + 1) % accum_steps == 0:
                if max_norm > 0:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
                optimizer.step()
                optimizer.zero_grad()
