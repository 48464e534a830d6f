//! Syscall statistics and the syscall in progress of each traced thread (raw_syscalls).
//!
//! sys_enter records the syscall in the thread's state (the scheduler programs use it to say
//! why a thread left the CPU); sys_exit sums count, latency, a log2 histogram, bytes for the
//! read/write family and errors by errno, keyed by thread and syscall.

use aya_ebpf::{
    helpers::bpf_ktime_get_ns,
    macros::{map, tracepoint},
    maps::{HashMap, PerCpuArray},
    programs::TracePointContext,
    Global,
};
use tracer_common::{
    drops::Drop,
    wall::{
        log2_bucket, ErrnoKey, FdGenKey, FdKey, FdStat, SysKey, SysStat, ThreadState,
        ERRNOS_ENTRIES, FILEIO_ENTRIES, HIST_BUCKETS, NO_SYSCALL, SYSCALLS_ENTRIES,
    },
};

use crate::{
    account::THREADS,
    maps::{add_to, count_drop, current_ids},
};

#[map(name = "SYSCALLS")]
static SYSCALLS: HashMap<SysKey, SysStat> = HashMap::with_max_entries(SYSCALLS_ENTRIES, 0);

#[map(name = "ERRNOS")]
static ERRNOS: HashMap<ErrnoKey, u64> = HashMap::with_max_entries(ERRNOS_ENTRIES, 0);

#[map(name = "FILEIO")]
static FILEIO: HashMap<FdKey, FdStat> = HashMap::with_max_entries(FILEIO_ENTRIES, 0);

#[map(name = "FD_GEN")]
static FD_GEN: HashMap<FdGenKey, u32> = HashMap::with_max_entries(FILEIO_ENTRIES, 0);

const SYS_CLOSE: i32 = 3;

/// A zeroed `SysStat` to insert from (too big for the 512-byte stack with everything else).
#[map(name = "SYS_ZERO")]
static SYS_ZERO: PerCpuArray<SysStat> = PerCpuArray::with_max_entries(1, 0);

#[no_mangle]
static OFF_SYS_ID: Global<u32> = Global::new(8);
#[no_mangle]
static OFF_SYS_ARG0: Global<u32> = Global::new(16);
#[no_mangle]
static OFF_SYS_RET: Global<u32> = Global::new(16);
/// The syscall a uretprobe's trampoline makes to return (x86-64 `uretprobe`, 335; set by user
/// space per architecture). It is gputrace's own probe at work, not the target's syscall:
/// leaving it out keeps the target's syscall table honest and halves what it costs us.
#[no_mangle]
static SYS_URETPROBE: Global<u32> = Global::new(335);

/// The syscall number, the caller's (tgid, tid) and its thread state, when the thread is
/// traced and the syscall is not a uretprobe's return (sys_exit's `id` sits where sys_enter's
/// does).
#[inline(always)]
fn traced_syscall(ctx: &TracePointContext) -> Option<(i64, u32, u32, &'static mut ThreadState)> {
    let id: i64 = unsafe { ctx.read_at(OFF_SYS_ID.load() as usize) }.unwrap_or(-1);
    if id == SYS_URETPROBE.load() as i64 {
        return None;
    }
    let (tgid, tid) = current_ids();
    let st = unsafe { &mut *THREADS.get_ptr_mut(&tid)? };
    (st.tgid == tgid).then_some((id, tgid, tid, st))
}

#[tracepoint]
pub fn sys_enter(ctx: TracePointContext) -> u32 {
    let Some((id, _, _, st)) = traced_syscall(&ctx) else {
        return 0;
    };
    st.sys_nr = id as i32;
    st.sys_arg0 = unsafe { ctx.read_at(OFF_SYS_ARG0.load() as usize) }.unwrap_or(0);
    st.sys_start_ns = unsafe { bpf_ktime_get_ns() };
    0
}

