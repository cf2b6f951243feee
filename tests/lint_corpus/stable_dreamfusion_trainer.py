# Corpus excerpt, abridged and rewritten for this test set (not a verbatim copy).
# Source: ashawkey/stable-dreamfusion nerf/utils.py (Trainer.train_one_epoch)
# Kind: diffusion. Labels: tests/lint_corpus/labels.json
import torch


class Trainer(object):
    def __init__(self, name, opt, model, guidance, optimizer=None, lr_scheduler=None, fp16=False, scheduler_update_every_step=False):
        self.fp16 = fp16
        self.scheduler_update_every_step = scheduler_update_every_step
        self.optimizer = optimizer(self.model)
        self.lr_scheduler = lr_scheduler(self.optimizer)
        self.scaler = torch.cuda.amp.GradScaler(enabled=self.fp16)

    def train_one_epoch(self, loader, max_epochs):
        for data in loader:
            self.optimizer.zero_grad()
            with torch.cuda.amp.autocast(enabled=self.fp16):
                pred_rgbs, pred_depths, loss = self.train_step(data)
            self.scaler.scale(loss).backward()
            self.post_train_step()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            if self.scheduler_update_every_step:
                self.lr_scheduler.step()
        if not self.scheduler_update_every_step:
            if isinstance(self.lr_scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
                self.lr_scheduler.step(self.stats["loss"][-1])
            else:
                self.lr_scheduler.step()
