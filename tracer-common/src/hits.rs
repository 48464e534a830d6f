//! Every program counts its own runs in a per-CPU slot (`PROG_HITS`): the kernel's run counts
//! exist only while `kernel.bpf_stats_enabled` is on, which costs every BPF program on the
//! machine two clock reads per run (~150-230 ns per uprobe hit measured on the development VM),
//! so gputrace turns it on only now and then to time the programs and counts hits itself.

/// Per-CPU array of run counters, one slot per program in [`PROGRAMS`] order. The trap
/// calibration's empty programs have none: they are timed with the statistics on.
pub const HITS_MAP: &str = "PROG_HITS";

macro_rules! programs {
    ($($slot:ident = $name:literal),* $(,)?) => {
        /// A program's slot in [`HITS_MAP`].
        #[repr(u32)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Prog { $($slot),* }
        /// The programs' names (as in the object), by slot.
        pub const PROGRAMS: &[&str] = &[$($name),*];
    };
}

programs! {
    CpuSample = "cpu_sample",
    TaskNewtask = "task_newtask",
    SchedProcessExec = "sched_process_exec",
    SchedProcessExit = "sched_process_exit",
    SchedSwitch = "sched_switch",
    SchedSwitchTp = "sched_switch_tp",
    SchedWakeup = "sched_wakeup",
    SchedWakeupTp = "sched_wakeup_tp",
    SchedWakeupNew = "sched_wakeup_new",
    SchedWakeupNewTp = "sched_wakeup_new_tp",
    AcctNewtask = "acct_newtask",
    SysEnter = "sys_enter",
    SysExit = "sys_exit",
    BlockBioQueue = "block_bio_queue",
    BlockBioQueueTp = "block_bio_queue_tp",
    BlockSplit = "block_split",
    BlockSplitTp = "block_split_tp",
    BlockRqInsertTp = "block_rq_insert_tp",
    BlockRqIssue = "block_rq_issue",
    BlockRqIssueTp = "block_rq_issue_tp",
    BlockRqComplete = "block_rq_complete",
    BlockRqCompleteTp = "block_rq_complete_tp",
    BlockBioQueueBtf = "block_bio_queue_btf",
    BlockSplitBtf = "block_split_btf",
    BlockRqIssueBtf = "block_rq_issue_btf",
    BlockRqCompleteBtf = "block_rq_complete_btf",
    BlockBioRemap = "block_bio_remap",
    BlockBioRemapBtf = "block_bio_remap_btf",
    BlockBioRemapTp = "block_bio_remap_tp",
    SchedSwitchBtf = "sched_switch_btf",
    SchedWakeupBtf = "sched_wakeup_btf",
    SchedWakeupNewBtf = "sched_wakeup_new_btf",
    SysEnterBtf = "sys_enter_btf",
    CudaEntry = "cuda_entry",
    CudaRet = "cuda_ret",
    CudaThreadExit = "cuda_thread_exit",
    TaskRename = "task_rename",
}

/// Per-CPU array of [`Paths`], one slot per program in [`PROGRAMS`] order: how the programs
/// that return early for what is not traced split their runs and their time. Their mean per
/// run (the kernel's statistics) mixes a machine's many untraced runs, a few loads each, with
/// the traced ones that do the work: a traced thread's switch costs several times the mean of
/// a busy machine's. Only the programs that have such an early return fill it.
pub const PATHS_MAP: &str = "PROG_PATHS";

/// One `u64`, 1 while the kernel's BPF statistics are held on by gputrace: the programs time
/// their paths only then, in the runs the kernel times.
pub const PATHS_ON_MAP: &str = "PATHS_ON";

/// One run in about this many of each program on each CPU (picked by a hash of its run
/// count) is timed by the program itself while
/// `PATHS_ON_MAP` is 1 (two clock reads, ~15 ns each on the development VM: a few ns a run
/// averaged, in the runs that pay ~45 ns for the statistics anyway).
pub const PATH_SAMPLE_EVERY: u64 = 8;

