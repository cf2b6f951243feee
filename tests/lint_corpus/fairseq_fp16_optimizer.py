# Corpus excerpt, abridged and rewritten for this test set (not a verbatim copy).
# Source: facebookresearch/fairseq fairseq/optim/fp16_optimizer.py + dynamic_loss_scaler.py
# Kind: llm. Labels: tests/lint_corpus/labels.json
import torch


class DynamicLossScaler(object):
    def __init__(self, init_scale=2.0 ** 15, scale_factor=2.0, scale_window=2000, tolerance=0.0, threshold=None,
                 min_loss_scale=1e-4):
        self.loss_scale = init_scale
        self.scale_factor = scale_factor
        self.scale_window = scale_window
        self._iter = 0
        self._last_overflow_iter = -1

    def scale(self, outputs):
        return self.loss_scale * outputs

    def update(self):
        if (self._iter - self._last_overflow_iter) % self.scale_window == 0:
            self.loss_scale *= self.scale_factor
            self._last_rescale_iter = self._iter
        self._iter += 1

    def check_overflow(self, grad_norm):
        if grad_norm == float("inf") or grad_norm != grad_norm:
            self.loss_scale /= self.scale_factor
            self._last_overflow_iter = self._iter
            raise OverflowError("setting loss scale to: " + str(self.loss_scale))


class _FP16OptimizerMixin(object):
    def backward(self, loss):
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        loss.backward()
        self._needs_sync = True

    def clip_grad_norm(self, max_norm, aggregate_norm_fn=None):
        self._sync_fp16_grads_to_fp32()
        grad_norm = self.multiply_factor * self.fp32_optimizer.clip_grad_norm(0, aggregate_norm_fn)
        if self.scaler is not None:
            if grad_norm > max_norm > 0.0:
                self._multiply_factor *= max_norm / grad_norm
            self.scaler.check_overflow(grad_norm)
        return grad_norm

    def step(self, closure=None, groups=None):
        self._sync_fp16_grads_to_fp32()
        self._unscale_grads()
        self.fp32_optimizer.step(closure, groups=groups)
        if self.scaler is not None:
            self.scaler.update()


class FP16Optimizer(_FP16OptimizerMixin, optim.FairseqOptimizer):
    def __init__(self, cfg, params, fp32_optimizer, fp32_params, **kwargs):
        super().__init__(cfg.optimizer)
        self.fp32_optimizer = fp32_optimizer
        self.scaler = DynamicLossScaler(init_scale=cfg.common.fp16_init_scale, scale_window=scale_window)
