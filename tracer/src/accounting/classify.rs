//! Why a thread was off CPU: a pure function of what the kernel recorded at switch-out (the
//! syscall in progress, the task state, the kernel stack). Table driven: a new category or a
//! new rule is one entry. The rules are documented in docs/attribution.md.

use tracer_common::time::Category;

use super::syscall_names;

/// Kernel functions that say what a blocked thread waits for, matched as prefixes from the
/// innermost frame outwards; the first frame that matches decides.
pub const STACK_RULES: &[(&str, Category)] = &[
    ("futex_", Category::Lock),
    ("do_nanosleep", Category::Sleep),
    ("hrtimer_nanosleep", Category::Sleep),
    ("pipe_", Category::Ipc),
    ("anon_pipe_", Category::Ipc),
    ("unix_", Category::Ipc),
    // A terminal's other end is a process (the terminal emulator, sshd): a shell or a job
    // waiting for its input waits on it, not on a disk.
    ("n_tty_", Category::Ipc),
    ("tty_", Category::Ipc),
    ("eventfd_", Category::Ipc),
    ("signalfd_", Category::Ipc),
    ("timerfd_", Category::Sleep),
    ("inotify_", Category::Poll),
    ("fanotify_", Category::Poll),
    ("do_wait", Category::Ipc),
    ("kernel_wait4", Category::Ipc),
    ("do_msgrcv", Category::Ipc),
    ("do_semtimedop", Category::Ipc),
    ("tcp_", Category::Net),
    ("udp_", Category::Net),
    ("inet_", Category::Net),
    ("sk_wait_data", Category::Net),
    ("sk_stream_wait", Category::Net),
    ("do_sys_poll", Category::Poll),
    ("do_select", Category::Poll),
    ("core_sys_select", Category::Poll),
    ("ep_poll", Category::Poll),
    ("do_epoll_wait", Category::Poll),
    ("io_schedule", Category::Io),
    ("folio_wait", Category::Io),
    ("wait_on_page", Category::Io),
    ("blk_", Category::Io),
    ("bio_", Category::Io),
    ("submit_bio_wait", Category::Io),
    ("iomap_", Category::Io),
    ("filemap_", Category::Io),
    ("__blkdev_direct_IO", Category::Io),
    ("jbd2_", Category::Io),
    ("io_cqring_wait", Category::Io),
];

/// Pairs of kernel functions that say together what neither says alone: (inner prefix, the
/// frame right outside it, category), checked with [`STACK_RULES`] at each frame. A parent in
/// `vfork` (`posix_spawn`, Python's `subprocess`) waits in `wait_for_completion_*` inside
/// `kernel_clone` (where `wait_for_vfork_done` is inlined) until its child execs or exits, in
/// an uninterruptible sleep that fell through to `io`: it waits on a child, as `wait4` does.
pub const PAIR_RULES: &[(&str, &str, Category)] = &[
    ("wait_for_vfork_done", "", Category::Ipc),
    ("wait_for_completion", "kernel_clone", Category::Ipc),
    // Before Linux 5.10.
    ("wait_for_completion", "_do_fork", Category::Ipc),
];

/// The category of frame `i` of `frames` (innermost first) by [`PAIR_RULES`], if any.
fn pair_rule(frames: &[&str], i: usize) -> Option<Category> {
    let outer = frames.get(i + 1).copied().unwrap_or("");
    PAIR_RULES
        .iter()
        .find(|(inner, out, _)| frames[i].starts_with(inner) && outer.starts_with(out))
        .map(|(_, _, c)| *c)
}

/// Prefixes of generic wait primitives that say nothing of what is awaited (eventfd and timerfd
/// reads wait in `do_wait_intr_irq`, `wait_for_completion` in `do_wait_for_common` where it is
/// not inlined): skipped before the rules, so that `do_wait` (a wait for a child) does not
/// take them.
pub const GENERIC_WAITS: &[&str] = &["do_wait_intr", "do_wait_for_common"];

/// User functions that name the wait more precisely than the kernel can, matched exactly from the
/// innermost user frame outwards; checked before the kernel rules (the GIL is a futex underneath).
pub const USER_RULES: &[(&str, Category)] = &[
    // CPython 3.x: threads waiting for the GIL sit in take_gil (ceval_gil.c).
    ("take_gil", Category::Gil),
];

