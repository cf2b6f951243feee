"""A preload module for tests/test_zygote.py: its import blocks until the file named by
AMP_TEST_GATE exists (at most 60 s), so a test can see what a zygote serves while it imports."""
import os
import time

_gate = os.environ.get("AMP_TEST_GATE")
_deadline = time.monotonic() + 60
while _gate and not os.path.exists(_gate) and time.monotonic() < _deadline:
    time.sleep(0.02)
