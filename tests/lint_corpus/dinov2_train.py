# Corpus excerpt, abridged and rewritten for this test set (not a verbatim copy).
# Source: facebookresearch/dinov2 dinov2/train/train.py
# Kind: vision. Labels: tests/lint_corpus/labels.json
import torch
from fvcore.common.checkpoint import PeriodicCheckpointer
from dinov2.fsdp import FSDPCheckpointer


def do_train(cfg, model, resume=False):
    model.train()
    fp16_scaler = model.fp16_scaler  # for mixed precision training
    optimizer = build_optimizer(cfg, model.get_params_groups())
    checkpointer = FSDPCheckpointer(model, cfg.train.output_dir, optimizer=optimizer, save_to_disk=True)
    start_iter = checkpointer.resume_or_load(cfg.MODEL.WEIGHTS, resume=resume).get("iteration", -1) + 1
    periodic_checkpointer = PeriodicCheckpointer(checkpointer, period=3 * cfg.train.OFFICIAL_EPOCH_LENGTH,
                                                 max_iter=max_iter, max_to_keep=3)
    for data in metric_logger.log_every(data_loader, 10, header, max_iter, start_iter):
        optimizer.zero_grad(set_to_none=True)
        loss_dict = model.forward_backward(data, teacher_temp=teacher_temp)
        if fp16_scaler is not None:
            if cfg.optim.clip_grad:
                fp16_scaler.unscale_(optimizer)
                for v in model.student.values():
                    v.clip_grad_norm_(cfg.optim.clip_grad)
            fp16_scaler.step(optimizer)
            fp16_scaler.update()
        else:
            if cfg.optim.clip_grad:
                for v in model.student.values():
                    v.clip_grad_norm_(cfg.optim.clip_grad)
            optimizer.step()
        model.update_teacher(mom)
        periodic_checkpointer.step(iteration)
