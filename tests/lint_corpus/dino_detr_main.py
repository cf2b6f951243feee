# Corpus excerpt, abridged and rewritten for this test set (not a verbatim copy).
# Source: IDEA-Research/DINO main.py + engine.py
# Kind: detection. Labels: tests/lint_corpus/labels.json
import torch
import util.misc as utils


def train_one_epoch(model, criterion, data_loader, optimizer, device, epoch, max_norm=0, wo_class_error=False,
                    lr_scheduler=None, args=None, logger=None, ema_m=None):
    scaler = torch.cuda.amp.GradScaler(enabled=args.amp)
    model.train()
    for samples, targets in metric_logger.log_every(data_loader, print_freq, header, logger=logger):
        samples = samples.to(device)
        with torch.cuda.amp.autocast(enabled=args.amp):
            outputs = model(samples, targets)
            loss_dict = criterion(outputs, targets)
            losses = sum(loss_dict[k] * weight_dict[k] for k in loss_dict.keys() if k in weight_dict)
        if args.amp:
            optimizer.zero_grad()
            scaler.scale(losses).backward()
            if max_norm > 0:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.zero_grad()
            losses.backward()
            if max_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            optimizer.step()


def main(args):
    for epoch in range(args.start_epoch, args.epochs):
        train_stats = train_one_epoch(model, criterion, data_loader_train, optimizer, device, epoch,
                                      args.clip_max_norm, wo_class_error=wo_class_error, lr_scheduler=lr_scheduler,
                                      args=args, logger=(logger if args.save_log else None), ema_m=ema_m)
        lr_scheduler.step()
        for checkpoint_path in checkpoint_paths:
            weights = {
                'model': model_without_ddp.state_dict(),
                'optimizer': optimizer.state_dict(),
                'lr_scheduler': lr_scheduler.state_dict(),
                'epoch': epoch,
                'args': args,
            }
            if args.use_ema:
                weights.update({'ema_model': ema_m.module.state_dict()})
            utils.save_on_master(weights, checkpoint_path)
