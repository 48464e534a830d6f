"""Two sleeps of one kind from two lines, in turn: 1 ms at short_nap's and 30 ms at
long_nap's, ROUNDS times. The kernel sees the same wait (clock_nanosleep on one clock) from
both lines; each line's share of the sleep is known."""
import sys
import time


def short_nap():
    time.sleep(0.001)


def long_nap():
    time.sleep(0.030)


def loop(rounds):
    for _ in range(rounds):
        short_nap()
        long_nap()


loop(int(sys.argv[1]) if len(sys.argv) > 1 else 40)
