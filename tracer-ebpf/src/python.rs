//! CPython frame walk, called by the CPU sampler for threads of processes user space found to
//! run a supported CPython. User space keeps `PY_TSTATE` (tid -> `PyThreadState *`) and
//! `PY_PROCS` (tgid -> offsets) current; this side only follows pointers, bounded.

use aya_ebpf::{
    cty::c_void,
    helpers::{bpf_loop, bpf_probe_read_user, bpf_probe_read_user_buf},
    macros::map,
    maps::{HashMap, PerCpuArray},
    Global,
};
use tracer_common::python::{
    PyFrame, PyOffsets, PySeed, PyStack, PyStat, GIL_LAST_HOLDER, GIL_LOCKED, GIL_SIZE,
    PY_FRAME_ENTRY, PY_FRAME_WINDOW, PY_MAX_FRAMES, PY_NOT_ENTRIES, PY_NO_OFFSET, PY_OFF_LASTI,
    PY_PROCS_ENTRIES, PY_SEED_ENTRIES, PY_STACKS_ENTRIES, PY_STACK_PENDING, PY_STACK_TRUNCATED,
    PY_TSTATE_ENTRIES,
};
use tracer_common::wall::GIL_HOLDER_UNKNOWN;

#[map(name = "PY_TSTATE")]
static PY_TSTATE: HashMap<u32, u64> = HashMap::with_max_entries(PY_TSTATE_ENTRIES, 0);

#[map(name = "PY_PROCS")]
static PY_PROCS: HashMap<u32, PyOffsets> = HashMap::with_max_entries(PY_PROCS_ENTRIES, 0);

#[map(name = "PY_STACKS")]
static PY_STACKS: HashMap<u64, PyStack> = HashMap::with_max_entries(PY_STACKS_ENTRIES, 0);

/// The stack is built here (1 KiB, far over the 512-byte BPF stack), then copied into PY_STACKS.
#[map(name = "PY_SCRATCH")]
static PY_SCRATCH: PerCpuArray<PyStack> = PerCpuArray::with_max_entries(1, 0);

/// The bytes of the frame being walked that hold its fields: one read per frame instead of one
/// per field.
#[map(name = "PY_WINDOW")]
static PY_WINDOW: PerCpuArray<[u64; WINDOW_WORDS]> = PerCpuArray::with_max_entries(1, 0);

#[map(name = "PY_NOT")]
static PY_NOT: HashMap<u32, u8> = HashMap::with_max_entries(PY_NOT_ENTRIES, 0);

/// 0 with `--python off`.
#[no_mangle]
static PY_ENABLED: Global<u32> = Global::new(1);

#[map(name = "PY_SEED")]
static PY_SEED: HashMap<u32, PySeed> = HashMap::with_max_entries(PY_SEED_ENTRIES, 0);

#[map(name = "PY_STATS")]
static PY_STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(PyStat::COUNT, 0);

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
const EEXIST: i32 = 17;
/// Mixed into the hash where a shim frame was skipped (it changes which frames are entries).
const SHIM_MARK: u64 = 0x5;
/// The window buffer is larger than what is read (16 words, a power of two) so that masking the
/// word index proves the access in bounds to the verifier.
const WINDOW_WORDS: usize = 16;
const _: () = assert!(PY_FRAME_WINDOW <= WINDOW_WORDS * 8);
const PY_MAX_STEPS: u32 = PY_MAX_FRAMES as u32 + 16;

#[inline(always)]
fn stat(s: PyStat) {
    if let Some(slot) = PY_STATS.get_ptr_mut(s as u32) {
        // Per-CPU slot, and perf_event programs do not nest on one CPU.
        unsafe { *slot += 1 };
    }
}

/// The pointer-sized field at byte `off` of the frame window (offsets are 8-aligned).
#[inline(always)]
fn word(win: &[u64; WINDOW_WORDS], off: u32) -> Result<u64, PyStat> {
    if off as usize + 8 > PY_FRAME_WINDOW {
        return Err(PyStat::ReadFailed);
    }
    Ok(win[(off / 8) as usize & (WINDOW_WORDS - 1)])
}

#[inline(always)]
fn byte(win: &[u64; WINDOW_WORDS], off: u32) -> Result<u8, PyStat> {
    if off as usize >= PY_FRAME_WINDOW {
        return Err(PyStat::ReadFailed);
    }
    Ok((win[(off / 8) as usize & (WINDOW_WORDS - 1)] >> ((off % 8) * 8)) as u8)
}

