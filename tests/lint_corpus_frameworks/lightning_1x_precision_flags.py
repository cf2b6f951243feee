# A Lightning 1.x-era script: precision=16 with amp_backend, run on Lightning 2.x
# Source: written for this corpus the way Lightning 1.x docs (common/precision) wrote it (Apache-2.0)
import pytorch_lightning as pl
import torch


class LitClassifier(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(28 * 28, 10)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.l1(x.view(x.size(0), -1)), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.02)


trainer = pl.Trainer(gpus=1, precision=16, amp_backend="native", max_epochs=5)
trainer.fit(LitClassifier())