#[tracepoint]
pub fn sys_exit(ctx: TracePointContext) -> u32 {
    let Some((_, tgid, tid, st)) = traced_syscall(&ctx) else {
        return 0;
    };
    if st.sys_nr == NO_SYSCALL {
        return 0;
    }
    let nr = st.sys_nr;
    st.sys_nr = NO_SYSCALL;
    let lat = unsafe { bpf_ktime_get_ns() }.saturating_sub(st.sys_start_ns);
    let ret: i64 = unsafe { ctx.read_at(OFF_SYS_RET.load() as usize) }.unwrap_or(0);
    crate::timeline::syscall(tgid, tid, nr, st.sys_start_ns, lat, ret, st.sys_arg0);
    let key = SysKey {
        tgid,
        tid,
        nr,
        _pad: 0,
    };
    let stat = match SYSCALLS.get_ptr_mut(&key) {
        Some(s) => s,
        None => {
            let Some(zero) = SYS_ZERO.get_ptr(0) else {
                return 0;
            };
            if SYSCALLS.insert(&key, unsafe { &*zero }, 0).is_err() {
                count_drop(Drop::SyscallMapFull);
                return 0;
            }
            match SYSCALLS.get_ptr_mut(&key) {
                Some(s) => s,
                None => return 0,
            }
        }
    };
    // Keyed by thread: only this thread updates the row, so no atomics are needed.
    let s = unsafe { &mut *stat };
    if s.count == 0 || lat < s.min_ns {
        s.min_ns = lat;
    }
    if lat > s.max_ns {
        s.max_ns = lat;
    }
    s.count += 1;
    s.total_ns += lat;
    let b = log2_bucket(lat);
    if b < HIST_BUCKETS {
        s.hist[b] += 1;
    }
    if ret < 0 {
        s.errors += 1;
        let ek = ErrnoKey {
            tgid,
            tid,
            nr,
            errno: (-ret) as i32,
        };
        add_to(&ERRNOS, &ek, 1, Drop::SyscallMapFull);
    } else if moves_bytes(nr) {
        s.bytes += ret as u64;
    }
    if nr == SYS_CLOSE && ret == 0 {
        let gk = FdGenKey {
            tgid,
            fd: st.sys_arg0 as i32,
        };
        match FD_GEN.get_ptr_mut(&gk) {
            Some(g) => unsafe { *g += 1 },
            None => {
                let _ = FD_GEN.insert(&gk, &1, 0);
            }
        }
    }
    if per_fd(nr) {
        let fd = st.sys_arg0 as i32;
        let gen = unsafe { FD_GEN.get(&FdGenKey { tgid, fd }) }
            .copied()
            .unwrap_or(0);
        let fk = FdKey {
            tgid,
            fd,
            gen,
            _pad: 0,
        };
        let bytes = if ret > 0 && moves_bytes(nr) {
            ret as u64
        } else {
            0
        };
        match FILEIO.get_ptr_mut(&fk) {
            Some(f) => unsafe {
                // Several threads of a process share an fd row.
                crate::maps::atomic_add(&mut (*f).ns, lat);
                crate::maps::atomic_add(&mut (*f).bytes, bytes);
                crate::maps::atomic_add(&mut (*f).calls, 1);
            },
            None => {
                let v = FdStat {
                    ns: lat,
                    bytes,
                    calls: 1,
                };
                if FILEIO.insert(&fk, &v, 1).is_err() {
                    count_drop(Drop::SyscallMapFull);
                }
            }
        }
    }
    0
}

/// x86_64 read/write family: the return value is a byte count.
#[inline(always)]
fn moves_bytes(nr: i32) -> bool {
    matches!(
        nr,
        0 | 1 | 17 | 18 | 19 | 20 | 44 | 45 | 46 | 47 | 295 | 296 | 327 | 328
    )
}

/// Syscalls whose first argument is the fd they do I/O on (x86_64).
#[inline(always)]
fn per_fd(nr: i32) -> bool {
    moves_bytes(nr) || matches!(nr, 74 | 75)
}
