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
    SchedSwitchBtf = "sched_switch_btf",
    SchedWakeupBtf = "sched_wakeup_btf",
    SchedWakeupNewBtf = "sched_wakeup_new_btf",
    SysEnterBtf = "sys_enter_btf",
    CudaEntry = "cuda_entry",
    CudaRet = "cuda_ret",
    CudaThreadExit = "cuda_thread_exit",
    TaskRename = "task_rename",
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
    }
}
