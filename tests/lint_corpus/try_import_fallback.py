# Corpus excerpt, abridged and rewritten for this test set (not a verbatim copy).
# Source: pattern in issue 10 (a real version fallback: old API only on the except path); written for this corpus
# Kind: vision. Labels: tests/lint_corpus/labels.json
import torch

try:
    from torch.amp import GradScaler, autocast
except ImportError:
    from torch.cuda.amp import GradScaler, autocast


def train(model, loader, optimizer, epochs):
    scaler = GradScaler("cuda")
    for epoch in range(epochs):
        for x, y in loader:
            x, y = x.cuda(), y.cuda()
            optimizer.zero_grad()
            with autocast("cuda"):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
