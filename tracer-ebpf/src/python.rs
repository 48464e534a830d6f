//! CPython frame walk, called by the CPU sampler for threads of processes user space found to
//! run a supported CPython. User space keeps `PY_TSTATE` (tid -> `PyThreadState *`) and
//! `PY_PROCS` (tgid -> offsets) current; this side only follows pointers, bounded.

use aya_ebpf::{
    helpers::bpf_probe_read_user,
    macros::map,
    maps::{HashMap, PerCpuArray},
};
use tracer_common::python::{
    PyFrame, PyOffsets, PyStack, PyStat, PY_FRAME_ENTRY, PY_MAX_FRAMES, PY_NO_OFFSET,
    PY_PROCS_ENTRIES, PY_STACKS_ENTRIES, PY_STACK_TRUNCATED, PY_TSTATE_ENTRIES,
};

#[map(name = "PY_TSTATE")]
static PY_TSTATE: HashMap<u32, u64> = HashMap::with_max_entries(PY_TSTATE_ENTRIES, 0);

#[map(name = "PY_PROCS")]
static PY_PROCS: HashMap<u32, PyOffsets> = HashMap::with_max_entries(PY_PROCS_ENTRIES, 0);

#[map(name = "PY_STACKS")]
static PY_STACKS: HashMap<u64, PyStack> = HashMap::with_max_entries(PY_STACKS_ENTRIES, 0);

/// The stack is built here (1 KiB, far over the 512-byte BPF stack), then copied into PY_STACKS.
#[map(name = "PY_SCRATCH")]
static PY_SCRATCH: PerCpuArray<PyStack> = PerCpuArray::with_max_entries(1, 0);

#[map(name = "PY_STATS")]
static PY_STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(PyStat::COUNT, 0);

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
const EEXIST: i32 = 17;

#[inline(always)]
fn stat(s: PyStat) {
    if let Some(slot) = PY_STATS.get_ptr_mut(s as u32) {
        // Per-CPU slot, and perf_event programs do not nest on one CPU.
        unsafe { *slot += 1 };
    }
}

#[inline(always)]
fn read_u64(addr: u64) -> Option<u64> {
    unsafe { bpf_probe_read_user(addr as *const u64) }.ok()
}

/// The key of the current thread's Python stack in `PY_STACKS`, or 0 (not Python, no thread
/// state, nothing recorded). Never fails the sample: the native stack is kept either way.
#[inline(always)]
pub fn python_stack(tgid: u32, tid: u32) -> u64 {
    let off = match unsafe { PY_PROCS.get(&tgid) } {
        Some(o) => *o,
        None => return 0,
    };
    let tstate = match unsafe { PY_TSTATE.get(&tid) } {
        Some(t) => *t,
        None => {
            stat(PyStat::NoThreadState);
            return 0;
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

#[inline(always)]
fn walk(off: &PyOffsets, tgid: u32, tstate: u64) -> Result<u64, PyStat> {
    let st = match PY_SCRATCH.get_ptr_mut(0) {
        Some(p) => unsafe { &mut *p },
        None => return Err(PyStat::StacksFull),
    };
    let mut frame =
        read_u64(tstate.wrapping_add(off.tstate_frame as u64)).ok_or(PyStat::ReadFailed)?;
    if off.cframe_current != PY_NO_OFFSET && frame != 0 {
        frame = read_u64(frame.wrapping_add(off.cframe_current as u64)).ok_or(PyStat::ReadFailed)?;
    }
    let mut hash = (FNV_OFFSET ^ tgid as u64).wrapping_mul(FNV_PRIME);
    let mut n: u32 = 0;
    for i in 0..PY_MAX_FRAMES {
        if frame == 0 {
            break;
        }
        let code = read_u64(frame.wrapping_add(off.frame_code as u64)).ok_or(PyStat::ReadFailed)?;
        let instr =
            read_u64(frame.wrapping_add(off.frame_prev_instr as u64)).ok_or(PyStat::ReadFailed)?;
        let entry: u8 =
            unsafe { bpf_probe_read_user(frame.wrapping_add(off.frame_is_entry as u64) as *const u8) }
                .map_err(|_| PyStat::ReadFailed)?;
        let flags = if entry != 0 { PY_FRAME_ENTRY } else { 0 };
        let instr_off = instr.wrapping_sub(code) as u32;
        st.frames[i] = PyFrame {
            code,
            instr_off,
            flags,
        };
        hash = (hash ^ code).wrapping_mul(FNV_PRIME);
        hash = (hash ^ (((instr_off as u64) << 1) | flags as u64)).wrapping_mul(FNV_PRIME);
        frame =
            read_u64(frame.wrapping_add(off.frame_previous as u64)).ok_or(PyStat::ReadFailed)?;
        n += 1;
    }
    if n == 0 {
        return Err(PyStat::NoFrames);
    }
    st.len = n;
    st.pid = tgid;
    st.status = 0;
    if frame != 0 {
        st.status = PY_STACK_TRUNCATED;
        stat(PyStat::Truncated);
        hash = (hash ^ 1).wrapping_mul(FNV_PRIME);
    }
    if hash == 0 {
        hash = 1;
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
