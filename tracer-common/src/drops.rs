//! Counters of everything the kernel side could not record, one slot per reason in the per-CPU
//! array `DROPS`. Every report shows the non-zero ones: gputrace never loses data silently.

pub const DROPS_MAP: &str = "DROPS";

/// One slot per reason. New reasons go at the end; `COUNT` is the array size.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drop {
    /// `CPU_COUNTS` was full: a CPU sample was not counted.
    CpuCountsFull = 0,
    /// A stack-trace map had no free slot (`-ENOMEM`): a sample was counted without its stack.
    StackMapFull = 1,
    /// The process-event ring buffer was full: a fork/exec/exit event was lost.
    ProcEventsFull = 2,
    /// `TRACED` was full: a child process could not be followed.
    TracedFull = 3,
    /// Per-thread state map was full: a thread's time could not be accounted.
    ThreadStateFull = 4,
    /// Time-accounting map was full.
    TimeMapFull = 5,
    /// Syscall statistics map was full.
    SyscallMapFull = 6,
    /// Block I/O maps were full.
    BlockMapFull = 7,
    /// CUDA statistics maps (per-thread call state, call counts, launches, copies, errors) were
    /// full.
    CudaFull = 8,
    /// The CUDA event ring buffer was full: an allocation, free or kernel-name event was lost.
    CudaEventsFull = 9,
    /// Two user stacks hashed to one slot of the user stacks' map of processes a second old or
    /// more (it keeps the first): a sample or wait was counted without its user stack. Grows
    /// with the number of distinct stacks, and with the waits of a thread whose stack lost its
    /// slot (each counted: its failed walk is reused, not tried again, since 2026-11-25).
    /// Kernel stacks and young processes' user stacks have their own maps and counters
    /// ([`Drop::KernelStackCollision`], [`Drop::YoungStackCollision`]) since 2026-12-07.
    StackCollision = 10,
    /// The kernel failed to store a stack for another reason than a full map or a collision
    /// (for example its stack map's lock was contended): a sample or wait was counted without
    /// its stack.
    StackFailed = 11,
    /// A request's address was issued again (or its slot held for 5 minutes) while the last
    /// request issued there was never seen completing: no `block_rq_complete` run for it (on
    /// the development VM, Linux 6.18, 0.1-0.6% of a direct-I/O reader's requests, with
    /// bpftrace alone as well, and no recursion misses). Raw block programs only.
    BlockNoCompletion = 12,
    /// The timeline ring buffer was full: an event of trace.json was lost.
    TimelineFull = 13,
    /// A traced thread's switch onto a CPU ran no program (the kernel ran none for that switch:
    /// on the development VM it runs no BPF program while the sandbox's own agent is current,
    /// bpftrace alike), found by the thread's next program of its own (syscall entry or exit,
    /// CUDA call entry, CPU sample, switch-out), which closed its wait at the arrival the
    /// scheduler stamped (`sched_info.last_arrival`; where the BTF lacks it, where found).
    SwitchInUnseen = 14,
    /// A traced request completed with no issue stamp, where no `block_rq_issue` program runs
    /// (the disks' queues stamped their issues as the trace began; this one stopped, or is
    /// new): timed from its allocation, its queueing in its latency; with no allocation stamp
    /// either, not counted at all.
    BlockIssueUnstamped = 15,
    /// The per-file I/O map (`FILEIO`) or the fd generations (`FD_GEN`) were full: a file's
    /// I/O row was lost, or a closed fd's next file adds to its row.
    FileMapFull = 16,
    /// Every slot of a file-name set (`FD_NAMES`) held a file still open: the oldest name was
    /// overwritten, and that file's I/O reads `<closed fd N>` unless /proc named it first.
    FileNameLost = 17,
    /// As [`Drop::StackCollision`], for the kernel stacks' map: a sample counted without its
    /// kernel stack (still as taken in kernel mode), a wait classified without its kernel
    /// stack (by its syscall and file).
    KernelStackCollision = 18,
    /// As [`Drop::StackCollision`], for the user stacks of processes younger than a second
    /// (`tracer_common::cpu::YOUNG_NS`: short processes', and the first second after any
    /// process's exec; a forked child that has not exec'd is as old as its parent), which
    /// have their own maps (two taken in turn, each freed of what nothing holds before it
    /// takes new stacks: `crate::cpu::YOUNG_STACKS_MAPS`). By thread until 2026-12-07
    /// (evening): a job's new thread was young too.
    YoungStackCollision = 19,
}

impl Drop {
    pub const COUNT: u32 = 20;

    pub const ALL: [Drop; 20] = [
        Drop::CpuCountsFull,
        Drop::StackMapFull,
        Drop::StackCollision,
        Drop::YoungStackCollision,
        Drop::KernelStackCollision,
        Drop::StackFailed,
        Drop::ProcEventsFull,
        Drop::TracedFull,
        Drop::ThreadStateFull,
        Drop::TimeMapFull,
        Drop::SyscallMapFull,
        Drop::FileMapFull,
        Drop::FileNameLost,
        Drop::BlockMapFull,
        Drop::BlockNoCompletion,
        Drop::BlockIssueUnstamped,
        Drop::CudaFull,
        Drop::CudaEventsFull,
        Drop::TimelineFull,
        Drop::SwitchInUnseen,
    ];

