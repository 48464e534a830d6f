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
/// fresh-clone CI run lost 125 of them). An exec's is 584 ([`ExecEvent`]): ~1,800 of them
/// between two looks (10 ms), where a shell loop makes ~10.
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
    /// A thread of a process in its first second (`pid`, `tid`) mapped a file's code
    /// ([`MappedCodeEvent`]): where, for a process gone before /proc gives its maps.
    MappedCode = 7,
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
            7 => Some(Self::MappedCode),
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

/// Words of the new image's auxiliary vector an exec's event carries: its (type, value) pairs
/// as the kernel saved them (`mm_struct.saved_auxv`). Linux puts `AT_BASE` and `AT_ENTRY`
/// within its first twelve pairs (x86-64, arm64).
pub const EXEC_AUXV_WORDS: usize = 32;
/// Bytes of the exec's file name an exec's event carries (NUL-terminated, cut beyond).
pub const EXEC_PATH_BYTES: usize = 256;

/// An exec's event, as the kernel side sends a [`ProcEventKind::Exec`] where it could read the
/// new image's place: where the executable and its loader lie in memory. A process that execs
/// and exits before user space reads its maps (a shell loop's `true`: most of them) is
/// symbolised with them, not with no maps at all.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ExecEvent {
    pub head: ProcEvent,
    /// `mm_struct.saved_auxv`'s first words, all 0 where the kernel's BTF did not give its
    /// place.
    pub auxv: [u64; EXEC_AUXV_WORDS],
    /// The inode and device (the kernel's `dev_t`: major << 20 | minor) of the executable the
    /// process runs (`mm->exe_file`): tell the file at `path` from another (replaced since,
    /// another mount namespace's, another filesystem's). 0 when unread.
    pub exe_ino: u64,
    pub exe_dev: u32,
    pub _pad: u32,
    /// The file exec'd (the tracepoint's `filename`), as the caller named it: a script's, not
    /// its interpreter's; maybe relative to the caller's directory.
    pub path: [u8; EXEC_PATH_BYTES],
}

crate::user_pod!(ExecEvent);

/// A file's code mapped by a young process (`mmap` with `PROT_EXEC` and a file: the loader
/// mapping a library's text), as [`ProcEventKind::MappedCode`]: with the exec's
/// ([`ExecEvent`]) the process's code where it exits before its maps are read.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MappedCodeEvent {
    pub head: ProcEvent,
    /// Where it was mapped, its length as asked (the mapping rounds it up to a page), and
    /// the file offset it maps from.
    pub addr: u64,
    pub len: u64,
    pub offset: u64,
    /// The file's inode and device (the kernel's `dev_t`: major << 20 | minor), 0 when unread.
    pub ino: u64,
    pub dev: u32,
    pub _pad: u32,
    /// The path the fd was opened by, as the syscall programs kept it (`FD_NAMES`; empty
    /// where they did not): a library no maps read so far named (a `dlopen`ed one, or any
    /// on overlayfs, whose mapped file is another inode than the fd's) is found by it.
    pub path: [u8; crate::wall::FD_NAME_LEN],
}

crate::user_pod!(MappedCodeEvent);

/// The value of auxiliary vector entry `key` (`AT_*`) in `words` ((type, value) pairs, ended by
/// `AT_NULL`).
pub fn auxv_value(words: &[u64], key: u64) -> Option<u64> {
    words
        .chunks_exact(2)
        .take_while(|p| p[0] != 0)
        .find(|p| p[0] == key)
        .map(|p| p[1])
}

/// The loader's load address (the interpreter's bias), 0 for a static executable.
pub const AT_BASE: u64 = 7;
/// The executable's entry point, where its bias shows: `e_entry` plus that bias.
pub const AT_ENTRY: u64 = 9;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_an_auxv_entry_up_to_its_end() {
        let words = [
            33, 0x7000, AT_BASE, 0x7f00, AT_ENTRY, 0x5510, 0, 0, AT_ENTRY, 1,
        ];
        assert_eq!(auxv_value(&words, AT_BASE), Some(0x7f00));
        assert_eq!(auxv_value(&words, AT_ENTRY), Some(0x5510));
        // Past AT_NULL is nothing (a cut vector's zeroes, or stale words).
        assert_eq!(auxv_value(&words, 1), None);
        assert_eq!(auxv_value(&[0; 4], AT_BASE), None);
        // An odd word (a pair cut by the vector's end) is no entry.
        assert_eq!(auxv_value(&[AT_BASE], AT_BASE), None);
    }
}
