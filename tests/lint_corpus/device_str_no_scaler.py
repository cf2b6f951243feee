# Corpus excerpt, abridged and rewritten for this test set (not a verbatim copy).
# Source: pattern in issue 10 (`torch.autocast(device_type=str(device))` without a scaler); written for this corpus
# Kind: speech. Labels: tests/lint_corpus/labels.json
import torch
import torchaudio


def train(model, loader, optimizer, device, epochs):
    model.train()
    for epoch in range(epochs):
        for waveform, target in loader:
            waveform, target = waveform.to(device), target.to(device)
            optimizer.zero_grad()
            with torch.autocast(device_type=str(device)):
                logits = model(waveform)
                loss = torch.nn.functional.cross_entropy(logits, target)
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    device = "cuda"
    model = M5(n_input=1, n_output=35).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=0.0001)
    train(model, train_loader, optimizer, device, 2)
