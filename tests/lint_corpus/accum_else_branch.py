# Corpus excerpt, abridged and rewritten for this test set (not a verbatim copy).
# Source: pattern in issue 10 (AMP109 must not fire on the non-accumulating branch); written for this corpus
# Kind: vision. Labels: tests/lint_corpus/labels.json
import torch


def train_epoch(model, loader, optimizer, scaler, accum_steps, device):
    model.train()
    for i, (x, y) in enumerate(loader):
        x, y = x.to(device), y.to(device)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = criterion(model(x), y)
        if accum_steps > 1:
            scaler.scale(loss / accum_steps).backward()
            if (i + 1) % accum_steps == 0:
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()


def main():
    model = Net().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda")
    for epoch in range(90):
        train_epoch(model, loader, optimizer, scaler, args.accum_steps, "cuda")
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "scaler": scaler.state_dict(), "epoch": epoch}, "last.pt")
