//! Syscall statistics and the syscall in progress of each traced thread (raw_syscalls).
//!
//! Raw or BTF tracepoints, not classic ones: these run for every syscall of every process, and
//! a classic tracepoint first copies its whole record (id and six arguments) into a perf buffer
//! before the program runs, for the many syscalls that are not ours too. sys_enter comes on
//! both, its argument reads plain loads on the BTF one (`crate::kread`); sys_exit reads no
//! kernel memory, so it comes on a raw tracepoint only.
//!
//! sys_enter records the syscall in the thread's state (the scheduler programs use it to say
//! why a thread left the CPU); sys_exit sums count, latency, a log2 histogram, bytes for the
//! read/write family and errors by errno, keyed by thread and syscall.

use aya_ebpf::{
    helpers::{bpf_ktime_get_ns, bpf_probe_read_user, bpf_probe_read_user_str_bytes},
    macros::{btf_tracepoint, map, raw_tracepoint},
    maps::{Array, HashMap, PerCpuArray},
    programs::{BtfTracePointContext, RawTracePointContext},
    Global,
};
use tracer_common::{
    drops::Drop,
    proc::SYS_STORM_WINDOW_NS,
    wall::{
        log2_bucket, ErrnoKey, FdGenKey, FdKey, FdName, FdStat, SysHeld, SysKey, SysStat,
        ThreadState, ERRNOS_ENTRIES, FD_DUP_MARK, FD_NAMES_ENTRIES, FD_NAME_WAYS, FILEIO_ENTRIES,
        HIST_BUCKETS, NO_SYSCALL, SYSCALLS_ENTRIES, SYS_HOLD_RUN, SYS_LEFT_CPU, THREAD_SLOTS,
    },
};

use crate::{
    account,
    kread::{Direct, Kernel, Probe},
    maps::{add_to, by_path, count_drop, current_ids, traced},
};
use tracer_common::hits::Prog;

/// Preallocated: see `SYSCALLS_ENTRIES`.
#[map(name = "SYSCALLS")]
static SYSCALLS: HashMap<SysKey, SysStat> = HashMap::with_max_entries(SYSCALLS_ENTRIES, 0);

const EBADF: i64 = 9;

/// `tracer_common::wall::SYS_HELD_MAP`.
#[map(name = "SYS_HELD")]
static SYS_HELD: Array<SysHeld> = Array::with_max_entries(THREAD_SLOTS, 0);

#[map(name = "ERRNOS")]
static ERRNOS: HashMap<ErrnoKey, u64> = HashMap::with_max_entries(ERRNOS_ENTRIES, 0);

#[map(name = "FILEIO")]
static FILEIO: HashMap<FdKey, FdStat> = HashMap::with_max_entries(FILEIO_ENTRIES, 0);

#[map(name = "FD_GEN")]
static FD_GEN: HashMap<FdGenKey, u32> = HashMap::with_max_entries(FILEIO_ENTRIES, 0);

/// The path each file was opened by (`FdName`, in its key's set: `FdName::set`): what names
/// a file that was closed before user space could read its link in /proc.
#[map(name = "FD_NAMES")]
static FD_NAMES: Array<FdName> = Array::with_max_entries(FD_NAMES_ENTRIES, 0);

/// Successful closes by traced processes so far: a thread's cached fd generation
/// (`ThreadState::fd_gen`) holds while this has not moved.
#[map(name = "FD_EPOCH")]
static FD_EPOCH: Array<u64> = Array::with_max_entries(1, 0);

/// `tracer_common::wall::SYS_OFF_AT_MAP`.
#[map(name = "SYS_OFF_AT")]
static SYS_OFF_AT: Array<u64> = Array::with_max_entries(1, 0);

/// `tracer_common::wall::SYS_STORM_CALLS_MAP`: the syscalls in a block a traced thread's
/// syscalls are timed in, 0 for none. Written by user space from the budget and what it
/// measured a syscall to cost as it attached these programs
/// (`accounting::syscall_gate::block_calls`), so not a load-time constant: a budget that never
/// samples (`--max-overhead 100%`) still reads the slot at every exit, a load or two.
#[map(name = "SYS_STORM_CALLS")]
static SYS_STORM_CALLS: Array<u64> = Array::with_max_entries(1, 0);

/// `tracer_common::wall::SYS_HALT_MAP`.
#[map(name = "SYS_HALT")]
static SYS_HALT: Array<u64> = Array::with_max_entries(1, 0);

/// `tracer_common::wall::SYS_HALT_FDS_MAP`.
#[map(name = "SYS_HALT_FDS")]
static SYS_HALT_FDS: Array<u64> = Array::with_max_entries(1, 0);

/// `tracer_common::wall::SYS_HALTED_MAP`.
#[map(name = "SYS_HALTED")]
static SYS_HALTED: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// When the syscall programs last came off (0: never).
#[inline(always)]
pub fn off_at() -> u64 {
    crate::maps::counter(&SYS_OFF_AT)
}