/// When the stack says nothing (or was not captured): the syscall in progress.
pub const SYSCALL_RULES: &[(&str, Category)] = &[
    ("futex", Category::Lock),
    ("futex_waitv", Category::Lock),
    ("nanosleep", Category::Sleep),
    ("clock_nanosleep", Category::Sleep),
    ("pause", Category::Sleep),
    ("poll", Category::Poll),
    ("ppoll", Category::Poll),
    ("select", Category::Poll),
    ("pselect6", Category::Poll),
    ("epoll_wait", Category::Poll),
    ("epoll_pwait", Category::Poll),
    ("epoll_pwait2", Category::Poll),
    ("read", Category::Io),
    ("write", Category::Io),
    ("pread64", Category::Io),
    ("pwrite64", Category::Io),
    ("readv", Category::Io),
    ("writev", Category::Io),
    ("preadv", Category::Io),
    ("pwritev", Category::Io),
    ("preadv2", Category::Io),
    ("pwritev2", Category::Io),
    ("fsync", Category::Io),
    ("fdatasync", Category::Io),
    ("sync_file_range", Category::Io),
    ("openat", Category::Io),
    ("open", Category::Io),
    ("io_uring_enter", Category::Io),
    ("io_getevents", Category::Io),
    ("recvfrom", Category::Net),
    ("sendto", Category::Net),
    ("recvmsg", Category::Net),
    ("sendmsg", Category::Net),
    ("accept", Category::Net),
    ("accept4", Category::Net),
    ("connect", Category::Net),
    ("wait4", Category::Ipc),
    ("waitid", Category::Ipc),
    ("msgrcv", Category::Ipc),
    ("semop", Category::Ipc),
    ("semtimedop", Category::Ipc),
];

/// `prev_state` bit of uninterruptible sleep (D).
pub const TASK_UNINTERRUPTIBLE: u32 = 0x2;
/// `prev_state` bits of a stopped task (T: SIGSTOP, a terminal's Ctrl-Z) and of one stopped
/// by a tracer (t: a debugger, strace), in the tracepoint's report form.
pub const TASK_STOPPED: u32 = 0x4;
pub const TASK_TRACED: u32 = 0x8;

/// A classified off-CPU interval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub category: Category,
    /// The syscall, or `D state` / `no syscall`, shown next to the category in reports.
    pub reason: String,
}

/// A wait the kernel saw on a futex word inside the interpreter's GIL: `gil` whatever the stacks
/// say (which need frame pointers through libpython to show `take_gil`).
pub fn gil_wait(sys_nr: i32) -> Verdict {
    Verdict {
        category: Category::Gil,
        reason: format!("{} on the GIL", syscall_names::name(sys_nr as i64)),
    }
}

/// Classifies blocked time from the kernel stack and the syscall only.
pub fn blocked(sys_nr: i32, state: u32, kernel_frames: &[&str]) -> Verdict {
    blocked_with_user(sys_nr, state, kernel_frames, &[])
}

/// Classifies blocked time. `kernel_frames` and `user_frames` are function names, innermost
/// first.
pub fn blocked_with_user(
    sys_nr: i32,
    state: u32,
    kernel_frames: &[&str],
    user_frames: &[&str],
) -> Verdict {
    blocked_with_file(sys_nr, state, kernel_frames, user_frames, None)
}

/// Syscalls whose first argument is the fd they wait on (the kernel keeps the fd only for
/// those numbered under 64: `fd_syscall_mask`).
pub const FD_SYSCALLS: &[&str] = &[
    "read",
    "write",
    "pread64",
    "pwrite64",
    "readv",
    "writev",
    "preadv",
    "pwritev",
    "preadv2",
    "pwritev2",
    "recvfrom",
    "recvmsg",
    "recvmmsg",
    "sendto",
    "sendmsg",
    "sendmmsg",
    "accept",
    "accept4",
    "connect",
    "fsync",
    "fdatasync",
    "splice",
    "tee",
    "ioctl",
    "flock",
];

/// Whether syscall `nr` is one of [`FD_SYSCALLS`] (a negative `nr` is none).
pub fn takes_fd_first(nr: i32) -> bool {
    nr >= 0 && FD_SYSCALLS.contains(&syscall_names::name(nr as i64).as_str())
}

/// The syscalls of [`FD_SYSCALLS`] numbered under 64, as a bit mask (the eBPF crate's
/// `FD_SYSCALL_MASK`): the x86-64 numbers (`syscall_names`); elsewhere none.
pub fn fd_syscall_mask() -> u64 {
    if !cfg!(target_arch = "x86_64") {
        return 0;
    }
    FD_SYSCALLS
        .iter()
        .filter_map(|n| syscall_names::nr(n))
        .filter(|&nr| (0..64).contains(&nr))
        .fold(0, |m, nr| m | 1 << nr)
}

