# Corpus excerpt, abridged and rewritten for this test set (not a verbatim copy).
# Source: pattern in issue 10 (training state as a dataclass saved through `asdict`); written for this corpus
# Kind: llm. Labels: tests/lint_corpus/labels.json
from dataclasses import asdict, dataclass
import torch


@dataclass
class TrainState:
    step: int
    model: dict
    optimizer: dict


def train(model, loader, cfg):
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    scaler = torch.amp.GradScaler("cuda")
    for step, batch in enumerate(loader):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(**batch).loss
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        if step % cfg.save_every == 0:
            state = TrainState(step=step, model=model.state_dict(), optimizer=optimizer.state_dict())
            torch.save(asdict(state), cfg.out / "state.pt")