#[inline(always)]
fn read_u64(addr: u64) -> Option<u64> {
    unsafe { bpf_probe_read_user(addr as *const u64) }.ok()
}

/// The key of the current thread's Python stack in `PY_STACKS`; [`PY_STACK_PENDING`] for a thread
/// of a Python process whose thread state user space has not found yet; else 0 (not Python,
/// nothing recorded). Never fails the sample: the native stack is kept either way.
#[inline(always)]
pub fn python_stack(tgid: u32, tid: u32) -> u64 {
    if PY_ENABLED.load() == 0 {
        return 0;
    }
    // Not-Python first: one lookup for the native processes that make CUDA calls at high
    // rates; a Python process pays the miss, next to a walk that costs microseconds.
    if unsafe { PY_NOT.get(&tgid) }.is_some() {
        return 0;
    }
    gputrace_python_walk(tgid, tid)
}

/// [`python_stack`] of a process that may be Python (a global function: `crate`'s docs).
#[no_mangle]
#[inline(never)]
pub extern "C" fn gputrace_python_walk(tgid: u32, tid: u32) -> u64 {
    let off = match unsafe { PY_PROCS.get(&tgid) } {
        Some(o) => *o,
        // Not classified yet (just started or just exec'd).
        None => return PY_STACK_PENDING,
    };
    let tstate = match unsafe { PY_TSTATE.get(&tid) } {
        Some(t) => *t,
        None => {
            stat(PyStat::NoThreadState);
            return PY_STACK_PENDING;
        }
    };
    match walk(&off, tgid, tstate) {
        Ok(key) => key,
        Err(s) => {
            stat(s);
            0
        }
    }
}

/// After an exec the process may be a Python it was not before: unclassified again.
#[inline(always)]
pub fn exec(tgid: u32) {
    let _ = PY_NOT.remove(&tgid);
}

/// The stack user space walked for `tid`'s wait that began at `off_ns`, or still pending.
#[inline(always)]
pub fn seeded_stack(tid: u32, off_ns: u64) -> u64 {
    match unsafe { PY_SEED.get(&tid) } {
        Some(s) if s.off_ns == off_ns => s.key,
        _ => PY_STACK_PENDING,
    }
}

/// When the futex word `addr` lies in `tgid`'s GIL, the thread waiting on it waits for the GIL:
/// returns who holds it now (`PyThreadState *`, or [`GIL_HOLDER_UNKNOWN`] when it is free at this
/// instant, a race with its release); 0 for any other futex.
#[inline(always)]
pub fn gil_holder(tgid: u32, addr: u64) -> u64 {
    let gil = match unsafe { PY_PROCS.get(&tgid) } {
        Some(o) => o.gil,
        None => return 0,
    };
    if gil == 0 || addr < gil || addr >= gil + GIL_SIZE {
        return 0;
    }
    let locked: u32 = unsafe { bpf_probe_read_user((gil + GIL_LOCKED) as *const u32) }.unwrap_or(0);
    let holder = read_u64(gil + GIL_LAST_HOLDER).unwrap_or(0);
    if locked != 0 && holder != 0 {
        holder
    } else {
        GIL_HOLDER_UNKNOWN
    }
}

/// State of one walk, shared with the `bpf_loop` callback (one callback verified once, instead of
/// an unrolled loop whose branches the verifier would explore per iteration).
#[repr(C)]
struct Walk {
    off: PyOffsets,
    frame: u64,
    hash: u64,
    n: u64,
    /// 0 while walking; otherwise the [`PyStat`] that ended it.
    err: u64,
}

const WALK_OK: u64 = u64::MAX;

