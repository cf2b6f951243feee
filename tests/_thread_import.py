"""A preload module for tests/test_zygote.py that starts a Python thread, after which a zygote
must not fork."""
import threading
import time

threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
