# A DeepSpeed script whose config dict turns on fp16 and bf16 together (as when a bf16 block is pasted into an fp16 config)
# Source: written for this corpus after microsoft/DeepSpeedExamples training/cifar/cifar10_deepspeed.py (Apache-2.0)
import deepspeed
import torch

ds_config = {
    "train_batch_size": 16,
    "steps_per_print": 2000,
    "optimizer": {"type": "Adam", "params": {"lr": 0.001, "betas": [0.8, 0.999], "eps": 1e-8, "weight_decay": 3e-7}},
    "gradient_clipping": 1.0,
    "bf16": {"enabled": True},
    "fp16": {"enabled": True, "fp16_master_weights_and_grads": False, "loss_scale": 0, "loss_scale_window": 500,
             "hysteresis": 2, "min_loss_scale": 1, "initial_scale_power": 15},
    "zero_optimization": {"stage": 1},
}
net = torch.nn.Linear(32, 10)
model_engine, optimizer, trainloader, __ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=ds_config)
for data in []:
    loss = model_engine(data).sum()
    model_engine.backward(loss)
    model_engine.step()
