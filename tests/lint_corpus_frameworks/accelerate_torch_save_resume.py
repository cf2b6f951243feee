# An Accelerate fp16 loop that writes its own resumable checkpoint instead of accelerator.save_state
# Source: written for this corpus after huggingface/accelerate examples/by_feature/checkpointing.py (Apache-2.0)
import argparse

import torch
from accelerate import Accelerator


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mixed_precision", type=str, default="fp16", choices=["no", "fp16", "bf16"])
    parser.add_argument("--resume", type=str, default=None)
    args = parser.parse_args()
    accelerator = Accelerator(mixed_precision=args.mixed_precision)
    model = torch.nn.Linear(128, 10)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer)
    loader = torch.utils.data.DataLoader(torch.randn(64, 128), batch_size=8)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    start = 0
    if args.resume:
        ckpt = torch.load(args.resume, map_location="cpu")
        accelerator.unwrap_model(model).load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        start = ckpt["epoch"] + 1
    for epoch in range(start, 10):
        for batch in loader:
            loss = model(batch).sum()
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            torch.save({"model": accelerator.unwrap_model(model).state_dict(), "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict(), "epoch": epoch}, f"checkpoint_{epoch}.pt")


if __name__ == "__main__":
    main()