/// `SYS_OFF_AT` while the programs are stopped: far enough ahead that no syscall a thread
/// entered is trusted, not even one whose entry raced the stop on another CPU (its exit is
/// not seen), and near enough for `seen_since`'s wrapping compare. User space writes the
/// time of the detach over it.
const STOPPED_OFF_AT: u64 = 1 << 62;

/// The programs stop at `now`, as though user space had taken them off then ([`off_at`]).
#[inline(always)]
fn halt(now: u64) {
    for (m, v) in [(&SYS_HALT, now), (&SYS_OFF_AT, now + STOPPED_OFF_AT)] {
        if let Some(p) = m.get_ptr_mut(0) {
            unsafe { core::ptr::write_volatile(p, v) };
        }
    }
}

/// `tracer_common::wall::seen_since` for `st`.
#[inline(always)]
pub fn seen_since(st: &ThreadState, off_at: u64) -> u64 {
    tracer_common::wall::seen_since(st.sys_start_ns, off_at)
}

/// `tracer_common::wall::nr_since` for `st`: the syscall it is in, `NO_SYSCALL`, or
/// `SYSCALL_UNSEEN` when the syscall programs were off as it began its last.
#[inline(always)]
pub fn nr_since(st: &ThreadState, off_at: u64) -> i32 {
    tracer_common::wall::nr_since(st.sys_nr, st.sys_start_ns, off_at)
}

/// A zeroed `SysStat` to insert from (too big for the 512-byte stack with everything else).
#[map(name = "SYS_ZERO")]
static SYS_ZERO: PerCpuArray<SysStat> = PerCpuArray::with_max_entries(1, 0);

/// Where the first syscall argument sits in `struct pt_regs` (x86-64 `di`; set by user space
/// per architecture).
#[no_mangle]
static OFF_REGS_ARG0: Global<u32> = Global::new(112);
/// The syscall a uretprobe's trampoline makes to return (x86-64 `uretprobe`, 335; set by user
/// space per architecture). It is gputrace's own probe at work, not the target's syscall:
/// leaving it out keeps the target's syscall table honest and halves what it costs us.
#[no_mangle]
static SYS_URETPROBE: Global<u32> = Global::new(335);
/// The second argument's place in `struct pt_regs` (x86-64 `si`).
#[no_mangle]
static OFF_REGS_ARG1: Global<u32> = Global::new(104);
/// mmap, and the places of its third to fifth arguments (`prot`, `flags`, `fd`) in `struct
/// pt_regs` (x86-64 9, `dx`, `r10`, `r8`; set by user space per architecture).
#[no_mangle]
static SYS_MMAP: Global<u32> = Global::new(9);
#[no_mangle]
static OFF_REGS_ARG2: Global<u32> = Global::new(96);
#[no_mangle]
static OFF_REGS_ARG3: Global<u32> = Global::new(56);
#[no_mangle]
static OFF_REGS_ARG4: Global<u32> = Global::new(72);
/// mmap's offset (x86-64 r9, arm64 x5).
#[no_mangle]
static OFF_REGS_ARG5: Global<u32> = Global::new(64);
const PROT_EXEC: u64 = 4;
const MAP_ANONYMOUS: u64 = 0x20;
/// The open family (set by user space per architecture; `u32::MAX - 1` where a syscall does
/// not exist): the path is the first argument of open and creat, the second of the others.
#[no_mangle]
static SYS_OPEN: Global<u32> = Global::new(2);
#[no_mangle]
static SYS_CREAT: Global<u32> = Global::new(85);
#[no_mangle]
static SYS_OPENAT: Global<u32> = Global::new(257);
#[no_mangle]
static SYS_OPENAT2: Global<u32> = Global::new(437);
/// `rt_sigreturn` (set by user space per architecture): its return value is the register it
/// restored, which may read as a negative errno.
#[no_mangle]
static SYS_RT_SIGRETURN: Global<u32> = Global::new(15);
/// Pipes and sockets, named `<pipe>` and `<socket>` when closed before /proc showed them.
#[no_mangle]
static SYS_PIPE: Global<u32> = Global::new(22);
#[no_mangle]
static SYS_PIPE2: Global<u32> = Global::new(293);
#[no_mangle]
static SYS_SOCKET: Global<u32> = Global::new(41);
#[no_mangle]
static SYS_ACCEPT: Global<u32> = Global::new(43);
#[no_mangle]
static SYS_ACCEPT4: Global<u32> = Global::new(288);
#[no_mangle]
static SYS_DUP2: Global<u32> = Global::new(33);
#[no_mangle]
static SYS_DUP3: Global<u32> = Global::new(292);
/// dup and fcntl (whose `F_DUPFD` and `F_DUPFD_CLOEXEC` dup too): the new fd was free, so its
/// generation stays; only its name is the old fd's.
#[no_mangle]
static SYS_DUP: Global<u32> = Global::new(32);
#[no_mangle]
static SYS_FCNTL: Global<u32> = Global::new(72);
/// close and the others that can put another file under an fd in use (set by user space per
/// architecture).
#[no_mangle]
static SYS_CLOSE: Global<u32> = Global::new(3);
#[no_mangle]
static SYS_CLOSE_RANGE: Global<u32> = Global::new(436);
#[no_mangle]
static SYS_EXECVE: Global<u32> = Global::new(59);
#[no_mangle]
static SYS_EXECVEAT: Global<u32> = Global::new(322);

