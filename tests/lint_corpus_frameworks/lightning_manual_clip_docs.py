# Lightning manual optimization with gradient clipping, as docs/source-pytorch/model/manual_optimization.rst writes it
# Source: Lightning-AI/pytorch-lightning docs/source-pytorch/model/manual_optimization.rst (Apache-2.0); Trainer line added
import torch
from lightning.pytorch import LightningModule, Trainer


class SimpleModel(LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.layer = torch.nn.Linear(32, 2)

    def compute_loss(self, batch):
        return self.layer(batch).sum()

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()

        # compute loss
        loss = self.compute_loss(batch)

        opt.zero_grad()
        self.manual_backward(loss)

        # clip gradients
        self.clip_gradients(opt, gradient_clip_val=0.5, gradient_clip_algorithm="norm")

        opt.step()

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


trainer = Trainer(accelerator="gpu", devices=1, precision="16-mixed", max_epochs=1)
