"""Recurses DEPTH Python frames deep and burns CPU at the bottom for SECONDS: deeper than the
kernel walks a Python stack (64 frames)."""
import sys
import time


def bottom(seconds):
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1
    return x


def down(depth, seconds):
    if depth == 0:
        return bottom(seconds)
    return down(depth - 1, seconds) + 1


down(int(sys.argv[1]), float(sys.argv[2]))