/// The caller's (tgid, tid) and its thread state, when the thread is traced. A state off CPU
/// is closed as its unseen switch-in would have closed it (`sched::gputrace_switched_in`):
/// the thread is on a CPU, making this syscall.
#[inline(always)]
fn traced_thread() -> Option<(u32, u32, &'static mut ThreadState)> {
    let (tgid, tid) = current_ids();
    if !crate::maps::maybe_traced(tid) || account::stopped() {
        return None;
    }
    let st = account::state(tid)?;
    if unsafe { (*st).tgid } != tgid {
        return None;
    }
    crate::sched::running(tid, st, 0, || unsafe { bpf_ktime_get_ns() });
    Some((tgid, tid, unsafe { &mut *st }))
}

/// Whether the programs stopped themselves at a storm (`SYS_HALT`): a run then returns before
/// anything else, an early return as far as its paths' timing goes (the kernel's statistics
/// time it too, and the split of their mean must see the same runs). At the exit (`count`),
/// a syscall of a thread that may be traced is counted in `SYS_HALTED`, for the report to
/// charge to the storm.
#[inline(always)]
fn stopped(count: bool) -> bool {
    if crate::maps::counter(&SYS_HALT) == 0 {
        return false;
    }
    if count && crate::maps::maybe_traced(current_ids().1) {
        if let Some(n) = SYS_HALTED.get_ptr_mut(0) {
            // Per-CPU slot, as `crate::maps::hit`.
            unsafe { *n += 1 };
        }
    }
    true
}

/// [`stopped`] at an entry: syscall `id` of a thread that may be traced that can put another
/// file under an fd it has (a close, a dup onto it, an exec's close-on-exec) is marked in
/// `SYS_HALT_FDS`, before it runs, so that user space knows whether /proc still names the
/// fds' rows right.
#[inline(always)]
fn stopped_enter(id: i64) -> bool {
    if !stopped(false) {
        return false;
    }
    let moves = [
        SYS_CLOSE.load(),
        SYS_CLOSE_RANGE.load(),
        SYS_DUP2.load(),
        SYS_DUP3.load(),
        SYS_EXECVE.load(),
        SYS_EXECVEAT.load(),
    ]
    .iter()
    .any(|n| *n as i64 == id);
    if moves && crate::maps::maybe_traced(current_ids().1) {
        if let Some(v) = SYS_HALT_FDS.get_ptr_mut(0) {
            unsafe { core::ptr::write_volatile(v, 1) };
        }
    }
    true
}

// TP_PROTO(struct pt_regs *regs, long id)
#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn sys_enter(ctx: RawTracePointContext) -> u32 {
    by_path(Prog::SysEnter, |p| {
        if !stopped_enter(ctx.arg(1)) {
            enter::<Probe>(ctx.arg(0), ctx.arg(1), p)
        }
    });
    0
}

/// The same on a BTF tracepoint: the registers are a typed pointer, read with plain loads.
#[btf_tracepoint(function = "sys_enter")]
pub fn sys_enter_btf(ctx: BtfTracePointContext) -> i32 {
    by_path(Prog::SysEnterBtf, |p| {
        if !stopped_enter(ctx.arg(1)) {
            enter::<Direct>(ctx.arg(0), ctx.arg(1), p)
        }
    });
    0
}

/// `regs`: the syscall's `struct pt_regs *`.
#[inline(always)]
fn enter<K: Kernel>(regs: u64, id: i64, p: Prog) {
    if id == SYS_URETPROBE.load() as i64 {
        return;
    }
    let Some((_, _, st)) = traced_thread() else {
        return;
    };
    traced(p);
    st.sys_nr = id as i32;
    st.sys_arg0 = K::read(regs, OFF_REGS_ARG0.load());
    // Only the pointer here: the path is read at the exit, for the opens that succeeded.
    st.sys_path = if id == SYS_OPENAT.load() as i64 || id == SYS_OPENAT2.load() as i64 {
        K::read(regs, OFF_REGS_ARG1.load())
    } else if id == SYS_OPEN.load() as i64 || id == SYS_CREAT.load() as i64 {
        st.sys_arg0
    } else {
        0
    };
    // A fast run's call goes untimed but 1 in `2^SYS_TIME_SHIFT`, drawn for each
    // (`tracer_common::wall::SYS_TIME_GAP_NS`): its start then reads as seen since the
    // programs last came on (`seen_since`), and marks it untimed for the exit.
    if sampled_run(st, id as i32) {
        // Drawn from a hash of the clock at the window's start (its low bits are noise) and
        // the calls since: a helper's random number cost a call (~35 ns here), about what the
        // clock read saved. SplitMix64's mixing: the draws of consecutive calls are
        // independent (a plain product's top bits step by a constant, and timed ~1 call in
        // 4.5 where the weights assumed 8).
        let h = tracer_common::wall::mix64(
            st.sys_timed_ns
                .wrapping_add((st.sys_since as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)),
        );
        // Not while the programs stop themselves (`halt` on another CPU since this run's
        // `stopped_enter`): that `off_at` is far ahead, and a start stamped with it would
        // read as seen ever after (`seen_since`'s wrapping compare), where a clock stamp
        // reads as unseen once user space writes the detach time.
        let off = off_at();
        if (h >> (64 - time_shift())) != 0 && off < STOPPED_OFF_AT {
            st.sys_start_ns = off;
            st.sys_in_ns = st.start_ns;
            return;
        }
    }
    st.sys_start_ns = unsafe { bpf_ktime_get_ns() };
}

