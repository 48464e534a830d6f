//! Process lifecycle: follow children at fork, report fork/exec/exit to user space.
//!
//! Field offsets of the tracepoints are globals that user space sets from the tracepoints'
//! `format` files, so a kernel that moves a field does not make us read garbage.

use aya_ebpf::{
    helpers::{
        bpf_get_current_comm, bpf_ktime_get_ns, bpf_probe_read_kernel_buf,
        bpf_probe_read_kernel_str_bytes,
    },
    macros::{map, tracepoint},
    maps::{ring_buf::RingBufEntry, RingBuf},
    programs::TracePointContext,
    EbpfContext, Global,
};
use tracer_common::{
    drops::Drop,
    proc::{
        ExecEvent, MappedCodeEvent, ProcEvent, ProcEventKind, EXEC_AUXV_WORDS, PROC_EVENTS_BYTES,
    },
};

use crate::{
    kread::{Kernel, Probe},
    maps::{count_drop, current_ids, is_traced, TRACED},
};

#[map(name = "PROC_EVENTS")]
static PROC_EVENTS: RingBuf = RingBuf::with_byte_size(PROC_EVENTS_BYTES, 0);

/// 1 when children are followed (the default), 0 for `--no-children`.
#[no_mangle]
static FOLLOW_CHILDREN: Global<u32> = Global::new(1);

// task/task_newtask
#[no_mangle]
static OFF_NEWTASK_PID: Global<u32> = Global::new(8);
#[no_mangle]
static OFF_NEWTASK_FLAGS: Global<u32> = Global::new(32);
// sched/sched_process_exit
#[no_mangle]
static OFF_EXIT_GROUP_DEAD: Global<u32> = Global::new(32);
// sched/sched_process_exec (0: no such field, the thread's move is not followed)
#[no_mangle]
static OFF_EXEC_OLD_PID: Global<u32> = Global::new(0);
/// `task_struct.exit_code`, from the kernel's BTF (0: unknown, not read).
#[no_mangle]
static OFF_TASK_EXIT_CODE: Global<u32> = Global::new(0);
/// `task_struct.self_exec_id`, from the kernel's BTF (0: unknown, not read).
#[no_mangle]
static OFF_TASK_SELF_EXEC_ID: Global<u32> = Global::new(0);

/// `task_struct.mm`, from the kernel's BTF (0: unknown, not read: forked children then count
/// as new processes).
#[no_mangle]
static OFF_TASK_MM: Global<u32> = Global::new(0);

// Where an exec's new image lies (`tracer_common::proc::ExecEvent`), from the kernel's BTF
// (0: unknown, not read).
#[no_mangle]
static OFF_MM_SAVED_AUXV: Global<u32> = Global::new(0);
#[no_mangle]
static OFF_MM_EXE_FILE: Global<u32> = Global::new(0);
#[no_mangle]
static OFF_FILE_INODE: Global<u32> = Global::new(0);
#[no_mangle]
static OFF_INODE_INO: Global<u32> = Global::new(0);
// A mapped file's identity from its fd (`MappedCodeEvent`), and a file's (its inode's number
// and device), from the kernel's BTF (0: unknown, no event).
#[no_mangle]
static OFF_TASK_FILES: Global<u32> = Global::new(0);
#[no_mangle]
static OFF_FILES_FDT: Global<u32> = Global::new(0);
/// `fdtable.max_fds`, its first field: `u32::MAX` where unknown.
#[no_mangle]
static OFF_FDT_MAX_FDS: Global<u32> = Global::new(u32::MAX);
#[no_mangle]
static OFF_FDT_FD: Global<u32> = Global::new(0);
#[no_mangle]
static OFF_INODE_SB: Global<u32> = Global::new(0);
#[no_mangle]
static OFF_SB_DEV: Global<u32> = Global::new(0);
/// sched/sched_process_exec's `filename` (a `__data_loc`; 0: not read).
#[no_mangle]
static OFF_EXEC_FILENAME: Global<u32> = Global::new(0);

/// The field of `task_struct` at `off` (one of the `OFF_TASK_*` offsets) of `task`, None where
/// the kernel's BTF did not give its place (0).
#[inline(always)]
fn task_field<K: Kernel, T: Copy + Default>(task: u64, off: u32) -> Option<T> {
    (off != 0).then(|| K::read(task, off))
}

/// [`task_field`] of the running task, whose pointer is taken only where the offset is known.
#[inline(always)]
fn current_field<T: Copy + Default>(off: u32) -> Option<T> {
    (off != 0).then(|| Probe::read(unsafe { aya_ebpf::helpers::bpf_get_current_task() }, off))
}

/// Task `task`'s `mm`, 0 where unknown.
#[inline(always)]
pub fn task_mm<K: Kernel>(task: u64) -> u64 {
    task_field::<K, u64>(task, OFF_TASK_MM.load()).unwrap_or(0)
}

