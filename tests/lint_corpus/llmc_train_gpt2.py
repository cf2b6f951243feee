# Corpus excerpt, abridged and rewritten for this test set (not a verbatim copy).
# Source: karpathy/llm.c train_gpt2.py
# Kind: llm. Labels: tests/lint_corpus/labels.json
from contextlib import nullcontext
import torch

device_type = 'cuda' if 'cuda' in device else 'cpu'
ptdtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}[args.dtype]
ctx = torch.amp.autocast(device_type=device_type, dtype=ptdtype) if device_type == "cuda" else nullcontext()
optimizer = raw_model.configure_optimizers(weight_decay=args.weight_decay, learning_rate=args.learning_rate,
                                           betas=(0.9, 0.95), device_type=device)
for step in range(args.num_iterations + 1):
    model.train()
    optimizer.zero_grad(set_to_none=True)
    lossf = 0.0
    for micro_step in range(grad_accum_steps):
        x, y = train_loader.next_batch()
        x, y = x.to(device), y.to(device)
        if ddp:
            model.require_backward_grad_sync = (micro_step == grad_accum_steps - 1)
        with ctx:
            _, loss = model(x, y, return_logits=False)
            loss = loss / grad_accum_steps
            lossf += loss.detach()
        loss.backward()
    if ddp:
        dist.all_reduce(lossf, op=dist.ReduceOp.AVG)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
    lr = get_lr(step)
    for param_group in optimizer.param_groups:
        param_group['lr'] = lr
    optimizer.step()
