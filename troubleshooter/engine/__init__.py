"""Diagnostics that run models on the host: capability, alignment, skip rate, NaN hunt, headroom,
speedup. Every function takes a `Workload` and a device, and works on CPU as well as CUDA."""