/// The category a wait on file `name` has by [`FILE_RULES`], if any.
pub fn file_category(name: &str) -> Option<Category> {
    FILE_RULES
        .iter()
        .find(|(p, _)| name.starts_with(p))
        .map(|(_, c)| *c)
}

/// What waiting on a file of this name (as /proc shows an fd) is, where the name says more
/// than the syscall: a read of a pipe is not a disk's.
const FILE_RULES: &[(&str, Category)] = &[
    ("pipe:", Category::Ipc),
    ("socket:", Category::Net),
    ("anon_inode:[eventfd]", Category::Ipc),
    ("anon_inode:[signalfd]", Category::Ipc),
    ("anon_inode:[timerfd]", Category::Sleep),
    ("anon_inode:inotify", Category::Poll),
    ("/dev/pts/", Category::Ipc),
    ("/dev/tty", Category::Ipc),
    ("/dev/ptmx", Category::Ipc),
];

/// As [`blocked_with_user`], with the file the syscall waits on where the wait has no kernel
/// stack (`WallKey::fd1`: the walk failed, or stacks are off): it decides before the syscall,
/// for the syscalls that take an fd first.
pub fn blocked_with_file(
    sys_nr: i32,
    state: u32,
    kernel_frames: &[&str],
    user_frames: &[&str],
    file: Option<&str>,
) -> Verdict {
    // Stopped, not waiting for anything: a thread stopped while it slept was woken by the
    // signal and stops outside the wait (its syscall is restarted when it is continued), and
    // was reported sleeping, or "other: no syscall", for as long as it was stopped.
    if state & (TASK_STOPPED | TASK_TRACED) != 0 {
        return Verdict {
            category: Category::Other,
            reason: if state & TASK_STOPPED != 0 {
                "stopped (SIGSTOP)".into()
            } else {
                "stopped by a tracer".into()
            },
        };
    }
    let by_file = file
        .filter(|_| kernel_frames.is_empty() && takes_fd_first(sys_nr))
        .and_then(file_category);
    let reason = if sys_nr >= 0 {
        syscall_names::name(sys_nr as i64)
    } else if sys_nr == tracer_common::wall::SYSCALL_UNSEEN {
        // The syscall programs were off (a syscall storm under the budget): what the stack
        // can still name. A wait for a child is not a wait for data (the verdicts tell them
        // apart by the syscall).
        if kernel_frames
            .iter()
            .any(|f| *f == "do_wait" || *f == "kernel_wait4")
        {
            "wait4".to_string()
        } else {
            "syscall unseen".to_string()
        }
    } else if state & TASK_UNINTERRUPTIBLE != 0 {
        "D state".to_string()
    } else {
        "no syscall".to_string()
    };
    for f in user_frames {
        if let Some((_, c)) = USER_RULES.iter().find(|(n, _)| f == n) {
            return Verdict {
                category: *c,
                reason,
            };
        }
    }
    for (i, f) in kernel_frames.iter().enumerate() {
        if GENERIC_WAITS.iter().any(|g| f.starts_with(g)) {
            continue;
        }
        let rule = STACK_RULES.iter().find(|(p, _)| f.starts_with(p));
        if let Some(category) = rule
            .map(|(_, c)| *c)
            .or_else(|| pair_rule(kernel_frames, i))
        {
            return Verdict { category, reason };
        }
    }
    if let Some(category) = by_file {
        return Verdict { category, reason };
    }
    if sys_nr >= 0 {
        let name = syscall_names::name(sys_nr as i64);
        if let Some((_, c)) = SYSCALL_RULES.iter().find(|(n, _)| *n == name) {
            return Verdict {
                category: *c,
                reason,
            };
        }
    }
    let category = if state & TASK_UNINTERRUPTIBLE != 0 {
        // Uninterruptible sleep outside any known wait is almost always I/O (page faults on
        // mmap'd files, writeback throttling).
        Category::Io
    } else {
        Category::Other
    };
    Verdict { category, reason }
}

