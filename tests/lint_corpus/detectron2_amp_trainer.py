# Corpus excerpt, abridged and rewritten for this test set (not a verbatim copy).
# Source: facebookresearch/detectron2 detectron2/engine/train_loop.py
# Kind: detection. Labels: tests/lint_corpus/labels.json
import torch
from torch.nn.parallel import DataParallel, DistributedDataParallel


class AMPTrainer(SimpleTrainer):
    def __init__(self, model, data_loader, optimizer, gather_metric_period=1, zero_grad_before_forward=False,
                 grad_scaler=None, precision: torch.dtype = torch.float16, log_grad_scaler: bool = False):
        super().__init__(model, data_loader, optimizer, gather_metric_period, zero_grad_before_forward)
        if grad_scaler is None:
            from torch.cuda.amp import GradScaler

            grad_scaler = GradScaler()
        self.grad_scaler = grad_scaler
        self.precision = precision
        self.log_grad_scaler = log_grad_scaler

    def run_step(self):
        assert self.model.training, "[AMPTrainer] model was changed to eval mode!"
        assert torch.cuda.is_available(), "[AMPTrainer] CUDA is required for AMP training!"
        from torch.cuda.amp import autocast

        data = next(self._data_loader_iter)
        if self.zero_grad_before_forward:
            self.optimizer.zero_grad()
        with autocast(dtype=self.precision):
            loss_dict = self.model(data)
            losses = sum(loss_dict.values())
        if not self.zero_grad_before_forward:
            self.optimizer.zero_grad()
        self.grad_scaler.scale(losses).backward()
        if self.log_grad_scaler:
            storage = get_event_storage()
            storage.put_scalar("[metric]grad_scaler", self.grad_scaler.get_scale())
        self.after_backward()
        self.grad_scaler.step(self.optimizer)
        self.grad_scaler.update()

    def state_dict(self):
        ret = super().state_dict()
        ret["grad_scaler"] = self.grad_scaler.state_dict()
        return ret
