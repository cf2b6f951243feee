# Corpus excerpt, abridged and rewritten for this test set (not a verbatim copy).
# Source: tysam-code/hlb-CIFAR10 main.py (make_net / main)
# Kind: vision. Labels: tests/lint_corpus/labels.json
import torch
from torch import nn

hyp = {'misc': {'device': 'cuda'}, 'opt': {'bias_lr': 1.525 * 64, 'non_bias_lr': 1.525 / 512}}


def make_net():
    network_dict = nn.ModuleDict({'initial_block': nn.Sequential(nn.Conv2d(3, 64, 3, padding='same'))})
    net = SpeedyConvNet(network_dict)
    net = net.to(hyp['misc']['device'])
    net = net.to(memory_format=torch.channels_last)
    net.train()
    net.half()
    for module in net.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.float()
    return net


def main():
    net = make_net()
    non_bias_params = [p for name, p in net.named_parameters() if 'bias' not in name]
    bias_params = [p for name, p in net.named_parameters() if 'bias' in name]
    opt = torch.optim.SGD(non_bias_params, lr=hyp['opt']['non_bias_lr'], momentum=0.85, nesterov=True)
    opt_bias = torch.optim.SGD(bias_params, lr=hyp['opt']['bias_lr'], momentum=0.85, nesterov=True)
    for epoch in range(10):
        for inputs, targets in get_batches(data, key='train', batchsize=1024):
            outputs = net(inputs)
            loss = loss_fn(outputs, targets).sum()
            loss.backward()
            opt.step()
            opt_bias.step()
            opt.zero_grad(set_to_none=True)
            opt_bias.zero_grad(set_to_none=True)