/// `tracer_common::wall::SYS_TIME_SHIFT` where user space samples fast runs' timing, else 0.
#[no_mangle]
static SYS_TIME_SHIFT: Global<u32> = Global::new(0);

/// [`SYS_TIME_SHIFT`], bounded (the verifier wants shifts it can see are in range).
#[inline(always)]
fn time_shift() -> u32 {
    SYS_TIME_SHIFT.load().min(10)
}

/// Whether the thread's call of syscall `nr` is one of a fast run's, timed 1 in
/// `2^SYS_TIME_SHIFT` (the same at its entry and its exit: only the exit's `pace` changes it).
#[inline(always)]
fn sampled_run(st: &ThreadState, nr: i32) -> bool {
    st.sys_fast != 0 && st.sys_held_nr == nr && time_shift() != 0
}

/// The process and time of this CPU's last `MappedExec` event.
#[map(name = "MAPPED_LAST")]
static MAPPED_LAST: PerCpuArray<[u64; 2]> = PerCpuArray::with_max_entries(1, 0);

/// User space looks at a process's maps `hand_mapped`'s 3 ms after the event; a mapping by
/// the same process on this CPU less than this after the last event is in that look already.
const MAPPED_QUIET_NS: u64 = 2_000_000;

/// Reports an executable file mapping, at most one per process and CPU every
/// `MAPPED_QUIET_NS`: a loader's burst, or a JIT that maps code through a file, must not flood
/// the ring that fork, exec and exit share.
#[inline(always)]
fn mapped_exec(tgid: u32, tid: u32, now: u64) {
    let Some(last) = MAPPED_LAST.get_ptr_mut(0) else {
        return;
    };
    // Per-CPU slot: only this CPU touches it.
    let last = unsafe { &mut *last };
    if last[0] == tgid as u64 && now.saturating_sub(last[1]) < MAPPED_QUIET_NS {
        return;
    }
    *last = [tgid as u64, now];
    crate::proc::mapped_exec(tgid, tid);
}

/// The key of the file `fd` of `tgid` has now: under the generation it has (closes of that
/// fd number so far).
#[inline(always)]
fn fd_key(tgid: u32, fd: i32) -> FdKey {
    FdKey {
        tgid,
        fd,
        gen: fd_gen(tgid, fd),
        _pad: 0,
    }
}

/// Where the path file `fd` of `tgid` was opened by is kept, if an `FD_NAMES` slot names it.
#[inline(always)]
fn fd_path(tgid: u32, fd: i32) -> Option<*const u8> {
    let key = fd_key(tgid, fd);
    let set = FdName::set(&key);
    let mut i = 0;
    while i < FD_NAME_WAYS {
        let slot = unsafe { &*FD_NAMES.get_ptr(set + i)? };
        // A path, not a dup's mark or a cleared name.
        if slot.key == key && slot.path[0] > FD_DUP_MARK {
            return Some(slot.path.as_ptr());
        }
        i += 1;
    }
    None
}

/// The `FD_NAMES` slot for the file `fd` of `tgid` just got (under the generation it has:
/// closes of that fd number so far), and its key; written in place, no map update. None when
/// that key already named a file (see below).
#[inline(always)]
fn name_slot(tgid: u32, fd: i32) -> Option<(&'static mut FdName, FdKey)> {
    let key = fd_key(tgid, fd);
    // The first free slot of the key's set, else its home slot.
    let set = FdName::set(&key);
    let mut pick = FdName::slot(&key);
    let mut free = false;
    let mut i = 0;
    while i < FD_NAME_WAYS {
        let slot = unsafe { &mut *FD_NAMES.get_ptr_mut(set + i)? };
        if slot.key == key {
            // This fd number was opened before with no close seen since (closed by an exec
            // or `close_range`): its row holds both files' I/O, which no one name names.
            slot.path[0] = 0;
            return None;
        }
        if !free && slot.key.tgid == 0 {
            free = true;
            pick = set + i;
        }
        i += 1;
    }
    if !free {
        // Every way of the set is taken: an exited process's slot goes first. 20,000 short
        // children's opens filled the sets, and a process reading file after file on one fd
        // took its own earlier file's home slot before a files pass had named that file's
        // row (once in a CI run: one of ten reads of a file unnamed).
        let mut i = 0;
        while i < FD_NAME_WAYS {
            let slot = unsafe { &*FD_NAMES.get_ptr(set + i)? };
            if !crate::maps::is_traced(slot.key.tgid) {
                pick = set + i;
                break;
            }
            i += 1;
        }
    }
    let slot = unsafe { &mut *FD_NAMES.get_ptr_mut(pick)? };
    // Else the home slot's name goes. Lost only if its file is still open under that fd (a
    // closed file's row is named by the next files pass): it then reads `<closed fd N>`
    // unless /proc named it first.
    if !free && slot.key.tgid != 0 && crate::maps::is_traced(slot.key.tgid) {
        if fd_gen(slot.key.tgid, slot.key.fd) == slot.key.gen {
            count_drop(Drop::FileNameLost);
        }
    }
    Some((slot, key))
}

