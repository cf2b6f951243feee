"""A preload module for tests/test_zygote.py: makes the zygote's `torch` one whose CUDA reads as
initialized (a stand-in: this machine has no GPU), after which a zygote must not fork."""
import sys
import types

sys.modules["torch"] = types.SimpleNamespace(cuda=types.SimpleNamespace(is_initialized=lambda: True))
