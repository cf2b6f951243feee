# Corpus excerpt, abridged and rewritten for this test set (not a verbatim copy).
# Source: ultralytics/yolov5 utils/loss.py + train.py shape (loss summed over the batch by design)
# Kind: detection. Labels: tests/lint_corpus/labels.json
import torch


class ComputeLoss:
    def __call__(self, p, targets):
        lcls = torch.zeros(1, device=self.device)
        lbox = torch.zeros(1, device=self.device)
        lobj = torch.zeros(1, device=self.device)
        bs = tobj.shape[0]
        return (lbox + lobj + lcls) * bs, torch.cat((lbox, lobj, lcls)).detach()


def train(model, optimizer, dataloader, device, accumulate, epochs):
    scaler = torch.amp.GradScaler("cuda")
    compute_loss = ComputeLoss(model)
    last_opt_step = -1
    for epoch in range(epochs):
        for i, (imgs, targets, paths, _) in enumerate(dataloader):
            with torch.autocast("cuda"):
                pred = model(imgs.to(device))
                loss, loss_items = compute_loss(pred, targets.to(device))
            scaler.scale(loss).backward()
            if i - last_opt_step >= accumulate:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
                last_opt_step = i
