"""Checks the 3.10 offsets table from inside a 3.10 interpreter, with ctypes: every offset the
table gives (NAME=VALUE arguments, from offsets.rs's test) must lead to the object the interpreter
itself says is there. Prints "ok" when all hold; an assertion names the first that does not."""

import ctypes
import os
import sys
import threading

assert sys.version_info[:2] == (3, 10), sys.version
OFF = {k: int(v) for k, v in (a.split("=") for a in sys.argv[1:])}

api = ctypes.pythonapi
api.PyThreadState_Get.restype = ctypes.c_void_p
api.PyInterpreterState_Get.restype = ctypes.c_void_p


def u64(a):
    return ctypes.c_uint64.from_address(a).value


def u32(a):
    return ctypes.c_uint32.from_address(a).value


def i32(a):
    return ctypes.c_int32.from_address(a).value


# The kernel reads the frame fields relative to a window that starts at frame_window.
W = OFF["frame_window"]
FRAME_BACK = W + OFF["frame_previous"]
FRAME_CODE = W + OFF["frame_code"]
FRAME_LASTI = W + OFF["frame_prev_instr"]

runtime = ctypes.addressof(ctypes.c_char.in_dll(api, "_PyRuntime"))
interp = api.PyInterpreterState_Get()
assert u64(runtime + OFF["runtime_interp_head"]) == interp, "runtime_interp_head"
assert u64(interp + OFF["interp_next"]) == 0, "interp_next"


def check_frames(tag):
    ts = api.PyThreadState_Get()
    f = sys._getframe()
    # Read here, not in a helper: inside one, the current frame would be the helper's.
    assert ctypes.c_uint64.from_address(ts + OFF["tstate_frame"]).value == id(f), "tstate_frame"
    pthread = u64(ts + OFF["tstate_thread_id"])
    assert pthread == threading.get_ident(), "tstate_thread_id"
    assert u32(pthread + OFF["pthread_tid"]) == threading.get_native_id(), "pthread_tid"
    a, n = id(f), 0
    while f is not None:
        assert u64(a + FRAME_CODE) == id(f.f_code), "frame_code"
        lasti = i32(a + FRAME_LASTI)
        if n == 0:
            # The leaf has run on by the time its f_lasti (bytes) is read from Python.
            assert 0 <= 2 * lasti < f.f_lasti < 2 * lasti + 40, ("frame_prev_instr", tag)
        else:
            assert 2 * lasti == f.f_lasti, ("frame_prev_instr", tag, lasti, f.f_lasti)
        back = u64(a + FRAME_BACK)
        assert back == (id(f.f_back) if f.f_back is not None else 0), "frame_previous"
        f, a, n = f.f_back, back, n + 1
    assert n >= 2, tag
    return ts


def gen():
    yield


# A frame that has not run its first instruction: f_lasti is -1.
g = gen()
assert i32(id(g.gi_frame) + FRAME_LASTI) == -1 and g.gi_frame.f_lasti == -1, "f_lasti -1"

main_ts = check_frames("main")
other = {"go": threading.Event()}


def worker():
    other["ts"] = check_frames("worker")
    other["go"].wait()


t = threading.Thread(target=worker)
t.start()
while "ts" not in other:
    pass
# Both thread states are on the interpreter's list.
seen, ts = [], u64(interp + OFF["interp_threads_head"])
while ts and len(seen) < 100:
    seen.append(ts)
    ts = u64(ts + OFF["tstate_next"])
assert main_ts in seen and other["ts"] in seen, "interp_threads_head / tstate_next"
other["go"].set()
t.join()


class K:
    def method(self):
        return sys._getframe().f_code


for code in [K().method(), check_frames.__code__]:
    c = id(code)
    assert i32(c + OFF["code_firstlineno"]) == code.co_firstlineno, "code_firstlineno"
    assert u64(c + OFF["code_filename"]) == id(code.co_filename), "code_filename"
    assert u64(c + OFF["code_name"]) == id(code.co_name), "code_name"
    lt = code.co_linetable
    assert u64(c + OFF["code_linetable"]) == id(lt), "code_linetable"
    assert u64(id(lt) + 16) == len(lt) and ctypes.string_at(id(lt) + 32, len(lt)) == lt, "bytes"
    s = code.co_name
    assert ctypes.string_at(id(s) + OFF["unicode_ascii_size"], len(s)).decode() == s, "ascii"
# A compact str of 2-byte characters: its data follows PyCompactUnicodeObject.
s = "".join(["na", "\u00efve\u0100"])
state = u32(id(s) + 32)
assert (state >> 2) & 7 == 2 and (state >> 5) & 1 == 1 and (state >> 6) & 1 == 0, "str state"
data = ctypes.string_at(id(s) + OFF["unicode_compact_size"], 2 * len(s))
assert data.decode("utf-16-le") == s, "unicode_compact_size"
print("ok", os.getpid())
