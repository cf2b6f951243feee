# Corpus excerpt, abridged and rewritten for this test set (not a verbatim copy).
# Source: pattern in issue 10 (a per-batch weight named `loss_scale` is not manual loss scaling); written for this corpus
# Kind: rl. Labels: tests/lint_corpus/labels.json
import torch


def update(policy, optimizer, scaler, batch):
    with torch.autocast("cuda", dtype=torch.float16):
        logp = policy.log_prob(batch["obs"], batch["act"])
        loss = -(logp * batch["adv"]).mean()
    loss_scale = batch["weight"].mean()
    optimizer.zero_grad()
    scaler.scale(loss * loss_scale).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(policy.parameters(), 0.5)
    scaler.step(optimizer)
    scaler.update()


def main():
    policy = Policy().cuda()
    optimizer = torch.optim.Adam(policy.parameters(), lr=3e-4)
    scaler = torch.amp.GradScaler("cuda")
    for it in range(1000):
        update(policy, optimizer, scaler, rollout(policy))
