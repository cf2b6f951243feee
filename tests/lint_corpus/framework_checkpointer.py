# Corpus excerpt, abridged and rewritten for this test set (not a verbatim copy).
# Source: facebookresearch/detectron2 tools/plain_train_net.py shape with a GradScaler added (pattern in issue 10: framework checkpointer given `optimizer=`)
# Kind: detection. Labels: tests/lint_corpus/labels.json
import torch
from detectron2.checkpoint import DetectionCheckpointer, PeriodicCheckpointer


def do_train(cfg, model, resume=False):
    model.train()
    optimizer = build_optimizer(cfg, model)
    scheduler = build_lr_scheduler(cfg, optimizer)
    scaler = torch.amp.GradScaler("cuda")
    checkpointer = DetectionCheckpointer(model, cfg.OUTPUT_DIR, optimizer=optimizer, scheduler=scheduler)
    periodic_checkpointer = PeriodicCheckpointer(checkpointer, cfg.SOLVER.CHECKPOINT_PERIOD, max_iter=max_iter)
    for data, iteration in zip(data_loader, range(start_iter, max_iter)):
        with torch.autocast("cuda", dtype=torch.float16):
            loss_dict = model(data)
            losses = sum(loss_dict.values())
        optimizer.zero_grad()
        scaler.scale(losses).backward()
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
        periodic_checkpointer.step(iteration)