/// Records the path `path` (user address) that opened `fd`.
#[inline(always)]
fn name_fd(tgid: u32, fd: i32, path: u64) {
    gputrace_name_fd(tgid, fd, path, 0);
}

/// Names `fd` by what made it (`<pipe>`, `<socket>`): no path, but not an unknown file.
#[inline(always)]
fn label_fd(tgid: u32, fd: i32, label: u32) {
    gputrace_name_fd(tgid, fd, 0, label);
}

const PIPE_LABEL: u32 = 1;
const SOCKET_LABEL: u32 = 2;
/// The fd's file is another fd's ([`tracer_common::wall::FD_DUP_MARK`]).
const DUP_LABEL: u32 = 3;
/// fcntl's commands that dup an fd (the same on x86-64 and arm64).
const F_DUPFD: u32 = 0;
const F_DUPFD_CLOEXEC: u32 = 1030;

/// Names `fd` of `tgid` by the path at user address `path`, or when that is 0 by `label`
/// (`PIPE_LABEL`, `SOCKET_LABEL`). A global function (see `crate`'s docs): the set's search
/// was walked again for each of the four places `sys_exit` names an fd.
#[no_mangle]
#[inline(never)]
pub extern "C" fn gputrace_name_fd(tgid: u32, fd: i32, path: u64, label: u32) -> u32 {
    let Some((slot, key)) = name_slot(tgid, fd) else {
        return 0;
    };
    if label == DUP_LABEL {
        // `path` is the source: its fd in the low half, its generation in the high one.
        let bytes = path.to_le_bytes();
        slot.path[0] = FD_DUP_MARK;
        let mut i = 0;
        while i < 8 {
            slot.path[1 + i] = bytes[i];
            i += 1;
        }
        slot.path[9] = 0;
        slot.key = key;
        return 0;
    }
    if path != 0 {
        if unsafe { bpf_probe_read_user_str_bytes(path as *const u8, &mut slot.path) }.is_ok() {
            slot.key = key;
        } else {
            // Another file's name may be half overwritten: the slot names nothing now.
            slot.key.tgid = 0;
        }
        return 0;
    }
    let text: &[u8; 9] = if label == PIPE_LABEL {
        b"<pipe>\0\0\0"
    } else {
        b"<socket>\0"
    };
    let mut i = 0;
    while i < text.len() {
        slot.path[i] = text[i];
        i += 1;
    }
    slot.key = key;
    0
}

/// The open generation of `fd` of `tgid`: closes of that fd number so far.
#[inline(always)]
fn fd_gen(tgid: u32, fd: i32) -> u32 {
    unsafe { FD_GEN.get(&FdGenKey { tgid, fd }) }
        .copied()
        .unwrap_or(0)
}

/// A new file under `fd` of `tgid`: the fd's generation moves on, so its I/O gets a new row.
/// False where it could not (the map full).
#[inline(always)]
fn next_gen(tgid: u32, fd: i32) -> bool {
    let gk = FdGenKey { tgid, fd };
    let moved = match FD_GEN.get_ptr_mut(&gk) {
        Some(g) => {
            unsafe { *g += 1 };
            true
        }
        None => {
            // Full: the fd's next file would add to this one's row under its name.
            let ok = FD_GEN.insert(&gk, &1, 0).is_ok();
            if !ok {
                count_drop(Drop::FileMapFull);
            }
            ok
        }
    };
    crate::maps::counter_add(&FD_EPOCH, 1);
    moved
}

// TP_PROTO(struct pt_regs *regs, long ret). The syscall's number is the one sys_enter kept: a
// uretprobe's return left none, so it is skipped here too.
#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn sys_exit(ctx: RawTracePointContext) -> u32 {
    by_path(Prog::SysExit, |p| {
        if !stopped(true) {
            exit(&ctx, p)
        }
    });
    0
}

