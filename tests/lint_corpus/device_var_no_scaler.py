# Corpus excerpt, abridged and rewritten for this test set (not a verbatim copy).
# Source: pattern in issue 10 (autocast device from a variable, model on CUDA, no scaler); written for this corpus
# Kind: vision. Labels: tests/lint_corpus/labels.json
import torch

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = resnet18(num_classes=10).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
criterion = torch.nn.CrossEntropyLoss()

for epoch in range(20):
    for images, labels in train_loader:
        images, labels = images.to(device), labels.to(device)
        optimizer.zero_grad()
        with torch.autocast(device_type=device.type):
            outputs = model(images)
            loss = criterion(outputs, labels)
        loss.backward()
        optimizer.step()
