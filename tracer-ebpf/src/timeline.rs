//! Events for the timeline (`trace.json`), streamed over one ring buffer by the scheduler,
//! syscall, block and CUDA programs. Each helper costs a comparison when the interval is below
//! its threshold, and never walks a stack.

use aya_ebpf::{
    helpers::bpf_probe_read_user,
    macros::map,
    maps::{PerCpuArray, RingBuf},
    Global,
};
use tracer_common::{
    cuda::{Cookie, Shape},
    drops::Drop,
    time::Category,
    timeline::{
        TlEvent, BLOCK_BURST_MAX_NS, BLOCK_OPEN_SLOTS, DEFAULT_CUDA_MIN_NS, DEFAULT_MIN_NS,
        RING_BYTES, STATS_SLOTS, STAT_CUDA_SHORT, TL_BLOCK, TL_CUDA, TL_OFFCPU, TL_SYSCALL,
    },
    wall::{ThreadState, PHASE_RUNNABLE},
};

use crate::maps::{count_drop, BPF_RB_NO_WAKEUP};

#[map(name = "TIMELINE")]
static TIMELINE: RingBuf = RingBuf::with_byte_size(RING_BYTES, 0);

/// `tracer_common::timeline::BLOCK_OPEN_MAP`.
#[map(name = "TL_BLOCK_OPEN")]
static BLOCK_OPEN: PerCpuArray<TlEvent> = PerCpuArray::with_max_entries(BLOCK_OPEN_SLOTS, 0);

#[map(name = "TL_STATS")]
static TL_STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(STATS_SLOTS, 0);

/// 1 when `--output` asks for trace.json; 0 keeps every helper here a single load.
#[no_mangle]
static TL_ENABLED: Global<u32> = Global::new(0);
#[no_mangle]
static TL_MIN_NS: Global<u64> = Global::new(DEFAULT_MIN_NS);
#[no_mangle]
static TL_CUDA_MIN_NS: Global<u64> = Global::new(DEFAULT_CUDA_MIN_NS);

/// Whether trace.json was asked for (what only the timeline needs is read only then).
#[inline(always)]
pub fn enabled() -> bool {
    TL_ENABLED.load() != 0
}

#[inline(always)]
fn send(kind: u32, tgid: u32, tid: u32, a32: u32, start_ns: u64, dur_ns: u64, args: &[u64; 9]) {
    send_with(kind, tgid, tid, a32, start_ns, dur_ns, |a| *a = *args);
}

/// As [`send`], the arguments written by `fill` straight into the record: an array built on
/// the stack first takes 72 bytes of the caller's frame, and a call chain's frames must fit
/// in 512 bytes before Linux 6.13 (`sched::gputrace_switched_in`'s under `sched_switch`'s).
#[inline(always)]
fn send_with(
    kind: u32,
    tgid: u32,
    tid: u32,
    a32: u32,
    start_ns: u64,
    dur_ns: u64,
    fill: impl FnOnce(&mut [u64; 9]),
) {
    let Some(mut entry) = TIMELINE.reserve::<TlEvent>(0) else {
        count_drop(Drop::TimelineFull);
        return;
    };
    let ev = entry.as_mut_ptr();
    unsafe {
        (*ev).kind = kind;
        (*ev).tgid = tgid;
        (*ev).tid = tid;
        (*ev).a32 = a32;
        (*ev).start_ns = start_ns;
        (*ev).dur_ns = dur_ns;
        fill(&mut (*ev).args);
    }
    entry.submit(BPF_RB_NO_WAKEUP);
}

/// At switch-in, before the interval is closed: the whole off-CPU interval since the
/// switch-out, with what the thread was doing when it left. `seeded_from`: where the wait
/// began for a thread seeded in it (no switch-out seen: `off_ns` 0), the state's start
/// before this switch-in moved it.
#[inline(always)]
pub fn offcpu(tid: u32, st: &ThreadState, now: u64, seeded_from: u64) {
    let began = if st.off_ns != 0 {
        st.off_ns
    } else {
        seeded_from
    };
    if !enabled() || began == 0 {
        return;
    }
    let dur = now.saturating_sub(began);
    if dur < TL_MIN_NS.load() {
        return;
    }
    // Woken from a sleep: the runqueue part started at the wake-up (the running interval).
    let woke = if st.phase == PHASE_RUNNABLE && st.off_state & 0xff != 0 {
        st.start_ns
    } else {
        0
    };
    send_with(TL_OFFCPU, st.tgid, tid, st.off_state, began, dur, |a| {
        *a = [0; 9];
        a[0] = st.off_sys_nr as i64 as u64;
        a[1] = st.override_cat as u64;
        a[2] = woke;
        // The kernel stack the accounting walked at switch-out (or -1): no walk of our own.
        a[3] = st.off_kstack as i64 as u64;
    });
}

#[inline(always)]
pub fn syscall(tgid: u32, tid: u32, nr: i32, start_ns: u64, lat: u64, ret: i64, arg0: u64) {
    if !enabled() || lat < TL_MIN_NS.load() {
        return;
    }
    let args = [ret as u64, arg0, 0, 0, 0, 0, 0, 0, 0];
    send(TL_SYSCALL, tgid, tid, nr as u32, start_ns, lat, &args);
}

