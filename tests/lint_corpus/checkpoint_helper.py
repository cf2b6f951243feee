# Corpus excerpt, abridged and rewritten for this test set (not a verbatim copy).
# Source: pattern in issue 10 (checkpoint saved through a `save_checkpoint(model, optimizer, ...)` helper); written for this corpus
# Kind: vision. Labels: tests/lint_corpus/labels.json
import torch


def save_checkpoint(model, optimizer, epoch, path):
    state = {"epoch": epoch, "model": model.state_dict(), "optimizer": optimizer.state_dict()}
    torch.save(state, path)


def main():
    model = Net().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda")
    for epoch in range(epochs):
        for x, y in loader:
            with torch.autocast("cuda", dtype=torch.float16):
                loss = model(x.cuda(), y.cuda())
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        save_checkpoint(model, optimizer, epoch, f"ckpt_{epoch}.pt")
