# Corpus excerpt, abridged and rewritten for this test set (not a verbatim copy).
# Source: lucidrains/denoising-diffusion-pytorch denoising_diffusion_pytorch/denoising_diffusion_pytorch.py (Trainer)
# Kind: diffusion. Labels: tests/lint_corpus/labels.json
import torch
from accelerate import Accelerator
from torch.optim import Adam


class Trainer:
    def __init__(self, diffusion_model, folder, *, gradient_accumulate_every=1, amp=False, mixed_precision_type='fp16',
                 train_lr=1e-4, max_grad_norm=1.):
        self.accelerator = Accelerator(split_batches=split_batches, mixed_precision=mixed_precision_type if amp else 'no')
        self.model = diffusion_model
        self.gradient_accumulate_every = gradient_accumulate_every
        self.max_grad_norm = max_grad_norm
        self.opt = Adam(diffusion_model.parameters(), lr=train_lr, betas=adam_betas)
        self.model, self.opt = self.accelerator.prepare(self.model, self.opt)

    def save(self, milestone):
        if not self.accelerator.is_local_main_process:
            return
        data = {
            'step': self.step,
            'model': self.accelerator.get_state_dict(self.model),
            'opt': self.opt.state_dict(),
            'ema': self.ema.state_dict(),
            'scaler': self.accelerator.scaler.state_dict() if exists(self.accelerator.scaler) else None,
            'version': __version__,
        }
        torch.save(data, str(self.results_folder / f'model-{milestone}.pt'))

    def train(self):
        accelerator = self.accelerator
        while self.step < self.train_num_steps:
            total_loss = 0.
            for _ in range(self.gradient_accumulate_every):
                data = next(self.dl).to(device)
                with self.accelerator.autocast():
                    loss = self.model(data)
                    loss = loss / self.gradient_accumulate_every
                    total_loss += loss.item()
                self.accelerator.backward(loss)
            accelerator.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
            accelerator.wait_for_everyone()
            self.opt.step()
            self.opt.zero_grad()
            self.step += 1
