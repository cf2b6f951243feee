# An Accelerate fp16 loop ported from plain PyTorch that kept loss.backward()
# Source: written for this corpus after huggingface/accelerate examples/nlp_example.py (Apache-2.0)
import torch
from accelerate import Accelerator
from transformers import AutoModelForSequenceClassification


def training_function(config):
    accelerator = Accelerator(mixed_precision="fp16")
    model = AutoModelForSequenceClassification.from_pretrained("bert-base-cased", return_dict=True)
    optimizer = torch.optim.AdamW(params=model.parameters(), lr=config["lr"])
    train_dataloader = torch.utils.data.DataLoader([])
    model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)
    for epoch in range(config["num_epochs"]):
        model.train()
        for step, batch in enumerate(train_dataloader):
            outputs = model(**batch)
            loss = outputs.loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
