# Corpus excerpt, abridged and rewritten for this test set (not a verbatim copy).
# Source: a Kaggle notebook exported to .py (timm EfficientNet, GradScaler, accumulation)
# Kind: notebook. Labels: tests/lint_corpus/labels.json
#!/usr/bin/env python
# coding: utf-8

# In[1]:


get_ipython().system('pip install -q timm')


# In[2]:


import torch
import torch.nn as nn
from torch.cuda import amp

CFG = {"n_accumulate": 4, "epochs": 5, "lr": 1e-4}


# In[3]:


def train_one_epoch(model, optimizer, scheduler, dataloader, device, epoch):
    model.train()
    scaler = amp.GradScaler()
    for step, (images, labels) in enumerate(dataloader):
        images = images.to(device, dtype=torch.float)
        labels = labels.to(device, dtype=torch.long)
        with amp.autocast(enabled=True):
            outputs = model(images)
            loss = criterion(outputs, labels)
            loss = loss / CFG["n_accumulate"]
        scaler.scale(loss).backward()
        if (step + 1) % CFG["n_accumulate"] == 0:
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
            if scheduler is not None:
                scheduler.step()


# In[4]:


get_ipython().run_line_magic('time', 'run_training(model, optimizer, scheduler, device=CFG["device"], num_epochs=CFG["epochs"])')
torch.save(model.state_dict(), "best.bin")
