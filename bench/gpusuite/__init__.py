"""bench/gpu_suite.py's parts: the runner (guarded steps, partial writes, time limit), the
environment and wheels, the sizes per mode, one module per group of sections, the Markdown."""
