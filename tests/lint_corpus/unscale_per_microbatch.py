# Corpus excerpt, abridged and rewritten for this test set (not a verbatim copy).
# Source: pattern in issue 10 (raises 'unscale_() has already been called'); written for this corpus
# Kind: llm. Labels: tests/lint_corpus/labels.json
import torch

scaler = torch.amp.GradScaler("cuda")
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
for step in range(max_steps):
    for micro in range(grad_accum):
        x, y = next(loader)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(x, y) / grad_accum
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