#[inline(always)]
fn walk(off: &PyOffsets, tgid: u32, tstate: u64) -> Result<u64, PyStat> {
    let mut frame =
        read_u64(tstate.wrapping_add(off.tstate_frame as u64)).ok_or(PyStat::ReadFailed)?;
    if off.cframe_current != PY_NO_OFFSET && frame != 0 {
        frame =
            read_u64(frame.wrapping_add(off.cframe_current as u64)).ok_or(PyStat::ReadFailed)?;
    }
    let mut w = Walk {
        off: *off,
        frame,
        hash: (FNV_OFFSET ^ tgid as u64).wrapping_mul(FNV_PRIME),
        n: 0,
        err: WALK_OK,
    };
    // Shim frames (3.12+) are walked but not recorded, so allow a few more steps than frames.
    unsafe {
        bpf_loop(
            PY_MAX_STEPS,
            step as *mut c_void,
            (&mut w as *mut Walk).cast(),
            0,
        )
    };
    if w.err != WALK_OK {
        return Err(match w.err {
            x if x == PyStat::StacksFull as u64 => PyStat::StacksFull,
            _ => PyStat::ReadFailed,
        });
    }
    if w.n == 0 {
        return Err(PyStat::NoFrames);
    }
    let st = match PY_SCRATCH.get_ptr_mut(0) {
        Some(p) => unsafe { &mut *p },
        None => return Err(PyStat::StacksFull),
    };
    let mut hash = w.hash;
    st.len = w.n as u32;
    st.pid = tgid;
    st.status = 0;
    if w.frame != 0 {
        st.status = PY_STACK_TRUNCATED;
        stat(PyStat::Truncated);
        hash = (hash ^ 1).wrapping_mul(FNV_PRIME);
    }
    if hash == 0 || hash == PY_STACK_PENDING {
        hash |= 0x100;
    }
    // BPF_NOEXIST: an existing entry with this key already holds this stack.
    match PY_STACKS.insert(&hash, st, 1) {
        Ok(()) => {}
        Err(e) if e == -EEXIST => {}
        Err(_) => return Err(PyStat::StacksFull),
    }
    stat(PyStat::Walked);
    Ok(hash)
}

/// One frame of the walk; returns 1 to stop.
extern "C" fn step(_index: u64, ctx: *mut c_void) -> i64 {
    let w = unsafe { &mut *(ctx as *mut Walk) };
    match step_inner(w) {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(s) => {
            w.err = s as u64;
            1
        }
    }
}

#[inline(always)]
fn step_inner(w: &mut Walk) -> Result<bool, PyStat> {
    let frame = w.frame;
    if frame == 0 {
        return Ok(false);
    }
    let n = w.n as usize;
    if n >= PY_MAX_FRAMES {
        return Ok(false);
    }
    let st = match PY_SCRATCH.get_ptr_mut(0) {
        Some(p) => unsafe { &mut *p },
        None => return Err(PyStat::StacksFull),
    };
    let win = match PY_WINDOW.get_ptr_mut(0) {
        Some(p) => unsafe { &mut *p },
        None => return Err(PyStat::StacksFull),
    };
    unsafe {
        bpf_probe_read_user_buf(
            frame.wrapping_add(w.off.frame_window as u64) as *const u8,
            core::slice::from_raw_parts_mut(win.as_mut_ptr().cast::<u8>(), PY_FRAME_WINDOW),
        )
    }
    .map_err(|_| PyStat::ReadFailed)?;
    let off = &w.off;
    let code = word(win, off.frame_code)?;
    let prev = word(win, off.frame_previous)?;
    if off.frame_owner != PY_NO_OFFSET {
        let owner = byte(win, off.frame_owner)?;
        if owner as u32 == off.owner_cstack {
            // The frame recorded just before (its callee) starts an activation.
            if n > 0 {
                st.frames[n - 1].flags |= PY_FRAME_ENTRY;
            }
            w.hash = (w.hash ^ SHIM_MARK).wrapping_mul(FNV_PRIME);
            w.frame = prev;
            return Ok(true);
        }
    }
    let instr = word(win, off.frame_prev_instr)?;
    let (instr_off, mut flags) = if off.flags & PY_OFF_LASTI == 0 {
        (instr.wrapping_sub(code) as u32, 0)
    } else {
        // `f_lasti` is the low half of the word. Each 3.10 frame has its own eval activation.
        ((instr as u32).wrapping_mul(2), PY_FRAME_ENTRY)
    };
    if off.frame_is_entry != PY_NO_OFFSET && byte(win, off.frame_is_entry)? != 0 {
        flags = PY_FRAME_ENTRY;
    }
    st.frames[n] = PyFrame {
        code,
        instr_off,
        flags,
    };
    w.hash = (w.hash ^ code).wrapping_mul(FNV_PRIME);
    w.hash = (w.hash ^ (((instr_off as u64) << 1) | flags as u64)).wrapping_mul(FNV_PRIME);
    w.frame = prev;
    w.n += 1;
    Ok(true)
}