/// A self-timed run longer than this (ns) is left out of its path's sums: the CPU was taken
/// from the program (an interrupt, the hypervisor), and one such run among a few dozen would
/// be most of its path's mean. Our costliest run, a CPU sample's two stack walks, takes ~10 µs.
pub const PATH_RUN_MAX_NS: u64 = 100_000;

/// A program's runs by path, on one CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Paths {
    /// Runs that did the traced work (every one, not only the timed ones).
    pub traced: u64,
    /// Timed runs ([`PATH_SAMPLE_EVERY`], while `PATHS_ON_MAP` is 1) that did the traced
    /// work, and their time summed.
    pub traced_timed: u64,
    pub traced_ns: u64,
    /// Timed runs that returned early, and their time.
    pub early_timed: u64,
    pub early_ns: u64,
    /// The program's own scratch for the run in progress: when its timing began (0: not
    /// timed), and whether it took the traced path. Kept in the map, not in registers: a
    /// value carried across the program's paths doubles the states the verifier walks. The
    /// kernel does not run a program inside itself on one CPU (the scheduler programs run
    /// with interrupts off; kernels before ~6.10 may nest a block completion's, from a hard
    /// interrupt, in one from a soft interrupt: the inner run then ends the outer one's
    /// timing, which loses that run's path and leaves nothing stale).
    pub start_ns: u64,
    pub in_traced: u64,
}

impl Paths {
    pub fn add(&mut self, o: &Paths) {
        self.traced += o.traced;
        self.traced_timed += o.traced_timed;
        self.traced_ns += o.traced_ns;
        self.early_timed += o.early_timed;
        self.early_ns += o.early_ns;
    }

    /// What was counted since `base` (the same program's counts then).
    pub fn since(&self, base: &Paths) -> Paths {
        Paths {
            traced: self.traced.saturating_sub(base.traced),
            traced_timed: self.traced_timed.saturating_sub(base.traced_timed),
            traced_ns: self.traced_ns.saturating_sub(base.traced_ns),
            early_timed: self.early_timed.saturating_sub(base.early_timed),
            early_ns: self.early_ns.saturating_sub(base.early_ns),
            start_ns: 0,
            in_traced: 0,
        }
    }
}

crate::user_pod!(Paths);

/// The programs that fill [`PATHS_MAP`]: those that return early for the machine's untraced
/// tasks, requests or samples (the classic tracepoints of the block set, for old kernels, do
/// not).
pub const SPLIT: &[Prog] = &[
    Prog::CpuSample,
    Prog::SchedSwitch,
    Prog::SchedSwitchTp,
    Prog::SchedSwitchBtf,
    Prog::SchedWakeup,
    Prog::SchedWakeupTp,
    Prog::SchedWakeupBtf,
    Prog::SysEnter,
    Prog::SysEnterBtf,
    Prog::SysExit,
    Prog::BlockBioQueue,
    Prog::BlockBioQueueBtf,
    Prog::BlockRqIssue,
    Prog::BlockRqIssueBtf,
    Prog::BlockRqComplete,
    Prog::BlockRqCompleteBtf,
];

/// Whether program `name` fills [`PATHS_MAP`].
pub fn splits(name: &str) -> bool {
    SPLIT.iter().any(|p| PROGRAMS[*p as usize] == name)
}

/// The slot of program `name`.
pub fn slot(name: &str) -> Option<usize> {
    PROGRAMS.iter().position(|p| *p == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_names() {
        assert_eq!(PROGRAMS[Prog::CpuSample as usize], "cpu_sample");
        assert_eq!(PROGRAMS[Prog::SysExit as usize], "sys_exit");
        assert_eq!(PROGRAMS[Prog::CudaEntry as usize], "cuda_entry");
        assert_eq!(PROGRAMS[Prog::CudaThreadExit as usize], "cuda_thread_exit");
        assert_eq!(slot("cuda_ret"), Some(Prog::CudaRet as usize));
        assert_eq!(slot("nope"), None);
        assert!(splits("sched_switch_btf") && splits("sys_exit"));
        assert!(!splits("cuda_entry") && !splits("block_rq_issue_tp"));
    }
}
