# Corpus excerpt, abridged and rewritten for this test set (not a verbatim copy).
# Source: huggingface/transformers examples/pytorch/language-modeling/run_clm_no_trainer.py
# Kind: llm. Labels: tests/lint_corpus/labels.json
import torch
from accelerate import Accelerator
from transformers import AutoModelForCausalLM, get_scheduler


def main():
    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps, **accelerator_log_kwargs)
    model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path, config=config)
    optimizer = torch.optim.AdamW(optimizer_grouped_parameters, lr=args.learning_rate)
    lr_scheduler = get_scheduler(name=args.lr_scheduler_type, optimizer=optimizer,
                                 num_warmup_steps=args.num_warmup_steps * accelerator.num_processes,
                                 num_training_steps=args.max_train_steps * accelerator.num_processes)
    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler)
    for epoch in range(starting_epoch, args.num_train_epochs):
        model.train()
        for step, batch in enumerate(active_dataloader):
            with accelerator.accumulate(model):
                outputs = model(**batch)
                loss = outputs.loss
                accelerator.backward(loss)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            if isinstance(checkpointing_steps, int) and completed_steps % checkpointing_steps == 0:
                accelerator.save_state(output_dir)
