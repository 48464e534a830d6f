"""Known CPU split for the Python-stack tests: hot_a burns 70% and hot_b 30% of the thread CPU
time (spinning on time.thread_time(), so the split holds whatever the scheduler does), while a
third thread blocks on queue.get. Usage: py_hot.py SECONDS."""

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


def worker(fn, share, stop):
    while not stop.is_set():
        fn(SLICE * share)


def blocked(q):
    q.get()


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 4.0
    stop = threading.Event()
    q = queue.Queue()
    threads = [
        threading.Thread(target=worker, args=(hot_a, 0.7, stop), name="worker_a"),
        threading.Thread(target=worker, args=(hot_b, 0.3, stop), name="worker_b"),
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
