# Corpus excerpt, abridged and rewritten for this test set (not a verbatim copy).
# Source: ultralytics/yolov5 train.py
# Kind: detection. Labels: tests/lint_corpus/labels.json
import torch
from copy import deepcopy
from torch.optim import lr_scheduler


def train(hyp, opt, device, callbacks):
    cuda = device.type != 'cpu'
    model = Model(cfg or ckpt['model'].yaml, ch=3, nc=nc, anchors=hyp.get('anchors')).to(device)
    amp = check_amp(model)
    nbs = 64
    accumulate = max(round(nbs / batch_size), 1)
    optimizer = smart_optimizer(model, opt.optimizer, hyp['lr0'], hyp['momentum'], hyp['weight_decay'])
    scheduler = lr_scheduler.LambdaLR(optimizer, lr_lambda=lf)
    if not resume:
        check_anchors(dataset, model=model, thr=hyp['anchor_t'], imgsz=imgsz)
        model.half().float()  # pre-reduce anchor precision
    scaler = torch.cuda.amp.GradScaler(enabled=amp)
    for epoch in range(start_epoch, epochs):
        model.train()
        optimizer.zero_grad()
        for i, (imgs, targets, paths, _) in pbar:
            ni = i + nb * epoch
            imgs = imgs.to(device, non_blocking=True).float() / 255
            with torch.cuda.amp.autocast(amp):
                pred = model(imgs)
                loss, loss_items = compute_loss(pred, targets.to(device))
            scaler.scale(loss).backward()
            if ni - last_opt_step >= accumulate:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
                if ema:
                    ema.update(model)
                last_opt_step = ni
        scheduler.step()
        ckpt = {
            'epoch': epoch,
            'best_fitness': best_fitness,
            'model': deepcopy(de_parallel(model)).half(),
            'ema': deepcopy(ema.ema).half(),
            'updates': ema.updates,
            'optimizer': optimizer.state_dict(),
            'opt': vars(opt),
        }
        torch.save(ckpt, last)
        del ckpt
