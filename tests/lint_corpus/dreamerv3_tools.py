# Corpus excerpt, abridged and rewritten for this test set (not a verbatim copy).
# Source: NM512/dreamerv3-torch tools.py + models.py
# Kind: rl. Labels: tests/lint_corpus/labels.json
import torch
from torch import nn


class Optimizer:
    def __init__(self, name, parameters, lr, eps=1e-4, clip=None, wd=None, wd_pattern=r".*", opt="adam", use_amp=False):
        self._name = name
        self._parameters = parameters
        self._clip = clip
        self._wd = wd
        self._opt = {"adam": lambda: torch.optim.Adam(parameters, lr=lr, eps=eps)}[opt]()
        self._scaler = torch.cuda.amp.GradScaler(enabled=use_amp)

    def __call__(self, loss, params, retain_graph=True):
        assert len(loss.shape) == 0, loss.shape
        metrics = {}
        metrics[f"{self._name}_loss"] = loss.detach().cpu().numpy()
        self._opt.zero_grad()
        self._scaler.scale(loss).backward(retain_graph=retain_graph)
        self._scaler.unscale_(self._opt)
        norm = torch.nn.utils.clip_grad_norm_(params, self._clip)
        if self._wd:
            self._apply_weight_decay(params)
        self._scaler.step(self._opt)
        self._scaler.update()
        self._opt.zero_grad()
        metrics[f"{self._name}_grad_norm"] = to_np(norm)
        return metrics


class WorldModel(nn.Module):
    def _train(self, data):
        with tools.RequiresGrad(self):
            with torch.cuda.amp.autocast(self._use_amp):
                embed = self.encoder(data)
                post, prior = self.dynamics.observe(embed, data["action"], data["is_first"])
                model_loss = sum(scaled.values()) + kl_loss
            metrics = self._model_opt(torch.mean(model_loss), self.parameters())
        return post, context, metrics
