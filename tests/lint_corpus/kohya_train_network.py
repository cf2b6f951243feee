# Corpus excerpt, abridged and rewritten for this test set (not a verbatim copy).
# Source: kohya-ss/sd-scripts train_network.py
# Kind: diffusion. Labels: tests/lint_corpus/labels.json
import torch


class NetworkTrainer:
    def train(self, args):
        weight_dtype, save_dtype = train_util.prepare_dtype(args)
        vae_dtype = torch.float32 if args.no_half_vae else weight_dtype
        text_encoder, vae, unet, _ = self.load_target_model(args, weight_dtype, accelerator)
        unet.requires_grad_(False)
        unet.to(dtype=weight_dtype)
        for t_enc in text_encoders:
            t_enc.requires_grad_(False)
        network = network_module.create_network(1.0, args.network_dim, args.network_alpha, vae, text_encoder, unet)
        network.apply_to(text_encoder, unet, train_text_encoder, train_unet)
        trainable_params = network.prepare_optimizer_params(args.text_encoder_lr, args.unet_lr, args.learning_rate)
        optimizer_name, optimizer_args, optimizer = train_util.get_optimizer(args, trainable_params)
        for step, batch in enumerate(train_dataloader):
            with accelerator.accumulate(training_model):
                with accelerator.autocast():
                    noise_pred = self.call_unet(args, accelerator, unet, noisy_latents, timesteps, text_encoder_conds, batch, weight_dtype)
                loss = torch.nn.functional.mse_loss(noise_pred.float(), target.float(), reduction="none")
                loss = loss.mean()
                accelerator.backward(loss)
                if accelerator.sync_gradients and args.max_grad_norm != 0.0:
                    params_to_clip = accelerator.unwrap_model(network).get_trainable_params()
                    accelerator.clip_grad_norm_(params_to_clip, args.max_grad_norm)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad(set_to_none=True)
