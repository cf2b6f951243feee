# Corpus excerpt, abridged and rewritten for this test set (not a verbatim copy).
# Source: pattern in issue 10 (deprecated import inside a `try:` body is not a fallback); written for this corpus
# Kind: vision. Labels: tests/lint_corpus/labels.json
import torch

try:
    from torch.cuda.amp import autocast, GradScaler
    has_native_amp = True
except ImportError:
    has_native_amp = False


def train(model, loader, optimizer, epochs):
    scaler = GradScaler(enabled=has_native_amp)
    for epoch in range(epochs):
        for x, y in loader:
            x, y = x.cuda(), y.cuda()
            optimizer.zero_grad()
            with autocast(enabled=has_native_amp):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
