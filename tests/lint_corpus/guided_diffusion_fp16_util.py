# Corpus excerpt, abridged and rewritten for this test set (not a verbatim copy).
# Source: openai/guided-diffusion guided_diffusion/fp16_util.py
# Kind: diffusion. Labels: tests/lint_corpus/labels.json
import numpy as np
import torch as th

INITIAL_LOG_LOSS_SCALE = 20.0


class MixedPrecisionTrainer:
    def __init__(self, *, model, use_fp16=False, fp16_scale_growth=1e-3, initial_lg_loss_scale=INITIAL_LOG_LOSS_SCALE):
        self.model = model
        self.use_fp16 = use_fp16
        self.fp16_scale_growth = fp16_scale_growth
        self.model_params = list(self.model.parameters())
        self.master_params = self.model_params
        self.lg_loss_scale = initial_lg_loss_scale
        if self.use_fp16:
            self.param_groups_and_shapes = get_param_groups_and_shapes(self.model.named_parameters())
            self.master_params = make_master_params(self.param_groups_and_shapes)
            self.model.convert_to_fp16()

    def backward(self, loss: th.Tensor):
        if self.use_fp16:
            loss_scale = 2 ** self.lg_loss_scale
            (loss * loss_scale).backward()
        else:
            loss.backward()

    def _optimize_fp16(self, opt: th.optim.Optimizer):
        model_grads_to_master_grads(self.param_groups_and_shapes, self.master_params)
        grad_norm, param_norm = self._compute_norms(grad_scale=2 ** self.lg_loss_scale)
        if check_overflow(grad_norm):
            self.lg_loss_scale -= 1
            zero_master_grads(self.master_params)
            return False
        for p in self.master_params:
            p.grad.mul_(1.0 / (2 ** self.lg_loss_scale))
        opt.step()
        zero_master_grads(self.master_params)
        master_params_to_model_params(self.param_groups_and_shapes, self.master_params)
        self.lg_loss_scale += self.fp16_scale_growth
        return True
