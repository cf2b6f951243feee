# Corpus excerpt, abridged and rewritten for this test set (not a verbatim copy).
# Source: huggingface/diffusers examples/dreambooth/train_dreambooth_lora.py (older revision)
# Kind: diffusion. Labels: tests/lint_corpus/labels.json
import itertools
import torch
from accelerate import Accelerator


def main(args):
    accelerator = Accelerator(mixed_precision=args.mixed_precision)
    vae.requires_grad_(False)
    text_encoder.requires_grad_(False)
    unet.requires_grad_(False)
    weight_dtype = torch.float32
    if accelerator.mixed_precision == "fp16":
        weight_dtype = torch.float16
    elif accelerator.mixed_precision == "bf16":
        weight_dtype = torch.bfloat16
    unet.to(accelerator.device, dtype=weight_dtype)
    vae.to(accelerator.device, dtype=torch.float32)
    text_encoder.to(accelerator.device, dtype=weight_dtype)
    unet_lora_parameters = []
    for attn_processor_name, attn_processor in unet.attn_processors.items():
        attn_module = unet
        for n in attn_processor_name.split(".")[:-1]:
            attn_module = getattr(attn_module, n)
        attn_module.to_q.set_lora_layer(LoRALinearLayer(attn_module.to_q.in_features, attn_module.to_q.out_features, rank=args.rank))
        unet_lora_parameters.extend(attn_module.to_q.lora_layer.parameters())
    params_to_optimize = itertools.chain(unet_lora_parameters, text_lora_parameters) if args.train_text_encoder else unet_lora_parameters
    optimizer = torch.optim.AdamW(params_to_optimize, lr=args.learning_rate, betas=(args.adam_beta1, args.adam_beta2))
    for step, batch in enumerate(train_dataloader):
        with accelerator.accumulate(unet):
            model_pred = unet(noisy_model_input, timesteps, encoder_hidden_states).sample
            loss = F.mse_loss(model_pred.float(), target.float(), reduction="mean")
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(params_to_optimize, args.max_grad_norm)
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
