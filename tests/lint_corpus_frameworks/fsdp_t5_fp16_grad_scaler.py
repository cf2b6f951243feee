# FSDP1 with the fp16 policy of pytorch/examples distributed/FSDP and a plain GradScaler in the loop
# Source: written for this corpus after pytorch/examples distributed/FSDP/T5_training.py and policies/mixed_precision.py (BSD-3-Clause)
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import MixedPrecision
from transformers import T5ForConditionalGeneration

fpSixteen = MixedPrecision(
    param_dtype=torch.float16,
    reduce_dtype=torch.float16,
    buffer_dtype=torch.float16,
)


def fsdp_main():
    local_rank = int(os.environ["LOCAL_RANK"])
    dist.init_process_group("nccl")
    torch.cuda.set_device(local_rank)
    model = T5ForConditionalGeneration.from_pretrained("t5-base")
    model = FSDP(model, mixed_precision=fpSixteen, device_id=torch.cuda.current_device())
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-4)
    scaler = torch.cuda.amp.GradScaler()
    for batch in []:
        output = model(**batch)
        scaler.scale(output["loss"]).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()


if __name__ == "__main__":
    fsdp_main()
