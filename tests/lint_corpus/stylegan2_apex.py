# Corpus excerpt, abridged and rewritten for this test set (not a verbatim copy).
# Source: lucidrains/stylegan2-pytorch stylegan2_pytorch/stylegan2_pytorch.py
# Kind: gan. Labels: tests/lint_corpus/labels.json
import torch
from apex import amp


def loss_backwards(fp16, loss, optimizer, loss_id, **kwargs):
    if fp16:
        with amp.scale_loss(loss, optimizer, loss_id) as scaled_loss:
            scaled_loss.backward(**kwargs)
    else:
        loss.backward(**kwargs)


class Trainer:
    def init_GAN(self):
        self.GAN = StyleGAN2(lr=self.lr, lr_mlp=self.lr_mlp, ttur_mult=self.ttur_mult, image_size=self.image_size,
                             fp16=self.fp16, *args, **kwargs)

    def train(self):
        self.GAN.D_opt.zero_grad()
        for i in gradient_accumulate_contexts(self.gradient_accumulate_every, self.is_ddp, ddps=[D_aug, S, G]):
            fake_output, fake_q_loss = D_aug(generated_images.clone().detach(), detach=True, **aug_kwargs)
            real_output, real_q_loss = D_aug(image_batch, **aug_kwargs)
            disc_loss = (F.relu(1 + real_output) + F.relu(1 - fake_output)).mean()
            disc_loss = disc_loss / self.gradient_accumulate_every
            disc_loss.register_hook(raise_if_nan)
            backwards(disc_loss, self.GAN.D_opt, loss_id=1)
        self.GAN.D_opt.step()

    def save(self, num):
        save_data = {'GAN': self.GAN.state_dict(), 'version': __version__}
        if self.GAN.fp16:
            save_data['amp'] = amp.state_dict()
        torch.save(save_data, self.model_name(num))