/// The running task's `mm`, 0 where unknown.
#[inline(always)]
pub fn current_mm() -> u64 {
    current_field(OFF_TASK_MM.load()).unwrap_or(0)
}

/// The current process's execs so far (`task_struct.self_exec_id`, inherited at fork), 0 when
/// unknown: tells CPU samples of an image from those of the image it exec'd.
#[inline(always)]
pub fn self_exec_id() -> u32 {
    current_field(OFF_TASK_SELF_EXEC_ID.load()).unwrap_or(0)
}

const CLONE_THREAD: u64 = 0x0001_0000;

/// task_newtask runs in the parent; clone_flags tell a new process from a new thread, which
/// sched_process_fork cannot.
#[tracepoint]
pub fn task_newtask(ctx: TracePointContext) -> u32 {
    crate::maps::hit(tracer_common::hits::Prog::TaskNewtask);
    let (tgid, _) = current_ids();
    if !is_traced(tgid) {
        return 0;
    }
    let flags: u64 = unsafe { ctx.read_at(OFF_NEWTASK_FLAGS.load() as usize) }.unwrap_or(0);
    if flags & CLONE_THREAD != 0 {
        return 0;
    }
    let child: i32 = unsafe { ctx.read_at(OFF_NEWTASK_PID.load() as usize) }.unwrap_or(0);
    if child <= 0 {
        return 0;
    }
    let child = child as u32;
    if FOLLOW_CHILDREN.load() != 0 {
        crate::maps::mark_maybe(child);
        if TRACED
            .insert(&child, &tracer_common::proc::TRACED_FOLLOWED, 0)
            .is_err()
        {
            count_drop(Drop::TracedFull);
        }
    }
    emit(ProcEventKind::Fork, child, child, tgid);
    0
}

#[tracepoint]
pub fn sched_process_exec(ctx: TracePointContext) -> u32 {
    crate::maps::hit(tracer_common::hits::Prog::SchedProcessExec);
    let (tgid, tid) = current_ids();
    if is_traced(tgid) {
        let off = OFF_EXEC_OLD_PID.load();
        if off != 0 {
            let old: i32 = unsafe { ctx.read_at(off as usize) }.unwrap_or(0);
            if old > 0 && old as u32 != tid {
                exec_moved(old as u32, tgid, unsafe { bpf_ktime_get_ns() });
            }
        }
        // A new image: its user stacks are new ones, young for its first second, as a new
        // process's (a long-running process that execs its job: a wrapper script).
        if let Some(st) = crate::account::state(tid) {
            crate::account::new_image(st, unsafe { bpf_ktime_get_ns() });
        }
        crate::python::exec(tgid);
        crate::cuda::forget_runtime_text(tgid);
        emit_exec(&ctx, tgid, tid);
    }
    0
}

/// The `Exec` event, with where the new image lies ([`ExecEvent`]): the process may exit
/// before user space, which looks every 10 ms, can read its maps.
#[inline(always)]
fn emit_exec(ctx: &TracePointContext, tgid: u32, tid: u32) {
    let Some(mut entry) = reserve::<ExecEvent>() else {
        return;
    };
    let ev = entry.as_mut_ptr();
    // Written in place: the event is larger than a program's stack allows.
    unsafe {
        (*ev).head = head(ProcEventKind::Exec, tgid, tid, 0, self_exec_id(), 0);
        (*ev).auxv = [0; EXEC_AUXV_WORDS];
        (*ev).path[0] = 0;
        let mm = current_mm();
        let off = OFF_MM_SAVED_AUXV.load();
        if mm != 0 && off != 0 {
            let words = &mut (*ev).auxv;
            let bytes = core::slice::from_raw_parts_mut(
                words.as_mut_ptr().cast::<u8>(),
                core::mem::size_of_val(words),
            );
            // A failed read leaves zeroes: no entries.
            let _ = bpf_probe_read_kernel_buf((mm + off as u64) as *const u8, bytes);
        }
        let (ino, dev) = exe_id(mm).unwrap_or((0, 0));
        (*ev).exe_ino = ino;
        (*ev).exe_dev = dev;
        (*ev)._pad = 0;
        let off = OFF_EXEC_FILENAME.load();
        let loc: u32 = if off != 0 {
            ctx.read_at(off as usize).unwrap_or(0)
        } else {
            0
        };
        // 0: unread (offset 0 would be the record's header).
        if loc != 0 {
            let at = ctx.as_ptr() as usize + (loc & 0xffff) as usize;
            // A failed read leaves the bytes zeroed: no path.
            let _ = bpf_probe_read_kernel_str_bytes(at as *const u8, &mut (*ev).path);
        }
    }
    entry.submit(wake_flags(ProcEventKind::Exec));
}