#[inline(always)]
fn exit(ctx: &RawTracePointContext, p: Prog) {
    let Some((tgid, tid, st)) = traced_thread() else {
        return;
    };
    let off_at = off_at();
    let nr = nr_since(st, off_at);
    st.sys_nr = NO_SYSCALL;
    // None, or one whose entry went unseen.
    if nr < 0 {
        return;
    }
    traced(p);
    // Untimed at its entry (`enter`): no clock read here either, unless the storm gate's
    // block needs one.
    let sampled = sampled_run(st, nr);
    let timed = !sampled || st.sys_start_ns != off_at;
    // A timed call of a fast run stands for `2^SYS_TIME_SHIFT` calls in the latency sums
    // (each was timed with that chance): the sums are estimates, the counts exact.
    let weight = if sampled { 1u64 << time_shift() } else { 1 };
    let mut now = if timed {
        unsafe { bpf_ktime_get_ns() }
    } else {
        0
    };
    let lat = if timed {
        now.saturating_sub(st.sys_start_ns)
    } else {
        0
    };
    // An untimed call that left the CPU since its entry (the scheduler's switch-out stamped
    // when it first did): the time since is a lower bound of its latency (it misses the part
    // before the first switch-out). One clock read, where the call already paid two context
    // switches: the one slow call of a fast run of reads (a stalled producer) is in the max
    // and on the timeline, not missed 7 times in 8.
    let left = st.sys_in_ns & !SYS_LEFT_CPU;
    let waited = if !timed && st.sys_in_ns & SYS_LEFT_CPU != 0 {
        clock(&mut now).saturating_sub(left)
    } else {
        0
    };
    if time_shift() != 0 && st.sys_held_nr == nr {
        pace(st, timed, now);
    }
    // Timed in blocks: a thread whose block of syscalls took less than the storm window pays
    // more than the budget for these programs, and user space takes them off. A block begun
    // before they last came off (or none yet) starts here.
    let block = crate::maps::counter(&SYS_STORM_CALLS);
    if block != 0 {
        if st.sys_block_ns <= off_at {
            // Timed from this exit: the block's first call is the next one.
            st.sys_calls = 0;
            st.sys_block_ns = clock(&mut now);
        } else {
            st.sys_calls += 1;
        }
        if st.sys_calls as u64 >= block {
            let took = clock(&mut now).saturating_sub(st.sys_block_ns);
            if took < SYS_STORM_WINDOW_NS {
                halt(now);
                crate::proc::syscall_storm(tgid, tid, took);
            }
            st.sys_calls = 0;
            st.sys_block_ns = now;
        }
    }
    let ret: i64 = ctx.arg(1);
    if timed {
        crate::timeline::syscall(tgid, tid, nr, st.sys_start_ns, lat, ret, st.sys_arg0);
    } else if waited != 0 {
        crate::timeline::syscall(tgid, tid, nr, left, waited, ret, st.sys_arg0);
    }
    let key = SysKey {
        tgid,
        tid,
        nr,
        _pad: 0,
    };
    let stat = match held_row(st, &key) {
        Some(s) => s,
        None => match SYSCALLS.get_ptr_mut(&key) {
            Some(s) => s,
            None => {
                let Some(zero) = SYS_ZERO.get_ptr(0) else {
                    return;
                };
                if SYSCALLS.insert(&key, unsafe { &*zero }, 0).is_err() {
                    count_drop(Drop::SyscallMapFull);
                    return;
                }
                match SYSCALLS.get_ptr_mut(&key) {
                    Some(s) => s,
                    None => return,
                }
            }
        },
    };
    // Keyed by thread: only this thread updates the row, so no atomics are needed.
    let s = unsafe { &mut *stat };
    s.count += 1;
    if timed {
        if s.timed == 0 || lat < s.min_ns {
            s.min_ns = lat;
        }
        if lat > s.max_ns {
            s.max_ns = lat;
        }
        s.timed += 1;
        s.total_ns += lat * weight;
        let b = log2_bucket(lat);
        if b < HIST_BUCKETS {
            s.hist[b] += weight;
        }
    } else if waited > s.max_ns {
        s.max_ns = waited;
    }
    if ret < 0 && nr != SYS_RT_SIGRETURN.load() as i32 {
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
    } else if st.sys_path != 0 {
        name_fd(tgid, ret as i32, st.sys_path);
    } else if nr == SYS_PIPE.load() as i32 || nr == SYS_PIPE2.load() as i32 {
        // Both ends, from the caller's int[2].
        if let Ok(fds) = unsafe { bpf_probe_read_user(st.sys_arg0 as *const [i32; 2]) } {
            label_fd(tgid, fds[0], PIPE_LABEL);
            label_fd(tgid, fds[1], PIPE_LABEL);
        }
    } else if nr == SYS_SOCKET.load() as i32
        || nr == SYS_ACCEPT.load() as i32
        || nr == SYS_ACCEPT4.load() as i32
    {
        label_fd(tgid, ret as i32, SOCKET_LABEL);
    } else if nr == SYS_MMAP.load() as i32 {
        // The registers still hold the arguments at the exit. A library's code segment is
        // mapped executable from its file; anonymous memory (a JIT's) has no fd.
        let regs: u64 = ctx.arg(0);
        let prot: u64 = Probe::read(regs, OFF_REGS_ARG2.load());
        let flags: u64 = Probe::read(regs, OFF_REGS_ARG3.load());
        let fd: u64 = Probe::read(regs, OFF_REGS_ARG4.load());
        // The kernel takes the fd as an int, whatever the upper half of the register holds.
        if prot & PROT_EXEC != 0 && flags & MAP_ANONYMOUS == 0 && (fd as i32) >= 0 {
            let at = clock(&mut now);
            mapped_exec(tgid, tid, at);
            // A young process's library (its loader mapping libc's text) may be gone before
            // user space reads its maps: where it went, and which file. Not later: a JIT that
            // maps code through a file would flood the ring.
            if ret > 0 && crate::maps::is_young(st.proc_born_ns, at) {
                let len: u64 = Probe::read(regs, OFF_REGS_ARG1.load());
                let offset: u64 = Probe::read(regs, OFF_REGS_ARG5.load());
                let path = fd_path(tgid, fd as i32);
                crate::proc::mapped_code(tgid, tid, ret as u64, len, offset, fd as i32, path);
            }
        }
    }
    if nr == SYS_CLOSE.load() as i32 && ret == 0 {
        next_gen(tgid, st.sys_arg0 as i32);
    } else if (nr == SYS_DUP2.load() as i32 || nr == SYS_DUP3.load() as i32)
        && ret >= 0
        && ret != st.sys_arg0 as i64
    {
        // dup2/dup3 close the file the new fd had, if any, and put another one there: the old
        // fd's, which user space names (a shell's `>&2`, a pipe on a child's stdout).
        // Not where the generation could not move on (`FD_GEN` full): the mark would name the
        // earlier file's rows after the source.
        if next_gen(tgid, ret as i32) {
            let old = st.sys_arg0 as i32;
            let source = (fd_gen(tgid, old) as u64) << 32 | old as u32 as u64;
            gputrace_name_fd(tgid, ret as i32, source, DUP_LABEL);
        }
    } else if ret >= 0 && (nr == SYS_DUP.load() as i32 || nr == SYS_FCNTL.load() as i32) {
        // fcntl's command is still in its register at the exit (as mmap's arguments).
        let dups = nr == SYS_DUP.load() as i32 || {
            let regs: u64 = ctx.arg(0);
            let cmd: u64 = Probe::read(regs, OFF_REGS_ARG1.load());
            matches!(cmd as u32, F_DUPFD | F_DUPFD_CLOEXEC)
        };
        if dups {
            let old = st.sys_arg0 as i32;
            let source = (fd_gen(tgid, old) as u64) << 32 | old as u32 as u64;
            gputrace_name_fd(tgid, ret as i32, source, DUP_LABEL);
        }
    }
    // A call refused with EBADF (no file under the fd, or one not open for this call) did no
    // I/O: no row, which would be a file never opened.
    if per_fd(nr) && ret != -EBADF {
        let fd = st.sys_arg0 as i32;
        let epoch = crate::maps::counter(&FD_EPOCH);
        // The cached fd and generation are the last call's file, the one whose I/O is held.
        let mut new_file = st.fd_cached != fd;
        if new_file || st.fd_epoch != epoch {
            let gen = fd_gen(tgid, fd);
            new_file |= st.fd_gen != gen;
            if new_file {
                flush_file(st);
            }
            st.fd_cached = fd;
            st.fd_gen = gen;
            st.fd_epoch = epoch;
        }
        let bytes = if ret > 0 && moves_bytes(nr) {
            ret as u64
        } else {
            0
        };
        if new_file {
            let v = FdStat {
                ns: lat * weight,
                bytes,
                calls: 1,
                timed: timed as u64,
            };
            add_file(tgid, fd, st.fd_gen, &v);
        } else {
            st.held_file.ns += lat * weight;
            st.held_file.bytes += bytes;
            st.held_file.calls += 1;
            st.held_file.timed += timed as u64;
        }
    }
}

