# Corpus excerpt, abridged and rewritten for this test set (not a verbatim copy).
# Source: huggingface/peft examples/boft_dreambooth/train_dreambooth.py
# Kind: diffusion. Labels: tests/lint_corpus/labels.json
import torch
from accelerate import Accelerator
from peft import BOFTConfig, get_peft_model


def main(args):
    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps,
                              mixed_precision=args.mixed_precision)
    if args.use_boft:
        config = BOFTConfig(boft_block_size=args.boft_block_size, boft_block_num=args.boft_block_num,
                            target_modules=UNET_TARGET_MODULES, boft_dropout=args.boft_dropout, bias=args.boft_bias)
        unet = get_peft_model(unet, config, adapter_name=args.wandb_run_name)
    vae.requires_grad_(False)
    text_encoder.requires_grad_(False)
    weight_dtype = torch.float32
    if accelerator.mixed_precision == "fp16":
        weight_dtype = torch.float16
    elif accelerator.mixed_precision == "bf16":
        weight_dtype = torch.bfloat16
    unet.to(accelerator.device, dtype=weight_dtype)
    vae.to(accelerator.device, dtype=weight_dtype)
    text_encoder.to(accelerator.device, dtype=weight_dtype)
    params_to_optimize = [param for param in unet.parameters() if param.requires_grad]
    optimizer = torch.optim.AdamW(params_to_optimize, lr=args.learning_rate, weight_decay=args.adam_weight_decay)
    for step, batch in enumerate(train_dataloader):
        with accelerator.accumulate(unet):
            model_pred = unet(noisy_latents, timesteps, encoder_hidden_states).sample
            loss = F.mse_loss(model_pred.float(), target.float(), reduction="mean")
            accelerator.backward(loss)
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
