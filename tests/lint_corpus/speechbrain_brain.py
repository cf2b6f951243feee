# Corpus excerpt, abridged and rewritten for this test set (not a verbatim copy).
# Source: speechbrain/speechbrain speechbrain/core.py (Brain.fit_batch)
# Kind: speech. Labels: tests/lint_corpus/labels.json
import torch


class Brain:
    def __init__(self, modules=None, opt_class=None, hparams=None, run_opts=None, checkpointer=None):
        self.checkpointer = checkpointer
        gradscaler_enabled = self.precision == "fp16" and "cuda" in self.device
        self.scaler = torch.amp.GradScaler(self.device, enabled=gradscaler_enabled)
        if self.checkpointer is not None:
            self.checkpointer.add_recoverable("scaler", self.scaler, optional_load=True)

    def fit_batch(self, batch):
        amp = AMPConfig.from_name(self.precision)
        should_step = (self.step % self.grad_accumulation_factor) == 0
        with self.no_sync(not should_step):
            if self.use_amp:
                with torch.autocast(dtype=amp.dtype, device_type=torch.device(self.device).type):
                    outputs = self.compute_forward(batch, sb.Stage.TRAIN)
                    loss = self.compute_objectives(outputs, batch, sb.Stage.TRAIN)
            else:
                outputs = self.compute_forward(batch, sb.Stage.TRAIN)
                loss = self.compute_objectives(outputs, batch, sb.Stage.TRAIN)
            scaled_loss = self.scaler.scale(loss / self.grad_accumulation_factor)
            self.check_loss_isfinite(scaled_loss)
            scaled_loss.backward()
        if should_step:
            self.optimizers_step()
        return loss.detach().cpu()

    def optimizers_step(self):
        for opt in self.freeze_optimizers(self.optimizers_dict).values():
            self.scaler.unscale_(opt)
        if self.max_grad_norm > 0.0:
            torch.nn.utils.clip_grad_norm_((p for p in self.modules.parameters()), self.max_grad_norm)
        for opt in self.freeze_optimizers(self.optimizers_dict).values():
            self.scaler.step(opt)
        self.scaler.update()
        for opt in self.freeze_optimizers(self.optimizers_dict).values():
            opt.zero_grad(set_to_none=True)