/// Thread `tid` of young process `tgid` mapped `len` bytes of file `fd`'s code from `offset`
/// at `addr`: where, and which file (its inode and device), for a process that may exit
/// before user space reads its maps.
#[inline(always)]
pub fn mapped_code(
    tgid: u32,
    tid: u32,
    addr: u64,
    len: u64,
    offset: u64,
    fd: i32,
    path: Option<*const u8>,
) {
    let Some((ino, dev)) = fd_file_id(fd) else {
        return;
    };
    let Some(mut entry) = reserve::<MappedCodeEvent>() else {
        return;
    };
    let ev = entry.as_mut_ptr();
    // Written in place: the event is larger than a program's stack allows.
    unsafe {
        (*ev).head = head(ProcEventKind::MappedCode, tgid, tid, 0, 0, 0);
        (*ev).addr = addr;
        (*ev).len = len;
        (*ev).offset = offset;
        (*ev).ino = ino;
        (*ev).dev = dev;
        (*ev)._pad = 0;
        (*ev).path[0] = 0;
        if let Some(p) = path {
            // A failed read leaves zeroes: no path.
            let _ = bpf_probe_read_kernel_buf(p, &mut (*ev).path);
        }
    }
    entry.submit(wake_flags(ProcEventKind::MappedCode));
}

/// The inode number and device of the running task's open file `fd`
/// (`current->files->fdt->fd[fd]`), None where unknown.
#[inline(always)]
fn fd_file_id(fd: i32) -> Option<(u64, u32)> {
    let (files, fdt, max, arr) = (
        OFF_TASK_FILES.load(),
        OFF_FILES_FDT.load(),
        OFF_FDT_MAX_FDS.load(),
        OFF_FDT_FD.load(),
    );
    if files == 0 || fdt == 0 || max == u32::MAX || arr == 0 || fd < 0 {
        return None;
    }
    let files: u64 = current_field(files)?;
    let table: u64 = Probe::read(nonzero(files)?, fdt);
    let table = nonzero(table)?;
    let max: u32 = Probe::read(table, max);
    if fd as u32 >= max {
        return None;
    }
    let arr: u64 = Probe::read(table, arr);
    let file: u64 = Probe::read(nonzero(arr)?, (fd as u32) * 8);
    file_id(file)
}

#[inline(always)]
fn nonzero(p: u64) -> Option<u64> {
    (p != 0).then_some(p)
}

/// The inode number and device of `mm`'s executable (`mm->exe_file`), None where unknown.
#[inline(always)]
fn exe_id(mm: u64) -> Option<(u64, u32)> {
    let exe = OFF_MM_EXE_FILE.load();
    if exe == 0 {
        return None;
    }
    let file: u64 = Probe::read(nonzero(mm)?, exe);
    file_id(file)
}

/// The inode number and device of open file `file`, None where unknown.
#[inline(always)]
fn file_id(file: u64) -> Option<(u64, u32)> {
    let (inode, ino, sb, dev) = (
        OFF_FILE_INODE.load(),
        OFF_INODE_INO.load(),
        OFF_INODE_SB.load(),
        OFF_SB_DEV.load(),
    );
    if inode == 0 || ino == 0 || sb == 0 || dev == 0 {
        return None;
    }
    let node: u64 = Probe::read(nonzero(file)?, inode);
    let node = nonzero(node)?;
    let ino: u64 = Probe::read(node, ino);
    let sb_ptr: u64 = Probe::read(node, sb);
    let dev: u32 = Probe::read(nonzero(sb_ptr)?, dev);
    (ino != 0).then_some((ino, dev))
}

/// A thread other than the leader exec'd (Go's `syscall.Exec` runs on any thread): the kernel
/// gave it the leader's id, and its own (`old`) and the leader's lives end here (the leader is
/// dead already, its final switch-out maybe still to come, under `old` then). The thread runs
/// on as the leader's id, from now, on a CPU. Its old id would never switch out again: its
/// state stayed on a CPU to the window's end, a second process's worth of CPU time.
#[inline(always)]
fn exec_moved(old: u32, tgid: u32, now: u64) {
    use crate::account;
    // Ended from here: the current name is the new image's, not theirs.
    if account::state(old).is_some() {
        account::ended(old, now);
    }
    if account::state(tgid).is_some() {
        account::ended(tgid, now);
    }
    account::born(tgid, tgid, now);
    if let Some(st) = account::state(tgid) {
        unsafe { (*st).phase = tracer_common::wall::PHASE_ONCPU };
    }
}

