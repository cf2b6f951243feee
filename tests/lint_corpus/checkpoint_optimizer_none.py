# Corpus excerpt, abridged and rewritten for this test set (not a verbatim copy).
# Source: pattern in issue 10 (AMP110 must not fire when the optimizer key holds None); written for this corpus
# Kind: vision. Labels: tests/lint_corpus/labels.json
import torch


def main():
    model = Net().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda")
    for epoch in range(epochs):
        for x, y in loader:
            with torch.autocast("cuda", dtype=torch.float16):
                loss = criterion(model(x.cuda()), y.cuda())
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        torch.save({"model": model.state_dict(), "optimizer": None, "epoch": epoch}, "weights.pt")
