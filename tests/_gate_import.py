"""A preload module for tests/test_zygote.py: its import blocks until the file named by
AMP_TEST_GATE exists (at most 60 s), so a test can see what a zygote serves while it imports."""
import os
import time

_deadline = time.monotonic() + 60
while not os.path.exists(os.environ.get("AMP_TEST_GATE", "")) and time.monotonic() < _deadline:
    time.sleep(0.02)