#[tracepoint]
pub fn sched_process_exit(ctx: TracePointContext) -> u32 {
    crate::maps::hit(tracer_common::hits::Prog::SchedProcessExit);
    let (tgid, tid) = current_ids();
    if !is_traced(tgid) {
        return 0;
    }
    let group_dead: u8 = unsafe { ctx.read_at(OFF_EXIT_GROUP_DEAD.load() as usize) }.unwrap_or(0);
    if group_dead != 0 {
        // Removed here, not by user space later, so a recycled pid is never traced by mistake.
        let _ = TRACED.remove(&tgid);
        crate::cuda::forget_runtime_text(tgid);
        emit_exit(tgid, tid);
    } else {
        emit(ProcEventKind::ThreadExit, tgid, tid, 0);
    }
    0
}

#[inline(always)]
fn emit(kind: ProcEventKind, pid: u32, tid: u32, ppid: u32) {
    emit_arg(kind, pid, tid, ppid, 0);
}

/// `BPF_RB_FORCE_WAKEUP`.
const BPF_RB_FORCE_WAKEUP: u64 = 2;
/// `BPF_RB_AVAIL_DATA`: bytes committed and not yet consumed.
const BPF_RB_AVAIL_DATA: u64 = 0;

/// How an event wakes the event loop. A wake-up (a commit into a ring user space has caught
/// up on) queues an irq_work, a self-interrupt: a VM exit on a guest, 15-20 us of a fork's,
/// an exec's and an exit's program here (~1 us without), and of the `mmap` that maps a
/// program's libc: ~70 us of each short-lived child a shell loop runs. Only a syscall storm,
/// whose programs user space takes off within milliseconds, wakes it; forks, execs, exits
/// and mapped libraries wait for its next look (`PROC_POLL`, 10 ms: a CUDA runtime's first
/// launch comes hundreds of ms after its load), unless the ring is a quarter full.
#[inline(always)]
fn wake_flags(kind: ProcEventKind) -> u64 {
    match kind {
        // Forced: the ring may hold events that did not wake the loop, and an adaptive
        // wake-up only comes to a reader that has caught up.
        ProcEventKind::SyscallStorm => BPF_RB_FORCE_WAKEUP,
        _ if PROC_EVENTS.query(BPF_RB_AVAIL_DATA) >= (PROC_EVENTS_BYTES / 4) as u64 => {
            BPF_RB_FORCE_WAKEUP
        }
        _ => crate::maps::BPF_RB_NO_WAKEUP,
    }
}

/// The process `tgid` ends (its last thread, `tid`, exits): with its wait status (set before
/// this tracepoint), -1 where the kernel's BTF did not give its place.
#[inline(always)]
fn emit_exit(tgid: u32, tid: u32) {
    let code: i32 = current_field(OFF_TASK_EXIT_CODE.load()).unwrap_or(-1);
    emit_full(ProcEventKind::Exit, tgid, tid, 0, 0, code);
}

/// Thread `tid` of `tgid` made a block of syscalls in `took_ns`, too few for the budget: user
/// space, waiting on this ring, takes the syscall programs off at once.
#[inline(always)]
pub fn syscall_storm(tgid: u32, tid: u32, took_ns: u64) {
    emit_arg(
        ProcEventKind::SyscallStorm,
        tgid,
        tid,
        0,
        (took_ns / 1000) as u32,
    );
}

/// Thread `tid` of `tgid` mapped a file executable: user space, reading this ring every
/// 10 ms, looks for a CUDA library in its maps then, before the library's first call.
#[inline(always)]
pub fn mapped_exec(tgid: u32, tid: u32) {
    emit(ProcEventKind::MappedExec, tgid, tid, 0);
}

#[inline(always)]
fn emit_arg(kind: ProcEventKind, pid: u32, tid: u32, ppid: u32, arg: u32) {
    emit_full(kind, pid, tid, ppid, arg, 0);
}

#[inline(always)]
fn emit_full(kind: ProcEventKind, pid: u32, tid: u32, ppid: u32, arg: u32, exit_code: i32) {
    let Some(mut entry) = reserve::<ProcEvent>() else {
        return;
    };
    entry.write(head(kind, pid, tid, ppid, arg, exit_code));
    entry.submit(wake_flags(kind));
}

/// An entry of the process events' ring, counted as lost where the ring is full.
#[inline(always)]
fn reserve<T: 'static>() -> Option<RingBufEntry<T>> {
    let entry = PROC_EVENTS.reserve::<T>(0);
    if entry.is_none() {
        count_drop(Drop::ProcEventsFull);
    }
    entry
}

/// An event's common part, at this instant, with the running task's name.
#[inline(always)]
fn head(kind: ProcEventKind, pid: u32, tid: u32, ppid: u32, arg: u32, exit_code: i32) -> ProcEvent {
    ProcEvent {
        kind: kind as u32,
        pid,
        tid,
        ppid,
        ts_ns: unsafe { bpf_ktime_get_ns() },
        exit_code,
        arg,
        comm: bpf_get_current_comm().unwrap_or([0; 16]),
    }
}
