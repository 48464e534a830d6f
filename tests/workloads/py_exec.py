"""Burns 1 s of CPU in before_exec(), then execs INTERPRETER py_hot.py SECONDS: a process whose
interpreter changes mid-trace. Usage: py_exec.py INTERPRETER SECONDS."""

import os
import sys
import time


def before_exec():
    start = time.thread_time()
    while time.thread_time() - start < 1.0:
        pass


before_exec()
hot = os.path.join(os.path.dirname(os.path.abspath(__file__)), "py_hot.py")
os.execv(sys.argv[1], [sys.argv[1], hot, sys.argv[2]])
