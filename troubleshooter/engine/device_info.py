"""What a measurement ran on, described once for every report (check, speedup, the app header).

A report that says "x86_64" tells a user nothing; the CPU model and its bf16/fp16 instruction
flags, or the GPU's name, compute capability and tensor-core dtypes, tell them whether the
numbers apply to the machine they will train on.
"""
from __future__ import annotations

from typing import Any

import torch

from .. import hardware
from . import cpu_features


def describe_device(device: torch.device) -> dict[str, Any]:
    """What was measured on, in the words the report and the verdict need."""
    info: dict[str, Any] = {"type": device.type, "index": device.index, "torch": str(torch.__version__)}  # a plain str: TorchVersion pickles as torch
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        cc = torch.cuda.get_device_capability(index)
        arch = hardware.architecture_for(cc)
        name = torch.cuda.get_device_name(index)
        memory = torch.cuda.get_device_properties(index).total_memory
        info.update(
            index=index, name=name, compute_capability=f"{cc[0]}.{cc[1]}", capability=f"{cc[0]}.{cc[1]}",
            architecture=arch.name, tensor_cores=arch.fp16_tensor_cores, bf16_native=arch.bf16, tf32=arch.tf32,
            memory_bytes=memory, memory_gb=round(memory / 2**30, 1), cuda=torch.version.cuda,
            cpu_numbers=False, note=None,
        )
        info["summary"] = (f"{name} · sm_{cc[0]}{cc[1]} ({arch.name}) · bf16 {'✓' if arch.bf16 else '✗'} "
                           f"fp16 tensor cores {'✓' if arch.fp16_tensor_cores else '✗'} tf32 {'✓' if arch.tf32 else '✗'}")
        return info
    cpu = cpu_features.cpu_features()
    name, flags = cpu.get("model") or cpu.get("machine") or "unknown CPU", cpu["flags"]
    bf16 = any(flags.get(f) for f in cpu_features.BF16_FLAGS)
    fp16 = any(flags.get(f) for f in cpu_features.FP16_FLAGS)
    cap = cpu_features.torch_cpu_capability()
    info.update(
        name=name, cpu_features=flags, cpu_capability=cap, threads=torch.get_num_threads(),
        tensor_cores=False, bf16_native=bf16, fp16_native=fp16, tf32=False, cpu_numbers=True,
        note=("CPU numbers: they say how AMP behaves on this CPU, not on a GPU. "
              f"bf16 instructions {'present' if bf16 else 'absent'}, fp16 instructions "
              f"{'present' if fp16 else 'absent'}."),
    )
    if device.type == "mps":
        info.update(name="Apple GPU (MPS)", cpu_numbers=False, cpu_features=None, bf16_native=None,
                    fp16_native=True, note="MPS numbers: an Apple GPU through Metal",
                    summary=f"Apple GPU (MPS) · torch {torch.__version__}")
        return info
    shown = " ".join(f"{k} {'✓' if v else ('?' if v is None else '✗')}" for k, v in flags.items())
    info["summary"] = f"CPU (no GPU) · {name} · {torch.get_num_threads()} threads · {shown}"
    return info
