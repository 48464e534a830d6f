"""Writes the 3.10 line-table fixtures next to this file: co_linetable (.bin) and co_lines()
(.lines: start end line, '-' for no line) of f and g, compiled with the interpreter running it.

    /root/.pyenv/versions/3.10.13/bin/python3 linetable_310.py
"""
import os
import sys

assert sys.version_info[:2] == (3, 10), sys.version

F = """def f(x):
    y = x + 1
    if y > 3:
        return [i for i in range(y)]
    return -y
"""

# Line deltas over 127 (split over entries covering no bytes), one line of over 254 bytes of
# bytecode (split over entries adding no line), `except ... as e` (cleanup without a line), and
# jumps back by 200 lines.
G = (
    "def g(x):\n"
    + "    t = 0\n"
    + "\n" * 300
    + "    for i in range(x):\n        t += i\n"
    + "    t = (" + " + ".join(f"x * {k}" for k in range(80)) + ")\n"
    + "    try:\n        t += 1\n    except ValueError as e:\n        x = 0\n"
    + "\n" * 200
    + "    return t\n"
)


def dump(src, name, stem):
    ns = {}
    exec(compile(src, "x.py", "exec"), ns)
    code = ns[name].__code__
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, stem + ".bin"), "wb") as out:
        out.write(code.co_linetable)
    with open(os.path.join(here, stem + ".lines"), "w") as out:
        for start, end, line in code.co_lines():
            out.write(f"{start} {end} {'-' if line is None else line}\n")


dump(F, "f", "linetable_310")
dump(G, "g", "linetable_310_long")
