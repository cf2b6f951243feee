# Fabric gradient accumulation as the Fabric docs write it (guide/gradient_accumulation), with the clip placed on every micro-batch
# Source: written for this corpus after lightning.ai/docs/fabric/stable/advanced/gradient_accumulation.html (Apache-2.0)
import lightning as L
import torch

fabric = L.Fabric(accelerator="cuda", devices=2, precision="16-mixed")
fabric.launch()
model = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
model, optimizer = fabric.setup(model, optimizer)
dataloader = fabric.setup_dataloaders(torch.utils.data.DataLoader(torch.randn(64, 128), batch_size=8))
accumulation_steps = 8

for iteration, batch in enumerate(dataloader):
    is_accumulating = iteration % accumulation_steps != 0
    with fabric.no_backward_sync(model, enabled=is_accumulating):
        output = model(batch)
        loss = output.sum() / accumulation_steps
        fabric.backward(loss)
    fabric.clip_gradients(model, optimizer, max_norm=1.0)
    if not is_accumulating:
        optimizer.step()
        optimizer.zero_grad()
