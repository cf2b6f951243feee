# Corpus excerpt, abridged and rewritten for this test set (not a verbatim copy).
# Source: meta-llama/llama-recipes src/llama_recipes/utils/train_utils.py
# Kind: llm. Labels: tests/lint_corpus/labels.json
import torch
from contextlib import nullcontext
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler


def train(model, train_dataloader, eval_dataloader, tokenizer, optimizer, lr_scheduler, gradient_accumulation_steps, train_config):
    if train_config.use_fp16 and train_config.enable_fsdp:
        scaler = ShardedGradScaler()
    elif train_config.use_fp16 and not train_config.enable_fsdp:
        scaler = torch.cuda.amp.GradScaler()
    autocast = torch.cuda.amp.autocast if train_config.use_fp16 else nullcontext
    for epoch in range(train_config.num_epochs):
        model.train()
        for step, batch in enumerate(train_dataloader):
            with autocast():
                loss = model(**batch).loss
            loss = loss / gradient_accumulation_steps
            if train_config.use_fp16:
                scaler.scale(loss).backward()
                if (step + 1) % gradient_accumulation_steps == 0 or step == len(train_dataloader) - 1:
                    if train_config.gradient_clipping and train_config.gradient_clipping_threshold > 0.0:
                        scaler.unscale_(optimizer)
                        torch.nn.utils.clip_grad_norm_(model.parameters(), train_config.gradient_clipping_threshold)
                    scaler.step(optimizer)
                    scaler.update()
                    optimizer.zero_grad()
            else:
                loss.backward()
                if (step + 1) % gradient_accumulation_steps == 0 or step == len(train_dataloader) - 1:
                    if train_config.gradient_clipping and train_config.gradient_clipping_threshold > 0.0:
                        torch.nn.utils.clip_grad_norm_(model.parameters(), train_config.gradient_clipping_threshold)
                    optimizer.step()
                    optimizer.zero_grad()
        lr_scheduler.step()