/// `now`, read from the clock first if it was not (0: an untimed call's exit).
#[inline(always)]
fn clock(now: &mut u64) -> u64 {
    if *now == 0 {
        *now = unsafe { bpf_ktime_get_ns() };
    }
    *now
}

/// Paces the timing of a thread's held syscall (`tracer_common::wall::SYS_TIME_GAP_NS`), in
/// windows of at least `WINDOW_CALLS` of its calls, each ended by a timed exit (`now`): where
/// the window's calls came within the gap each on average, the next window's are timed 1 in
/// `2^SYS_TIME_SHIFT`, else all of them. An average over hundreds of calls: a data loader's
/// run of reads with a pipe write after each batch of 256 (a gap of milliseconds), or a slow
/// read now and then, stays sampled, and a process's start (~60-130 `rt_sigaction`s in a
/// row, a few µs each) is not sampled at all.
#[inline(always)]
fn pace(st: &mut ThreadState, timed: bool, now: u64) {
    if timed && st.sys_timed_ns == 0 {
        // The first window starts at this exit.
        st.sys_timed_ns = now;
        st.sys_since = 0;
        return;
    }
    st.sys_since += 1;
    if !timed || st.sys_since < WINDOW_CALLS {
        return;
    }
    let calls = st.sys_since as u64;
    st.sys_fast =
        (now.saturating_sub(st.sys_timed_ns) < calls * tracer_common::wall::SYS_TIME_GAP_NS) as u32;
    st.sys_since = 0;
    st.sys_timed_ns = now;
}

