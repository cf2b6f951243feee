# Corpus excerpt, abridged and rewritten for this test set (not a verbatim copy).
# Source: pytorch/examples distributed/minGPT-ddp/mingpt/trainer.py
# Kind: llm. Labels: tests/lint_corpus/labels.json
from dataclasses import asdict, dataclass
from typing import Any, Dict
import torch


@dataclass
class Snapshot:
    model_state: "OrderedDict[str, torch.Tensor]"
    optimizer_state: Dict[str, Any]
    finished_epoch: int


class Trainer:
    def __init__(self, trainer_config, model, optimizer, train_dataset, test_dataset=None):
        self.config = trainer_config
        self.model = model.to(self.local_rank)
        self.optimizer = optimizer
        if self.config.use_amp:
            self.scaler = torch.amp.GradScaler(self.device_type)

    def _run_batch(self, source, targets, train: bool = True) -> float:
        with torch.set_grad_enabled(train), torch.amp.autocast(device_type=self.device_type, dtype=torch.float16,
                                                               enabled=(self.config.use_amp)):
            _, loss = self.model(source, targets)
        if train:
            self.optimizer.zero_grad(set_to_none=True)
            if self.config.use_amp:
                self.scaler.scale(loss).backward()
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_norm_clip)
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_norm_clip)
                self.optimizer.step()
        return loss.item()

    def _save_snapshot(self, epoch):
        raw_model = self.model.module if hasattr(self.model, "module") else self.model
        snapshot = Snapshot(model_state=raw_model.state_dict(), optimizer_state=self.optimizer.state_dict(),
                            finished_epoch=epoch)
        snapshot = asdict(snapshot)
        torch.save(snapshot, self.config.snapshot_path)
