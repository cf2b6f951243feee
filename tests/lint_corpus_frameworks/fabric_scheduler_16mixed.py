# A Fabric 16-mixed loop with a per-step warm-up scheduler (Fabric does not wrap schedulers)
# Source: written for this corpus after Lightning-AI/litgpt litgpt/pretrain.py (Apache-2.0), scheduler made a torch LambdaLR
import lightning as L
import torch

fabric = L.Fabric(accelerator="cuda", devices=1, precision="16-mixed")
model = torch.nn.Linear(256, 256)
optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1)
model, optimizer = fabric.setup(model, optimizer)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda it: min(1.0, (it + 1) / 2000))
train_dataloader = fabric.setup_dataloaders(torch.utils.data.DataLoader(torch.randn(64, 256), batch_size=8))
for batch in train_dataloader:
    loss = model(batch).pow(2).mean()
    fabric.backward(loss)
    fabric.clip_gradients(model, optimizer, max_norm=1.0)
    optimizer.step()
    optimizer.zero_grad()
    scheduler.step()
