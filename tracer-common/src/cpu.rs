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
/// Maps of the user stacks of processes younger than [`YOUNG_NS`], and each one's capacity. A
/// stack map keeps one stack a slot (its hash's) until user space deletes it; every short
/// process's user stacks are new ones (its libraries sit at other addresses). A job that runs
/// a program a second (`nvidia-smi`, a shell-out) would fill one shared map in one to two
/// hours (an estimate, at 5-10 new stacks a process), and the job's own stacks from then on
/// (a checkpoint's, an evaluation's) find their slots taken; under a shell loop the shell lost
/// 6% of its samples' stacks in ten minutes. Processes older than a second, the job among
/// them, have a map of their own, which short processes never reach.
///
/// Two maps, new stacks going to one at a time ([`YOUNG_CTL_MAP`]): user space switches them
/// when many young stacks were taken, and frees the stacks of the other map, which nothing
/// writes by then, that nothing holds any more (`gputrace`'s `young` module). One map, freed
/// in place, could not tell a stack freed from one taken again in the same slot meanwhile.
pub const YOUNG_STACKS_MAPS: [&str; 2] = ["YOUNG_STACKS", "YOUNG_STACKS_ODD"];
pub const YOUNG_STACKS_ENTRIES: u32 = 8_192;
/// Which of [`YOUNG_STACKS_MAPS`] takes new stacks (0 or 1): an array of one entry, written by
/// user space.
pub const YOUNG_CTL_MAP: &str = "YOUNG_CTL";
/// The young stacks taken so far, each CPU's (a per-CPU array of one entry): every
/// `bpf_get_stackid`, new stack or not (the helper does not say), is what says when to
/// switch. Per CPU: one counter all CPUs add to would bounce its cache line between them at
/// every young stack under process churn.
pub const YOUNG_TAKEN_MAP: &str = "YOUNG_TAKEN";
/// Below this age of its process (`crate::wall::ThreadState::proc_born_ns`: since its last
/// exec, or its fork; a forked child that has not exec'd is as old as its parent) a thread's
/// user stacks go to [`YOUNG_STACKS_MAPS`], as do those of a thread with no state after the
/// seeding (before it, those of a child forked since the attach:
/// `crate::proc::TRACED_AT_ATTACH`). By process, not thread: a long-running job's new threads
/// and forked workers keep their stacks in the older processes' map, with the job's. A short
/// process that lives past a second still puts the rest of its stacks there.
pub const YOUNG_NS: u64 = 1_000_000_000;
/// Set in the id of a stack of [`YOUNG_STACKS_MAPS`] (ids are under 2^15; errors, negative,
/// are not tagged), with [`YOUNG_ODD_BIT`] for the second map's.
pub const YOUNG_STACK_BIT: i32 = 1 << 30;
pub const YOUNG_ODD_BIT: i32 = 1 << 29;

/// Which map user stack `id` is in, and its slot there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UserStack {
    /// None taken: an errno.
    None(i32),
    /// In `STACKS`.
    Old(u32),
    /// In `YOUNG_STACKS_MAPS[map]`.
    Young { map: usize, slot: u32 },
    /// Given by user space only: a young stack copied out of its map, the copy's index.
    Copied(u32),
}

/// Set with [`YOUNG_STACK_BIT`] in the ids user space gives the young stacks it copies out of
/// their map ([`UserStack::Copied`]); the programs' ids are under it.
pub const COPIED_STACK_BIT: i32 = 1 << 28;

impl UserStack {
    pub const fn of(id: i32) -> UserStack {
        if id < 0 {
            UserStack::None(id)
        } else if id & YOUNG_STACK_BIT == 0 {
            UserStack::Old(id as u32)
        } else if id & COPIED_STACK_BIT != 0 {
            UserStack::Copied((id & (COPIED_STACK_BIT - 1)) as u32)
        } else {
            UserStack::Young {
                map: (id & YOUNG_ODD_BIT != 0) as usize,
                slot: (id & (COPIED_STACK_BIT - 1)) as u32,
            }
        }
    }

    /// The id of the young stack in slot `slot` of map `map`.
    pub const fn young(map: usize, slot: u32) -> i32 {
        slot as i32 | YOUNG_STACK_BIT | if map & 1 != 0 { YOUNG_ODD_BIT } else { 0 }
    }

    /// The id of copy `index`, or `None` past the ids there is room for.
    pub const fn copied(index: u32) -> Option<i32> {
        if index < COPIED_STACK_BIT as u32 {
            Some(index as i32 | YOUNG_STACK_BIT | COPIED_STACK_BIT)
        } else {
            None
        }
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
/// carries [`YOUNG_STACK_BIT`] ([`UserStack`]).
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
        assert!(max <= COPIED_STACK_BIT && COPIED_STACK_BIT < YOUNG_ODD_BIT);
        assert_eq!(UserStack::of(7), UserStack::Old(7));
        assert_eq!(
            UserStack::of(7 | YOUNG_STACK_BIT),
            UserStack::Young { map: 0, slot: 7 }
        );
        assert_eq!(
            UserStack::of(UserStack::young(1, 0)),
            UserStack::Young { map: 1, slot: 0 }
        );
        assert_eq!(
            UserStack::of(UserStack::young(1, 8191)),
            UserStack::Young { map: 1, slot: 8191 }
        );
        assert_eq!(UserStack::young(0, 5), 5 | YOUNG_STACK_BIT);
        let c = UserStack::copied(12_345).unwrap();
        assert_eq!(UserStack::of(c), UserStack::Copied(12_345));
        assert!(UserStack::copied(COPIED_STACK_BIT as u32).is_none());
        assert_eq!(
            UserStack::of(UserStack::copied(COPIED_STACK_BIT as u32 - 1).unwrap()),
            UserStack::Copied(COPIED_STACK_BIT as u32 - 1)
        );
        // Errors are not ids of any map.
        assert_eq!(UserStack::of(-17), UserStack::None(-17));
        assert_eq!(UserStack::of(-14), UserStack::None(-14));
    }
}
