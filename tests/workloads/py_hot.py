"""Known CPU split for the Python-stack tests: two worker threads each alternate hot_a for 7 ms
and hot_b for 3 ms of their own CPU time (spinning on time.thread_time(), so the 70/30 split holds
whatever the scheduler and the GIL do; the two contend for the GIL), while a third thread blocks
on queue.get, a fourth reads a file whose pages it drops from the page cache first (so it waits
for the disk) and a fifth hashes in a C extension (hashlib releases the GIL while it hashes).
Usage: py_hot.py SECONDS [DEPTH] (DEPTH extra Python frames under the workers, for
benchmarks of the stack walk)."""

import hashlib
import os
import queue
import sys
import tempfile
import threading
import time

SLICE = 0.01
# time.thread_time() is a syscall (clock_gettime of the thread's CPU clock): checked at every
# step, the spin makes ~400,000 a second, a syscall storm that gputrace's overhead budget takes
# the syscall tracepoints off (and with them the futex waits' GIL words). Every 10,000 steps
# (~0.3 ms) keeps the split and makes a few thousand.
CHECK_EVERY = 10000


def hot_a(share):
    start = time.thread_time()
    x = 0
    while time.thread_time() - start < share:
        for _ in range(CHECK_EVERY):
            x += 1
    return x


def hot_b(share):
    start = time.thread_time()
    x = 0
    while time.thread_time() - start < share:
        for _ in range(CHECK_EVERY):
            x += 1
    return x


def worker(stop, depth=0):
    if depth > 0:
        return worker(stop, depth - 1)
    while not stop.is_set():
        hot_a(SLICE * 0.7)
        hot_b(SLICE * 0.3)


def blocked(q):
    q.get()


def read_cold(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        while os.read(fd, 1 << 20):
            pass
    finally:
        os.close(fd)


def reader(stop, path):
    while not stop.is_set():
        read_cold(path)
        time.sleep(0.01)


def hash_block(block):
    return hashlib.sha256(block).digest()


def hasher(stop):
    block = b"x" * (1 << 20)
    while not stop.is_set():
        hash_block(block)
        time.sleep(0.005)


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 4.0
    depth = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    stop = threading.Event()
    q = queue.Queue()
    data = tempfile.NamedTemporaryFile(prefix="py_hot_", dir="/var/tmp")
    data.write(os.urandom(4 << 20))
    data.flush()
    # Clean pages can be dropped: every read_cold then goes to the disk.
    os.fsync(data.fileno())
    threads = [
        threading.Thread(target=worker, args=(stop, depth), name="worker_1"),
        threading.Thread(target=worker, args=(stop, depth), name="worker_2"),
        threading.Thread(target=blocked, args=(q,), name="blocked"),
        threading.Thread(target=reader, args=(stop, data.name), name="reader"),
        threading.Thread(target=hasher, args=(stop,), name="hasher"),
    ]
    for t in threads:
        t.start()
    print("ready", flush=True)
    time.sleep(seconds)
    stop.set()
    q.put(None)
    for t in threads:
        t.join()
    data.close()


if __name__ == "__main__":
    main()