/// Runqueue time: preempted while runnable, or woken and waiting for a CPU.
pub fn runqueue_reason(state: u32) -> &'static str {
    if state == tracer_common::wall::RQ_PREEMPTED {
        "preempted"
    } else {
        "woken, waiting for a CPU"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nr(n: &str) -> i32 {
        syscall_names::nr(n).unwrap() as i32
    }

    #[test]
    fn the_kernel_keeps_the_fd_of_the_fd_syscalls_under_64() {
        let m = fd_syscall_mask();
        if !cfg!(target_arch = "x86_64") {
            assert_eq!(m, 0);
            return;
        }
        for n in [
            "read", "write", "pread64", "readv", "recvfrom", "sendmsg", "accept",
        ] {
            assert_ne!(m & 1 << nr(n), 0, "{n}");
        }
        for n in ["wait4", "futex", "nanosleep", "poll", "select", "openat"] {
            let nr = nr(n);
            assert!(nr >= 64 || m & 1 << nr == 0, "{n}");
        }
    }

    #[test]
    fn a_stopped_thread_is_stopped_whatever_it_was_in() {
        let v = blocked_with_user(nr("clock_nanosleep"), TASK_STOPPED | 1, &[], &[]);
        assert_eq!(
            v,
            Verdict {
                category: Category::Other,
                reason: "stopped (SIGSTOP)".into()
            }
        );
        let v = blocked_with_user(-1, TASK_TRACED, &["do_signal_stop"], &[]);
        assert_eq!(v.reason, "stopped by a tracer");
        // A plain sleep is still a sleep.
        let v = blocked_with_user(nr("clock_nanosleep"), 1, &[], &[]);
        assert_eq!(v.category, Category::Sleep);
    }

    #[test]
    fn a_wait_without_a_stack_is_told_by_its_file() {
        let file = |sys: &str, frames: &[&str], f: &str| {
            blocked_with_file(nr(sys), 1, frames, &[], Some(f)).category
        };
        // The walk failed: a pipe's read is not a disk's, a socket's is the network.
        assert_eq!(file("read", &[], "pipe:[831772]"), Category::Ipc);
        assert_eq!(file("recvfrom", &[], "socket:[9]"), Category::Net);
        assert_eq!(file("read", &[], "socket:[9]"), Category::Net);
        assert_eq!(file("read", &[], "/dev/pts/3"), Category::Ipc);
        // A regular file says nothing more than the syscall.
        assert_eq!(file("pread64", &[], "/data/train.bin"), Category::Io);
        // A stack, where there is one, decides.
        assert_eq!(file("read", &["io_schedule"], "pipe:[1]"), Category::Io);
        // Only a syscall whose first argument is an fd names a file.
        assert_eq!(
            blocked_with_file(nr("nanosleep"), 1, &[], &[], Some("pipe:[1]")).category,
            Category::Sleep
        );
        assert_eq!(
            blocked_with_file(nr("read"), 1, &[], &[], None).category,
            Category::Io
        );
    }

    /// The frames this VM's 6.18 showed for a parent in `vfork` while its child slept before
    /// exec (`wait_for_vfork_done` inlined), in uninterruptible sleep.
    #[test]
    fn a_vfork_parent_waits_on_its_child_not_a_disk() {
        let frames = [
            "__schedule",
            "schedule",
            "schedule_timeout",
            "__wait_for_common",
            "wait_for_completion_state",
            "kernel_clone",
            "__do_sys_vfork",
        ];
        for sys in ["vfork", "clone", "clone3"] {
            let v = blocked(nr(sys), TASK_UNINTERRUPTIBLE, &frames);
            assert_eq!(v.category, Category::Ipc, "{sys}");
            assert_eq!(v.reason, sys);
        }
        let v = blocked(nr("vfork"), TASK_UNINTERRUPTIBLE, &["wait_for_vfork_done"]);
        assert_eq!(v.category, Category::Ipc);
        // A completion awaited elsewhere is not a child's.
        let v = blocked(
            -1,
            TASK_UNINTERRUPTIBLE,
            &["wait_for_completion_state", "flush_work"],
        );
        assert_eq!(v.category, Category::Io);
    }

    #[test]
    fn stack_decides_before_syscall() {
        // A read on a pipe is IPC, not file I/O.
        let v = blocked(nr("read"), 1, &["schedule", "pipe_read", "vfs_read"]);
        assert_eq!(v.category, Category::Ipc);
        // Linux 6.18 names it anon_pipe_read.
        let v = blocked(nr("read"), 1, &["schedule", "anon_pipe_read", "vfs_read"]);
        assert_eq!(v.category, Category::Ipc);
        assert_eq!(v.reason, "read");
        let v = blocked(nr("read"), 1, &["schedule", "sk_wait_data", "tcp_recvmsg"]);
        assert_eq!(v.category, Category::Net);
        let v = blocked(
            nr("pread64"),
            2,
            &["io_schedule", "__iomap_dio_rw", "ext4_file_read_iter"],
        );
        assert_eq!(v.category, Category::Io);
        let v = blocked(nr("recvfrom"), 1, &["schedule", "unix_stream_read_generic"]);
        assert_eq!(v.category, Category::Ipc);
    }

    /// Reads that wait on something other than a disk, with the kernel frames this VM's 6.18
    /// showed in /proc/PID/stack for each: a read that falls through to its syscall is `io`.
    #[test]
    fn reads_of_terminals_and_event_fds_are_not_disk_io() {
        let read = nr("read");
        let cases: &[(&[&str], Category)] = &[
            (
                &["wait_woken", "n_tty_read", "tty_read", "vfs_read"],
                Category::Ipc,
            ),
            (
                &["do_wait_intr_irq", "eventfd_read", "vfs_read"],
                Category::Ipc,
            ),
            (
                &["do_wait_intr_irq", "timerfd_read_iter", "vfs_read"],
                Category::Sleep,
            ),
            (&["wait_woken", "inotify_read", "vfs_read"], Category::Poll),
            (&["signalfd_read_iter", "vfs_read"], Category::Ipc),
            // A wait for a child is still one.
            (
                &["do_wait", "kernel_wait4", "__do_sys_wait4"],
                Category::Ipc,
            ),
        ];
        for (frames, want) in cases {
            let v = blocked(read, 1, frames);
            assert_eq!(v.category, *want, "{frames:?}");
            assert_eq!(v.reason, "read");
        }
        // A generic wait alone says nothing: the syscall decides, or the frames around it.
        assert_eq!(
            blocked(read, 1, &["do_wait_intr_irq"]).category,
            Category::Io
        );
        let v = blocked(
            read,
            1,
            &["do_wait_intr_irq.constprop.0", "timerfd_read_iter"],
        );
        assert_eq!(v.category, Category::Sleep);
        let v = blocked(-1, 2, &["do_wait_for_common", "submit_bio_wait"]);
        assert_eq!(v.category, Category::Io);
    }

    #[test]
    fn syscall_when_stack_is_silent() {
        assert_eq!(blocked(nr("futex"), 1, &[]).category, Category::Lock);
        assert_eq!(
            blocked(nr("clock_nanosleep"), 1, &["schedule"]).category,
            Category::Sleep
        );
        assert_eq!(blocked(nr("epoll_wait"), 1, &[]).category, Category::Poll);
        assert_eq!(blocked(nr("read"), 1, &[]).category, Category::Io);
        assert_eq!(blocked(nr("wait4"), 1, &[]).category, Category::Ipc);
    }

    #[test]
    fn unknown_is_other_with_its_syscall_named_and_d_state_is_io() {
        let v = blocked(nr("getrandom"), 1, &["schedule"]);
        assert_eq!(v.category, Category::Other);
        assert_eq!(v.reason, "getrandom");
        let v = blocked(-1, 2, &["schedule"]);
        assert_eq!(v.category, Category::Io);
        assert_eq!(v.reason, "D state");
        assert_eq!(blocked(-1, 1, &[]).reason, "no syscall");
        // The syscall programs off: the category from the stack, a child wait still named.
        let unseen = tracer_common::wall::SYSCALL_UNSEEN;
        let v = blocked(unseen, 1, &["schedule", "pipe_read"]);
        assert_eq!(v.reason, "syscall unseen");
        assert_eq!(v.category, Category::Ipc);
        assert_eq!(blocked(unseen, 1, &["schedule", "do_wait"]).reason, "wait4");
    }

    #[test]
    fn python_gil_wait_is_gil_not_lock() {
        let k = ["schedule", "futex_wait_queue", "__futex_wait"];
        let v = blocked_with_user(nr("futex"), 1, &k, &["pthread_cond_timedwait", "take_gil"]);
        assert_eq!(v.category, Category::Gil);
        assert_eq!(v.reason, "futex");
        let v = blocked_with_user(nr("futex"), 1, &k, &["pthread_cond_wait", "queue_get"]);
        assert_eq!(v.category, Category::Lock);
    }

    #[test]
    fn every_syscall_rule_names_a_real_syscall() {
        for (n, _) in SYSCALL_RULES {
            assert!(syscall_names::nr(n).is_some(), "{n} is not a syscall name");
        }
    }
}
