"""Known CPU split for the Python-stack tests: two worker threads each alternate hot_a for 7 ms
and hot_b for 3 ms of their own CPU time (spinning on time.thread_time(), so the 70/30 split holds
whatever the scheduler and the GIL do), while a third thread blocks on queue.get.
Usage: py_hot.py SECONDS [DEPTH] (DEPTH extra Python frames under the workers, for
benchmarks of the stack walk)."""

import queue
import sys
import threading
import time

SLICE = 0.01


def hot_a(share):
    start = time.thread_time()
    x = 0
    while time.thread_time() - start < share:
        x += 1
    return x


def hot_b(share):
    start = time.thread_time()
    x = 0
    while time.thread_time() - start < share:
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


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 4.0
    depth = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    stop = threading.Event()
    q = queue.Queue()
    threads = [
        threading.Thread(target=worker, args=(stop, depth), name="worker_1"),
        threading.Thread(target=worker, args=(stop, depth), name="worker_2"),
        threading.Thread(target=blocked, args=(q,), name="blocked"),
    ]
    for t in threads:
        t.start()
    print("ready", flush=True)
    time.sleep(seconds)
    stop.set()
    q.put(None)
    for t in threads:
        t.join()


if __name__ == "__main__":
    main()
