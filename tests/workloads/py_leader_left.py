"""A process whose main thread leaves (pthread_exit) while another thread spins on: its leader
is a zombie whose /proc entry has no memory, the rest of the process runs.
Usage: py_leader_left.py SECONDS"""

import ctypes
import sys
import threading
import time


def spin(seconds):
    end = time.monotonic() + seconds
    x = 0
    while time.monotonic() < end:
        for _ in range(10000):
            x += 1
    return x


threading.Thread(target=spin, args=(float(sys.argv[1]),)).start()
print("ready", flush=True)
# ctypes lets the GIL go for the call; the thread runs on without the leader.
ctypes.CDLL(None).pthread_exit(None)
