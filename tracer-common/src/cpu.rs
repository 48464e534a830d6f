//! CPU sampler: counts per (process, thread, user stack, kernel stack) kept in kernel maps.

/// Map names.
pub const CPU_COUNTS_MAP: &str = "CPU_COUNTS";
pub const STACKS_MAP: &str = "STACKS";

/// Capacity of the sample-count hash; a full map is counted in [`crate::drops::Drop::CpuCountsFull`].
pub const CPU_COUNTS_ENTRIES: u32 = 65_536;
/// Capacity of the shared stack-trace map (user and kernel stacks, also used by off-CPU stacks).
pub const STACKS_ENTRIES: u32 = 32_768;

/// Key of the sample-count map. A negative stack id means no stack was captured
/// (`-EFAULT` for a kernel stack while the CPU was in user mode, `-EEXIST`/`-ENOMEM` when the
/// stack map was full).
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