/// A new held syscall starts unpaced: a fast run of reads whose thread turns to a run of
/// pipe writes (which may block for ms) must not have those sampled before a window of their
/// own says they come fast, nor an exec's new program its start's burst of `rt_sigaction`s.
#[inline(always)]
fn unpace(st: &mut ThreadState) {
    st.sys_fast = 0;
    st.sys_since = 0;
    st.sys_timed_ns = 0;
}

/// The calls of a pacing window (see [`pace`]).
const WINDOW_CALLS: u32 = 256;

/// The row `key`'s thread holds for its syscall (`SysHeld`), taken for `key` when the thread
/// made it `SYS_HOLD_RUN` times running; None for the calls of its other syscalls, and for a
/// thread whose state is not in its slot.
#[inline(always)]
fn held_row(st: &mut ThreadState, key: &SysKey) -> Option<*mut SysStat> {
    if st.sys_held_nr == key.nr {
        // It breaks another syscall's run: one alternating with the held one (a read after
        // each write) never reaches a run of its own.
        st.sys_last_nr = key.nr;
        let h = held_slot(key.tid)?;
        if h.tid == key.tid && h.tgid == key.tgid && h.nr == key.nr {
            return Some(&mut h.stat);
        }
        // Out of step with the slot (never expected): taken again below once its run is
        // long enough, this call's included.
        st.sys_held_nr = NO_SYSCALL;
        unpace(st);
    }
    st.sys_run = if st.sys_last_nr == key.nr {
        st.sys_run + 1
    } else {
        1
    };
    st.sys_last_nr = key.nr;
    if st.sys_run < SYS_HOLD_RUN {
        return None;
    }
    let h = held_slot(key.tid)?;
    // What it held: this thread's other syscall, or a leftover of the slot's last owner (an
    // exec's); each goes to its own row.
    write_out_sys(h);
    h.tgid = key.tgid;
    h.tid = key.tid;
    h.nr = key.nr;
    st.sys_held_nr = key.nr;
    unpace(st);
    Some(&mut h.stat)
}

/// Adds what `h` holds to its `SYSCALLS` row and empties it.
#[inline(always)]
fn write_out_sys(h: &mut SysHeld) {
    if h.tid == 0 || h.stat.count == 0 {
        return;
    }
    let key = SysKey {
        tgid: h.tgid,
        tid: h.tid,
        nr: h.nr,
        _pad: 0,
    };
    match SYSCALLS.get_ptr_mut(&key) {
        Some(s) => unsafe { (*s).add(&h.stat) },
        None => {
            if SYSCALLS.insert(&key, &h.stat, 0).is_err() {
                // One per call, as a call whose row could not be made counts.
                crate::maps::count_drops(Drop::SyscallMapFull, h.stat.count);
            }
        }
    }
    // Field by field: a whole `SysStat` built first goes through the stack.
    h.stat.count = 0;
    h.stat.errors = 0;
    h.stat.total_ns = 0;
    h.stat.min_ns = 0;
    h.stat.max_ns = 0;
    h.stat.bytes = 0;
    h.stat.timed = 0;
    let mut i = 0;
    while i < HIST_BUCKETS {
        h.stat.hist[i] = 0;
        i += 1;
    }
}

/// Writes out the syscall row thread `tid` holds (`SysHeld`), if any: at its death, and when
/// its state is flushed.
#[inline(always)]
pub fn flush_sys(tid: u32) {
    if let Some(h) = held_slot(tid).filter(|h| h.tid == tid) {
        write_out_sys(h);
    }
}

/// The `SYS_HELD` entry at `tid`'s state's slot, when its state is there.
#[inline(always)]
fn held_slot(tid: u32) -> Option<&'static mut SysHeld> {
    Some(unsafe { &mut *SYS_HELD.get_ptr_mut(account::own_slot(tid)?)? })
}

/// Adds `v` to the `FILEIO` row of (`tgid`, `fd`, `gen`), creating it.
#[inline(always)]
fn add_file(tgid: u32, fd: i32, gen: u32, v: &FdStat) {
    let fk = FdKey {
        tgid,
        fd,
        gen,
        _pad: 0,
    };
    match FILEIO.get_ptr_mut(&fk) {
        Some(f) => unsafe {
            // Several threads of a process share an fd row.
            crate::maps::atomic_add(&mut (*f).ns, v.ns);
            crate::maps::atomic_add(&mut (*f).bytes, v.bytes);
            crate::maps::atomic_add(&mut (*f).calls, v.calls);
            crate::maps::atomic_add(&mut (*f).timed, v.timed);
        },
        None => {
            if FILEIO.insert(&fk, v, 1).is_err() {
                count_drop(Drop::FileMapFull);
            }
        }
    }
}

/// Writes out the file I/O `st` holds (`ThreadState::held_file`).
#[inline(always)]
pub fn flush_file(st: &mut ThreadState) {
    if st.held_file.calls != 0 {
        let v = st.held_file;
        add_file(st.tgid, st.fd_cached, st.fd_gen, &v);
        st.held_file = FdStat {
            ns: 0,
            bytes: 0,
            calls: 0,
            timed: 0,
        };
    }
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
