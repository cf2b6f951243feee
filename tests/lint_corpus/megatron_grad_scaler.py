# Corpus excerpt, abridged and rewritten for this test set (not a verbatim copy).
# Source: NVIDIA/Megatron-LM megatron/core/optimizer/grad_scaler.py + optimizer.py
# Kind: llm. Labels: tests/lint_corpus/labels.json
import torch


class DynamicGradScaler(MegatronGradScaler):
    def __init__(self, initial_scale, min_scale, growth_factor, backoff_factor, growth_interval, hysteresis):
        super(DynamicGradScaler, self).__init__(initial_scale)
        self.min_scale = torch.tensor([min_scale], dtype=torch.float, device='cuda')
        self.growth_factor = torch.tensor([growth_factor], dtype=torch.float, device='cuda')
        self.backoff_factor = torch.tensor([backoff_factor], dtype=torch.float, device='cuda')
        self.growth_interval = growth_interval
        self._growth_tracker = 0

    def update(self, found_inf):
        if found_inf:
            self._growth_tracker = 0
            self._scale = torch.max(self._scale * self.backoff_factor, self.min_scale)
        else:
            self._growth_tracker += 1
            if self._growth_tracker == self.growth_interval:
                self._growth_tracker = 0
                self._scale = self._scale * self.growth_factor


class MixedPrecisionOptimizer(MegatronOptimizer):
    def __init__(self, optimizer, config, grad_scaler, init_state_fn):
        super().__init__(optimizer, config, init_state_fn)
        self.grad_scaler = grad_scaler

    def scale_loss(self, loss):
        return self.grad_scaler.scale * loss

    @torch.no_grad()
    def step(self):
        found_inf_flag = self._unscale_main_grads_and_check_for_nan()
        self.grad_scaler.update(found_inf_flag)
        if found_inf_flag:
            return False, None, None
        grad_norm = self.clip_grad_norm(self.config.clip_grad)
        self.optimizer.step()
        self._copy_main_params_to_model_params()
        return True, grad_norm, None