/// At the return of an outermost CUDA call. Short calls are only counted (the launch storm),
/// except syncs, copies, allocations and failures, which are always worth seeing.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn cuda_call(
    tgid: u32,
    tid: u32,
    fid: u32,
    cookie: &Cookie,
    code: i32,
    start_ns: u64,
    dur: u64,
    a: &[u64; 6],
    arg7: u64,
) {
    if !enabled() {
        return;
    }
    let cat = cookie.category as u32;
    let always = code != 0
        || cat == Category::CudaSync as u32
        || cat == Category::CudaMemcpy as u32
        || cat == Category::CudaMalloc as u32
        || cookie.shape == Shape::Free as u8;
    if !always && dur < TL_CUDA_MIN_NS.load() {
        if let Some(n) = TL_STATS.get_ptr_mut(STAT_CUDA_SHORT) {
            // Per-CPU slot.
            unsafe { *n += 1 };
        }
        return;
    }
    let mut args = [
        cookie.pack(),
        code as i64 as u64,
        a[0],
        a[1],
        a[2],
        a[3],
        a[4],
        a[5],
        arg7,
    ];
    if cookie.shape == Shape::LaunchRtEx as u8 || cookie.shape == Shape::LaunchDrvEx as u8 {
        let d: [u32; 6] = unsafe { bpf_probe_read_user(a[0] as *const [u32; 6]) }.unwrap_or([0; 6]);
        args[5] = d[0] as u64 | (d[1] as u64) << 32;
        args[6] = d[2] as u64 | (d[3] as u64) << 32;
        args[7] = d[4] as u64 | (d[5] as u64) << 32;
    } else if cookie.shape == Shape::Copy3dRt as u8 {
        let ext: [u64; 4] =
            unsafe { bpf_probe_read_user((a[0] + 128) as *const [u64; 4]) }.unwrap_or([0; 4]);
        args[5] = ext[0].wrapping_mul(ext[1]).wrapping_mul(ext[2]);
        args[6] = ext[3];
    }
    send(TL_CUDA, tgid, tid, fid, start_ns, dur, &args);
}

/// A block request of `tgid` completed: it joins this CPU's burst when it is the same
/// process, disk and direction and starts within the timeline threshold of the burst's end
/// (`BLOCK_BURST_MAX_NS`); otherwise the burst is sent and a new one starts with it. A ring
/// record per request cost each completion a reservation on the shared ring, and a loader's
/// requests filled the timeline in seconds.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn block(
    tgid: u32,
    dev: u32,
    start_ns: u64,
    lat: u64,
    bytes: u64,
    write: u32,
    sector: u64,
    queued: u64,
    weight: u64,
) {
    if !enabled() {
        return;
    }
    // Completions come in interrupts on any CPU: each CPU builds its own bursts, with plain
    // stores (programs do not nest on one CPU here), a few at once for the data-loader
    // workers whose requests interleave; a new burst takes a free slot or the one that
    // ended first.
    let end = start_ns.saturating_add(lat);
    let mut victim = 0;
    let mut oldest = u64::MAX;
    let mut i = 0;
    while i < BLOCK_OPEN_SLOTS {
        let Some(b) = BLOCK_OPEN.get_ptr_mut(i) else {
            return;
        };
        let b = unsafe { &mut *b };
        // A free slot has kind 0, and counts as ended first.
        let b_end = if b.kind == TL_BLOCK {
            b.start_ns.saturating_add(b.dur_ns)
        } else {
            0
        };
        if b.kind == TL_BLOCK && b.tgid == tgid && b.a32 == dev && b.args[1] == write as u64 {
            if start_ns >= b.start_ns
                && start_ns <= b_end.saturating_add(TL_MIN_NS.load())
                && end.saturating_sub(b.start_ns) <= BLOCK_BURST_MAX_NS
            {
                if end > b_end {
                    b.dur_ns = end - b.start_ns;
                }
                b.args[0] += bytes;
                b.args[3] += queued;
                b.args[4] += weight;
                b.args[5] += lat * weight;
                if weight > b.args[7] {
                    b.args[7] = weight;
                }
                if lat > b.args[6] {
                    b.args[6] = lat;
                }
                return;
            }
            victim = i;
            break;
        }
        if b_end < oldest {
            oldest = b_end;
            victim = i;
        }
        i += 1;
    }
    let Some(b) = BLOCK_OPEN.get_ptr_mut(victim) else {
        return;
    };
    let b = unsafe { &mut *b };
    if b.kind == TL_BLOCK {
        send(TL_BLOCK, b.tgid, 0, b.a32, b.start_ns, b.dur_ns, &b.args);
    }
    b.kind = TL_BLOCK;
    b.tgid = tgid;
    b.tid = 0;
    b.a32 = dev;
    b.start_ns = start_ns;
    b.dur_ns = lat;
    b.args = [
        bytes,
        write as u64,
        sector,
        queued,
        weight,
        lat * weight,
        lat,
        weight,
        0,
    ];
}
