//! Traced-process set and process lifecycle events.
//!
//! `TRACED` holds the tgids being traced. The kernel adds children itself at fork (when
//! following children is on), so a child is traced from its first instruction; user space learns
//! of it from a [`ProcEvent`] on the `PROC_EVENTS` ring buffer.

pub const TRACED_MAP: &str = "TRACED";
pub const PROC_EVENTS_MAP: &str = "PROC_EVENTS";
pub const TRACED_ENTRIES: u32 = 16_384;
/// `TRACED` values: a process user space traced at the attach (the targets, their
/// descendants then, a launched command), and a child the kernel added at its fork. Before the
/// threads are seeded, a thread with no state is taken as old when its process is of the
/// first kind (it ran before the attach), as young when of the second.
pub const TRACED_AT_ATTACH: u32 = 1;
pub const TRACED_FOLLOWED: u32 = 0;
/// One byte per id (a tid or a tgid) modulo `MAYBE_SLOTS`: 1 once that id may be traced. Set
/// before any entry for the id goes into `TRACED` or `THREADS` (by the kernel side and by user
/// space), never cleared: the hot tracepoints stop an untraced thread's event at one array
/// read instead of a hash-map miss.
pub const MAYBE_MAP: &str = "MAYBE_IDS";
pub const MAYBE_SLOTS: u32 = 65_536;
/// ~18,700 events of 56 bytes: a thread storm's 8,000 births and 8,000 deaths in under a
/// second fit whole while user space, on a busy host, drains them late (at 256 KiB a
/// fresh-clone CI run lost 125 of them).
pub const PROC_EVENTS_BYTES: u32 = 1024 * 1024;

/// Globals set by the loader.
pub const GLOBAL_FOLLOW_CHILDREN: &str = "FOLLOW_CHILDREN";

#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcEventKind {
    /// A traced process forked a new process (`pid` is the child, `ppid` the parent).
    Fork = 1,
    /// A traced process called exec (`comm` is the new name).
    Exec = 2,
    /// A traced process exited (its last thread ended).
    Exit = 3,
    /// A thread of a traced process exited (`tid`).
    ThreadExit = 4,
    /// A thread of a traced process (`pid`, `tid`) made `SYS_STORM_CALLS` syscalls in `arg`
    /// µs, under [`SYS_STORM_WINDOW_NS`]: its syscall tracepoints cost more than the budget.
    SyscallStorm = 5,
    /// A thread of a traced process (`pid`, `tid`) mapped a file executable (mmap with
    /// PROT_EXEC and a file): a library came in, maybe a CUDA one, to probe before its first
    /// call rather than at the next scan of the process's maps.
    MappedExec = 6,
}

/// A thread's syscalls are timed in blocks of `SYS_STORM_CALLS`, as many as cost the budget
/// of this long; a block shorter than this is a storm. A second, as the launch gate's bucket:
/// a burst (a Python process's imports, a few thousand syscalls) is not a storm.
pub const SYS_STORM_WINDOW_NS: u64 = 1_000_000_000;

impl ProcEventKind {
    pub fn from_u32(v: u32) -> Option<Self> {
        match v {
            1 => Some(Self::Fork),
            2 => Some(Self::Exec),
            3 => Some(Self::Exit),
            4 => Some(Self::ThreadExit),
            5 => Some(Self::SyscallStorm),
            6 => Some(Self::MappedExec),
            _ => None,
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProcEvent {
    /// A [`ProcEventKind`].
    pub kind: u32,
    pub pid: u32,
    pub tid: u32,
    pub ppid: u32,
    /// `bpf_ktime_get_ns` (CLOCK_MONOTONIC) at the event.
    pub ts_ns: u64,
    /// `Exit`: the process's wait status (`task_struct.exit_code`: exit status << 8, or the
    /// signal that killed it), -1 where it could not be read; else 0.
    pub exit_code: i32,
    /// `SyscallStorm`: the µs the block of syscalls took; `Exec`: the process's
    /// `task_struct.self_exec_id` after the exec (0 when unknown); else 0.
    pub arg: u32,
    pub comm: [u8; 16],
}

crate::user_pod!(ProcEvent);
