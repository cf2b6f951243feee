# Corpus excerpt, abridged and rewritten for this test set (not a verbatim copy).
# Source: pytorch/torchtune recipes/full_finetune_single_device.py
# Kind: llm. Labels: tests/lint_corpus/labels.json
import torch
from torchtune import training


class FullFinetuneRecipeSingleDevice:
    def train(self) -> None:
        self.optimizer.zero_grad()
        running_loss = 0
        num_tokens = 0
        for curr_epoch in range(self.epochs_run, self.total_epochs):
            for idx, batch in enumerate(self._dataloader):
                utils.batch_to_device(batch, self._device)
                current_num_tokens = (batch["labels"] != self._loss_fn.ignore_index).sum()
                num_tokens += current_num_tokens
                loss_factor = current_num_tokens if not self.optimizer_in_bwd else 1.0
                current_loss = self._loss_step(batch) * loss_factor
                running_loss += current_loss.detach()
                current_loss.backward()
                if (idx + 1) % self._gradient_accumulation_steps == 0:
                    if not self.optimizer_in_bwd:
                        training.scale_grads_(self._model.parameters(), 1.0 / num_tokens)
                        if self._clip_grad_norm:
                            torch.nn.utils.clip_grad_norm_(self._model.parameters(), float(self._clip_grad_norm))
                    self.optimizer.step()
                    self.optimizer.zero_grad(set_to_none=True)
                    running_loss = 0
                    num_tokens = 0
