//! CPU sampler: counts per (process, thread, user stack, kernel stack) kept in kernel maps.

/// Map names.
pub const CPU_COUNTS_MAP: &str = "CPU_COUNTS";
pub const STACKS_MAP: &str = "STACKS";
pub const KSTACKS_MAP: &str = "KSTACKS";

/// Capacity of the sample-count hash; a full map is counted in [`crate::drops::Drop::CpuCountsFull`].
pub const CPU_COUNTS_ENTRIES: u32 = 65_536;
/// Capacity of the user stacks' map of processes [`YOUNG_NS`] old or more (CPU samples, off-CPU
/// switch-outs, CUDA call sites).
pub const STACKS_ENTRIES: u32 = 32_768;
/// Map of the user stacks of processes younger than [`YOUNG_NS`], and its capacity. A stack map
/// keeps one stack a slot (its hash's) and never frees one; every short process's user stacks
/// are new ones (its libraries sit at other addresses). A job that runs a program a second
/// (`nvidia-smi`, a shell-out) would fill one shared map in one to two hours (an estimate, at
/// 5-10 new stacks a process), and the job's own stacks from then on (a checkpoint's, an
/// evaluation's) find their slots taken; under a shell loop the shell lost 6% of its samples'
/// stacks in ten minutes. Processes older than a second, the job among them, now have a map
/// of their own, which short processes never reach.
pub const YOUNG_STACKS_MAP: &str = "YOUNG_STACKS";
pub const YOUNG_STACKS_ENTRIES: u32 = 16_384;
/// Below this age of its process (`crate::wall::ThreadState::proc_born_ns`: since its last
/// exec, or its fork; a forked child that has not exec'd is as old as its parent) a thread's
/// user stacks go to [`YOUNG_STACKS_MAP`], as do those of a thread with no state after the
/// seeding (before it, those of a child forked since the attach:
/// `crate::proc::TRACED_AT_ATTACH`). By process, not thread: a long-running job's new threads
/// and forked workers keep their stacks in the older processes' map, with the job's. A short
/// process that lives past a second still puts the rest of its stacks there.
pub const YOUNG_NS: u64 = 1_000_000_000;
/// Set in the id of a stack of [`YOUNG_STACKS_MAP`] (ids are under 2^15; errors, negative,
/// are not tagged).
pub const YOUNG_STACK_BIT: i32 = 1 << 30;

/// The map of user stack `id` (whether it is a young process's) and its id there.
pub const fn user_stack_slot(id: i32) -> (bool, i32) {
    if id >= 0 && id & YOUNG_STACK_BIT != 0 {
        (true, id & !YOUNG_STACK_BIT)
    } else {
        (false, id)
    }
}
/// Capacity of the kernel stacks' map. Apart from the user stacks: a stack map keeps one stack
/// per slot (its hash's), and every short process's user stacks are new ones (its libraries
/// sit at other addresses), so under process churn they took the slots and the kernel stacks
/// that followed, of the long-running job too, collided and were lost with them (a third of
/// ten minutes of a shell loop's samples had no stack). The kernel's code is the same for
/// every process: its stacks are far fewer.
pub const KSTACKS_ENTRIES: u32 = 16_384;

/// Key of the sample-count map. A negative stack id means no stack was captured
/// (`-EFAULT` for a kernel stack while the CPU was in user mode, `-EEXIST` when another stack
/// held its slot, `-ENOMEM` when the stack map was full). A young process's user stack id
/// carries [`YOUNG_STACK_BIT`] ([`user_stack_slot`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SampleKey {
    pub pid: u32,
    pub tid: u32,
    pub user_stack_id: i32,
    pub kernel_stack_id: i32,
    pub comm: [u8; 16],
    /// Key of the Python stack in `PY_STACKS`, 0 when none was recorded.
    pub py_stack: u64,
    /// The process's `task_struct.self_exec_id` (its execs so far, inherited at fork) at the
    /// sample, 0 when unknown: which image's maps symbolise it (`ProcEvent::arg` of an exec).
    pub exec_id: u32,
    pub _pad: u32,
}

crate::user_pod!(SampleKey);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_young_processs_stack_id_names_its_map() {
        let max = YOUNG_STACKS_ENTRIES.max(STACKS_ENTRIES) as i32;
        assert!(max <= YOUNG_STACK_BIT);
        assert_eq!(user_stack_slot(7), (false, 7));
        assert_eq!(user_stack_slot(7 | YOUNG_STACK_BIT), (true, 7));
        assert_eq!(user_stack_slot(YOUNG_STACK_BIT), (true, 0));
        // Errors are not ids of either map.
        assert_eq!(user_stack_slot(-17), (false, -17));
        assert_eq!(user_stack_slot(-14), (false, -14));
    }
}
