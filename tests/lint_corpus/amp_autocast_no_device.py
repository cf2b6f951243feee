# Corpus excerpt, abridged and rewritten for this test set (not a verbatim copy).
# Source: a public DETR-style train_one_epoch found by `torch.amp.autocast(enabled=` (search id 19430360953)
# Kind: detection. Labels: tests/lint_corpus/labels.json
import torch


def train_one_epoch(model, criterion, data_loader, optimizer, device, epoch, scaler=None):
    model.train()
    criterion.train()
    for batch_idx, (images, targets) in enumerate(data_loader):
        images = images.to(device)
        targets = [{k: v.to(device) for k, v in t.items()} for t in targets]
        with torch.amp.autocast(enabled=(scaler is not None)):
            outputs = model(images)
            loss_dict = criterion(outputs, targets)
            losses = sum(loss_dict[k] * Config.WEIGHT_DICT[k] for k in loss_dict.keys() if k in Config.WEIGHT_DICT)
        optimizer.zero_grad()
        if scaler is not None:
            scaler.scale(losses).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
            scaler.step(optimizer)
            scaler.update()
        else:
            losses.backward()
            optimizer.step()