    /// The programs that count this reason (kernel side), for the report.
    pub fn programs(self) -> &'static str {
        match self {
            Drop::CpuCountsFull => "cpu_sample",
            Drop::StackMapFull => "cpu_sample, sched_switch",
            Drop::StackCollision => "cpu_sample, sched_switch",
            Drop::KernelStackCollision => "cpu_sample, sched_switch",
            Drop::YoungStackCollision => "cpu_sample, sched_switch",
            Drop::StackFailed => "cpu_sample, sched_switch",
            Drop::ProcEventsFull => "task_newtask, sched_process_exec, sched_process_exit",
            Drop::TracedFull => "task_newtask",
            Drop::ThreadStateFull => "sched_switch, task_newtask (thread birth and death)",
            Drop::TimeMapFull => "sched_switch, sched_wakeup, sys_exit (time sums)",
            Drop::SyscallMapFull => {
                "sys_enter, sys_exit (and the switch-out or death that writes out a held row)"
            }
            Drop::FileMapFull => {
                "sys_exit (and the switch-out or death that writes out a held row)"
            }
            Drop::FileNameLost => "sys_exit (an open, pipe, socket or accept naming its fd)",
            Drop::BlockMapFull => "block_rq_issue, block_rq_complete, block_bio_queue",
            Drop::BlockNoCompletion => "block_rq_issue",
            Drop::BlockIssueUnstamped => "block_rq_complete",
            Drop::CudaFull => "cuda_entry, cuda_ret",
            Drop::CudaEventsFull => "cuda_ret",
            Drop::TimelineFull => {
                "sched_switch (and the programs that close an unseen switch-in), sys_exit, \
                 block_rq_complete, cuda_ret"
            }
            Drop::SwitchInUnseen => {
                "sys_enter, sys_exit, cuda_entry, cpu_sample, sched_switch (switch-out)"
            }
        }
    }

    /// What a drop of this kind makes incomplete, for the report.
    pub fn describe(self) -> &'static str {
        match self {
            Drop::CpuCountsFull => "CPU samples not counted (sample map full)",
            Drop::StackMapFull => "CPU/off-CPU samples counted without a stack (stack map full)",
            Drop::StackCollision => {
                "CPU/off-CPU samples of processes a second old or more counted without their \
                 user stack (another stack held its slot in their user stacks' map)"
            }
            Drop::YoungStackCollision => {
                "CPU/off-CPU samples of processes under a second old (short processes') counted \
                 without their user stack (another stack held its slot in their user stacks' \
                 map, apart from the older processes')"
            }
            Drop::KernelStackCollision => {
                "CPU samples counted without their kernel stack (in kernel mode all the \
                 same), waits classified without it (by their syscall and file): another stack \
                 held its slot in the kernel stacks' map"
            }
            Drop::StackFailed => {
                "CPU/off-CPU samples counted without a stack (the kernel could not store it: \
                 not a full map)"
            }
            Drop::ProcEventsFull => "process fork/exec/exit events lost (ring buffer full)",
            Drop::TracedFull => "child processes not followed (traced-process map full)",
            Drop::ThreadStateFull => "threads whose time could not be accounted (thread map full)",
            Drop::TimeMapFull => "time-accounting entries lost (map full)",
            Drop::SyscallMapFull => "syscall statistics lost (map full)",
            Drop::FileMapFull => {
                "per-file I/O incomplete (file map full): a file's row lost, or a later file \
                 on a closed fd counted under the earlier one's"
            }
            Drop::FileNameLost => {
                "open files whose opening path was overwritten (name sets full): their I/O \
                 reads `<closed fd N>` unless /proc named them first"
            }
            Drop::BlockMapFull => "block I/O requests not tracked (map full)",
            Drop::BlockNoCompletion => {
                "block I/O requests issued but never seen completing (no block_rq_complete run \
                 for them): missing from request counts and latencies"
            }
            Drop::BlockIssueUnstamped => {
                "block I/O requests completed without the kernel's issue stamp: timed from \
                 their allocation (queueing in the latency), or not counted where that stamp \
                 is missing too"
            }
            Drop::CudaFull => "CUDA call statistics lost (map full)",
            Drop::CudaEventsFull => {
                "CUDA allocation/free and kernel-name events lost (ring buffer full): memory \
                 figures and kernel names incomplete"
            }
            Drop::TimelineFull => "timeline events (trace.json) lost (ring buffer full)",
            Drop::SwitchInUnseen => {
                "switches onto a CPU that ran no program (the kernel skipped them): each wait \
                 was closed by the thread's next program of its own, at the arrival the \
                 scheduler stamped"
            }
        }
    }
}
