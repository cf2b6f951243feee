# Corpus excerpt, abridged and rewritten for this test set (not a verbatim copy).
# Source: lucidrains/lightweight-gan lightweight_gan/lightweight_gan.py (Trainer)
# Kind: gan. Labels: tests/lint_corpus/labels.json
import torch
from torch.cuda.amp import autocast, GradScaler
from torch.autograd import grad as torch_grad


def gradient_penalty(images, output, weight=10, scaler=None):
    batch_size = images.shape[0]
    if exists(scaler):
        output = scaler.scale(output)
    gradients = torch_grad(outputs=output, inputs=images, grad_outputs=torch.ones(output.size(), device=images.device),
                           create_graph=True, retain_graph=True, only_inputs=True)[0]
    if exists(scaler):
        inv_scale = 1.0 / scaler.get_scale()
        gradients = gradients * inv_scale
    gradients = gradients.reshape(batch_size, -1)
    return weight * ((gradients.norm(2, dim=1) - 1) ** 2).mean()


class Trainer:
    def __init__(self, amp=False, gradient_accumulate_every=1, *args, **kwargs):
        self.amp = amp
        self.G_scaler = GradScaler(enabled=self.amp)
        self.D_scaler = GradScaler(enabled=self.amp)
        self.gradient_accumulate_every = gradient_accumulate_every

    def train(self):
        amp_context = autocast if self.amp else null_context
        self.GAN.D_opt.zero_grad()
        for i in gradient_accumulate_contexts(self.gradient_accumulate_every, self.is_ddp, ddps=[D_aug, G]):
            latents = torch.randn(batch_size, latent_dim).cuda(self.rank)
            image_batch = next(self.loader).cuda(self.rank)
            image_batch.requires_grad_()
            with amp_context():
                generated_images = G(latents)
                fake_output, fake_output_32x32, _ = D_aug(generated_images.detach(), detach=True, **aug_kwargs)
                real_output, real_output_32x32, real_aux_loss = D_aug(image_batch, calc_aux_loss=True, **aug_kwargs)
                disc_loss = hinge_loss(real_output, fake_output) + real_aux_loss
            if apply_gradient_penalty:
                gp = gradient_penalty(image_batch, real_output_loss, scaler=self.D_scaler)
                disc_loss = disc_loss + gp
            disc_loss = disc_loss / self.gradient_accumulate_every
            disc_loss.register_hook(raise_if_nan)
            self.D_scaler.scale(disc_loss).backward()
        self.D_scaler.step(self.GAN.D_opt)
        self.D_scaler.update()
        self.GAN.G_opt.zero_grad()
        for i in gradient_accumulate_contexts(self.gradient_accumulate_every, self.is_ddp, ddps=[G, D_aug]):
            with amp_context():
                generated_images = G(latents)
                fake_output, fake_output_32x32, _ = D_aug(generated_images, **aug_kwargs)
                gen_loss = G_loss_fn(fake_output, real_output) + G_loss_fn(fake_output_32x32, real_output_32x32)
            gen_loss = gen_loss / self.gradient_accumulate_every
            self.G_scaler.scale(gen_loss).backward()
        self.G_scaler.step(self.GAN.G_opt)
        self.G_scaler.update()

    def save(self, num):
        save_data = {
            'GAN': self.GAN.state_dict(),
            'version': __version__,
            'G_scaler': self.G_scaler.state_dict(),
            'D_scaler': self.D_scaler.state_dict()
        }
        torch.save(save_data, self.model_name(num))
