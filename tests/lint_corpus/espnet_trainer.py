# Corpus excerpt, abridged and rewritten for this test set (not a verbatim copy).
# Source: espnet/espnet espnet2/train/trainer.py
# Kind: speech. Labels: tests/lint_corpus/labels.json
import torch
from packaging.version import parse as V

if V(torch.__version__) >= V("1.6.0"):
    from torch.cuda.amp import GradScaler, autocast
else:
    from contextlib import contextmanager

    @contextmanager
    def autocast(enabled=True):
        yield

    GradScaler = None


class Trainer:
    @classmethod
    def run(cls, model, optimizers, schedulers, train_iter_factory, reporter, scaler, output_dir, trainer_options):
        if trainer_options.use_amp:
            scaler = GradScaler()
        for iepoch in range(start_epoch, trainer_options.max_epoch + 1):
            all_steps_are_invalid = cls.train_one_epoch(model=model, optimizers=optimizers, schedulers=schedulers,
                                                        iterator=train_iter_factory.build_iter(iepoch),
                                                        reporter=sub_reporter, scaler=scaler, options=trainer_options)
            torch.save(
                {
                    "model": model.state_dict(),
                    "reporter": reporter.state_dict(),
                    "optimizers": [o.state_dict() for o in optimizers],
                    "schedulers": [s.state_dict() if s is not None else None for s in schedulers],
                    "scaler": scaler.state_dict() if scaler is not None else None,
                },
                output_dir / "checkpoint.pth",
            )

    @classmethod
    def train_one_epoch(cls, model, iterator, optimizers, schedulers, scaler, reporter, options):
        accum_grad = options.accum_grad
        grad_clip = options.grad_clip
        for iiter, (utt_id, batch) in enumerate(reporter.measure_iter_time(iterator, "iter_time"), 1):
            with autocast(scaler is not None):
                retval = model(**batch)
                loss, stats, weight = retval
            loss = loss / accum_grad
            if scaler is not None:
                scaler.scale(loss).backward()
            else:
                loss.backward()
            if iiter % accum_grad == 0:
                if scaler is not None:
                    for iopt, optimizer in enumerate(optimizers):
                        scaler.unscale_(optimizer)
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=grad_clip)
                if not torch.isfinite(grad_norm):
                    if scaler is not None:
                        for iopt, optimizer in enumerate(optimizers):
                            scaler.step(optimizer)
                            scaler.update()
                else:
                    all_steps_are_invalid = False
                    for iopt, (optimizer, scheduler) in enumerate(zip(optimizers, schedulers)):
                        if scaler is not None:
                            scaler.step(optimizer)
                            scaler.update()
                        else:
                            optimizer.step()
                for iopt, optimizer in enumerate(optimizers):
                    optimizer.zero_grad()
        return all_steps_are_invalid
