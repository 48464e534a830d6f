//! Maps and helpers shared by several program families.

use aya_ebpf::{
    bindings::BPF_F_USER_STACK,
    macros::map,
    maps::{Array, HashMap, PerCpuArray, StackTrace},
    programs::tracing::StackIdContext,
};
use tracer_common::{cpu, drops::Drop, hits, proc};

/// tgid -> flags of every traced process (user space seeds it; fork adds children).
#[map(name = "TRACED")]
pub static TRACED: HashMap<u32, u32> = HashMap::with_max_entries(proc::TRACED_ENTRIES, 0);

/// `tracer_common::proc::MAYBE_MAP`: which ids may be traced.
#[map(name = "MAYBE_IDS")]
pub static MAYBE_IDS: Array<u8> = Array::with_max_entries(proc::MAYBE_SLOTS, 0);

/// Whether `id` (a tid or a tgid) may be traced: false is sure, true needs the hash map. An
/// array read the verifier inlines, where a hash-map miss costs ~0.2 µs on the development VM.
#[inline(always)]
pub fn maybe_traced(id: u32) -> bool {
    MAYBE_IDS
        .get(id % proc::MAYBE_SLOTS)
        .is_none_or(|b| *b != 0)
}

/// Marks `id` as possibly traced: before it goes into `TRACED` or gets a thread state.
#[inline(always)]
pub fn mark_maybe(id: u32) {
    if let Some(b) = MAYBE_IDS.get_ptr_mut(id % proc::MAYBE_SLOTS) {
        unsafe { *b = 1 };
    }
}

/// One counter per [`Drop`] reason, per CPU.
#[map(name = "DROPS")]
pub static DROPS: PerCpuArray<u64> = PerCpuArray::with_max_entries(Drop::COUNT, 0);

/// Each program's runs, per CPU (`tracer_common::hits`).
#[map(name = "PROG_HITS")]
pub static PROG_HITS: PerCpuArray<u64> =
    PerCpuArray::with_max_entries(hits::PROGRAMS.len() as u32, 0);

/// Counts a run of program `p`: the first thing every program does.
#[inline(always)]
pub fn hit(p: hits::Prog) {
    if let Some(slot) = PROG_HITS.get_ptr_mut(p as u32) {
        // Per-CPU slot, as `count_drop`.
        unsafe { *slot += 1 };
    }
}

/// As [`hit`], and this CPU's runs of `p` so far.
#[inline(always)]
pub fn hit_count(p: hits::Prog) -> u64 {
    match PROG_HITS.get_ptr_mut(p as u32) {
        Some(slot) => unsafe {
            *slot += 1;
            *slot
        },
        None => 0,
    }
}

/// `tracer_common::hits::PATHS_MAP`.
#[map(name = "PROG_PATHS")]
pub static PROG_PATHS: PerCpuArray<hits::Paths> =
    PerCpuArray::with_max_entries(hits::PROGRAMS.len() as u32, 0);

/// `tracer_common::hits::PATHS_ON_MAP`.
#[map(name = "PATHS_ON")]
static PATHS_ON: Array<u64> = Array::with_max_entries(1, 0);

/// Runs `f` as a run of program `p`, one that returns early for what is not traced
/// (`hits::Paths`): counted as [`hit`] does, and one run in `PATH_SAMPLE_EVERY` on this CPU
/// timed, while user space has the kernel's statistics on (`PATHS_ON`). `f` calls [`traced`]
/// where it takes the traced path.
#[inline(always)]
pub fn by_path(p: hits::Prog, f: impl FnOnce(hits::Prog)) {
    begin(p);
    f(p);
    end(p);
}

#[inline(always)]
fn begin(p: hits::Prog) {
    // A hash of the run count, not a stride: a stride sees the same phase of a CPU whose
    // switches repeat in a short cycle (a traced task between two untraced ones).
    let n = hit_count(p).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
    if n % hits::PATH_SAMPLE_EVERY != 0 || counter(&PATHS_ON) == 0 {
        return;
    }
    if let Some(s) = PROG_PATHS.get_ptr_mut(p as u32) {
        unsafe { (*s).start_ns = aya_ebpf::helpers::bpf_ktime_get_ns() };
    }
}

/// The run of `p` in progress does the traced work (counted once however often a run says
/// so: a switch between two traced threads says it for each).
#[inline(always)]
pub fn traced(p: hits::Prog) {
    if let Some(s) = PROG_PATHS.get_ptr_mut(p as u32) {
        unsafe {
            if (*s).in_traced == 0 {
                (*s).in_traced = 1;
                (*s).traced += 1;
            }
        }
    }
}

/// The end of a run begun with [`begin`]: its time by path, when timed.
#[inline(always)]
fn end(p: hits::Prog) {
    let Some(s) = PROG_PATHS.get_ptr_mut(p as u32) else {
        return;
    };
    let s = unsafe { &mut *s };
    let was_traced = s.in_traced != 0;
    if was_traced {
        s.in_traced = 0;
    }
    if s.start_ns == 0 {
        return;
    }
    let ns = unsafe { aya_ebpf::helpers::bpf_ktime_get_ns() }.saturating_sub(s.start_ns);
    s.start_ns = 0;
    if ns > hits::PATH_RUN_MAX_NS {
        return;
    }
    if was_traced {
        s.traced_timed += 1;
        s.traced_ns += ns;
    } else {
        s.early_timed += 1;
        s.early_ns += ns;
    }
}

/// User stacks of CPU samples, off-CPU switch-outs and CUDA calls, of processes a second old
/// or more.
#[map(name = "STACKS")]
pub static STACKS: StackTrace = StackTrace::with_max_entries(cpu::STACKS_ENTRIES, 0);

/// User stacks of processes younger than a second, two maps taking them in turn
/// (`tracer_common::cpu::YOUNG_STACKS_MAPS` says why apart, and why two).
#[map(name = "YOUNG_STACKS")]
pub static YOUNG_STACKS: StackTrace = StackTrace::with_max_entries(cpu::YOUNG_STACKS_ENTRIES, 0);
#[map(name = "YOUNG_STACKS_ODD")]
pub static YOUNG_STACKS_ODD: StackTrace =
    StackTrace::with_max_entries(cpu::YOUNG_STACKS_ENTRIES, 0);
/// `tracer_common::cpu::YOUNG_CTL_MAP`: which young map takes new stacks.
#[map(name = "YOUNG_CTL")]
static YOUNG_CTL: Array<u64> = Array::with_max_entries(1, 0);
/// `tracer_common::cpu::YOUNG_TAKEN_MAP`: how many young stacks were taken.
#[map(name = "YOUNG_TAKEN")]
static YOUNG_TAKEN: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Kernel stacks of CPU samples and off-CPU switch-outs (`tracer_common::cpu::KSTACKS_ENTRIES`
/// says why apart from the user ones).
#[map(name = "KSTACKS")]
pub static KSTACKS: StackTrace = StackTrace::with_max_entries(cpu::KSTACKS_ENTRIES, 0);

/// For rings that user space drains on its ticks (timeline, CUDA events) rather than waits
/// on: a commit into an empty ring otherwise queues an irq_work to wake a reader, a
/// self-interrupt (a VM exit on a guest) that nobody needs.
pub const BPF_RB_NO_WAKEUP: u64 = 1;

const EFAULT: i32 = 14;
const EEXIST: i32 = 17;
const ENOMEM: i32 = 12;

/// The id of the current kernel stack in `KSTACKS`, or the negative errno (counted by
/// [`count_stack_error`]).
#[inline(always)]
pub fn kernel_stack_id<C: StackIdContext>(ctx: &C) -> i32 {
    match ctx.get_stackid(&KSTACKS, 0) {
        Ok(id) => id as i32,
        Err(e) => {
            count_stack_error(e, Drop::KernelStackCollision);
            e
        }
    }
}

/// The id of the current user stack: in `STACKS`, or, for a thread of a process younger than
/// `tracer_common::cpu::YOUNG_NS` ([`is_young`]), in the young map user space has taking them
/// (`tracer_common::cpu::UserStack::young`); or the negative errno (counted by
/// [`count_stack_error`]).
#[inline(always)]
pub fn user_stack_id<C: StackIdContext>(ctx: &C, young: bool) -> i32 {
    match user_stack(ctx, young) {
        Ok(id) => id,
        Err(e) => {
            count_stack_error(e, user_collision(young));
            e
        }
    }
}

/// [`user_stack_id`], its error not counted.
#[inline(always)]
pub fn user_stack<C: StackIdContext>(ctx: &C, young: bool) -> Result<i32, i32> {
    if young {
        let odd = counter(&YOUNG_CTL) & 1 != 0;
        if let Some(n) = YOUNG_TAKEN.get_ptr_mut(0) {
            // This CPU's, not atomic: a count lost to a program interrupting another here only
            // delays a switch.
            unsafe { *n += 1 };
        }
        let id = if odd {
            ctx.get_stackid(&YOUNG_STACKS_ODD, BPF_F_USER_STACK as u64)
        } else {
            ctx.get_stackid(&YOUNG_STACKS, BPF_F_USER_STACK as u64)
        };
        id.map(|id| cpu::UserStack::young(odd as usize, id as u32))
    } else {
        ctx.get_stackid(&STACKS, BPF_F_USER_STACK as u64)
            .map(|id| id as i32)
    }
}

/// What a user stack that lost its slot is counted as.
#[inline(always)]
pub fn user_collision(young: bool) -> Drop {
    if young {
        Drop::YoungStackCollision
    } else {
        Drop::StackCollision
    }
}

/// Whether a thread whose process began at `proc_born_ns` (`ThreadState::proc_born_ns`) is
/// young at `now`: its user stacks go to the young maps (`YOUNG_STACKS`, `YOUNG_STACKS_ODD`).
#[inline(always)]
pub fn is_young(proc_born_ns: u64, now: u64) -> bool {
    now.wrapping_sub(proc_born_ns) < cpu::YOUNG_NS
}

/// Whether the running thread, whose state is `st`, puts its user stacks in the young maps at
/// `now`: by its process's age, or, a forked child at its parent's age, once an exec has
/// replaced the `mm` it was forked with (`ThreadState::image_mm`).
#[inline(always)]
pub fn stacks_young(st: &tracer_common::wall::ThreadState, now: u64) -> bool {
    is_young(st.proc_born_ns, now) || (st.image_mm != 0 && crate::proc::current_mm() != st.image_mm)
}

/// Counts a stack id that is an error: -EFAULT (no kernel stack in user mode, no user stack in
/// a kernel thread) is normal, -EEXIST another stack in the slot (`collision`), -ENOMEM a full
/// map. A stack id is left alone.
#[inline(always)]
pub fn count_stack_error(e: i32, collision: Drop) {
    if e == -EEXIST {
        count_drop(collision);
    } else if e == -ENOMEM {
        count_drop(Drop::StackMapFull);
    } else if e < 0 && e != -EFAULT {
        count_drop(Drop::StackFailed);
    }
}

#[inline(always)]
pub fn is_traced(tgid: u32) -> bool {
    maybe_traced(tgid) && unsafe { TRACED.get(&tgid) }.is_some()
}

/// Whether a thread of traced process `tgid` with no state puts its user stacks in the young
/// maps: after the seeding, one whose birth went unseen or that found no state free
/// (a churn of threads); before it, a child forked since the attach, not a process that ran
/// before it (`tracer_common::proc::TRACED_AT_ATTACH`). The older processes' map is kept for
/// those known to be.
#[inline(always)]
pub fn stateless_young(tgid: u32) -> bool {
    crate::account::seeded()
        || unsafe { TRACED.get(&tgid) }.is_none_or(|v| *v != proc::TRACED_AT_ATTACH)
}

/// As [`count_drop`], `n` times.
#[inline(always)]
pub fn count_drops(reason: Drop, n: u64) {
    if let Some(slot) = DROPS.get_ptr_mut(reason as u32) {
        // Per-CPU slot: no other CPU writes it, and programs do not nest on one CPU here.
        unsafe { *slot += n };
    }
}

#[inline(always)]
pub fn count_drop(reason: Drop) {
    count_drops(reason, 1);
}

#[inline(always)]
pub fn current_ids() -> (u32, u32) {
    let pid_tgid = aya_ebpf::helpers::bpf_get_current_pid_tgid();
    ((pid_tgid >> 32) as u32, pid_tgid as u32)
}

/// Adds `delta` to the u64 behind `ptr` with a BPF atomic add (several CPUs may update one
/// shared hash value). The BPF target has no compare-and-swap, so `AtomicU64::fetch_add` is not
/// available; the intrinsic lowers to `lock xadd`.
#[inline(always)]
pub fn atomic_add(ptr: *mut u64, delta: u64) {
    unsafe {
        core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(
            ptr, delta,
        )
    };
}

/// A counter all CPUs share (an `Array<u64>` of one entry), as the others left it.
#[inline(always)]
pub fn counter(map: &Array<u64>) -> u64 {
    map.get_ptr(0)
        .map_or(0, |n| unsafe { core::ptr::read_volatile(n) })
}

/// Adds `delta` to such a counter (`u64::MAX` takes one away).
#[inline(always)]
pub fn counter_add(map: &Array<u64>, delta: u64) {
    if let Some(n) = map.get_ptr_mut(0) {
        atomic_add(n, delta);
    }
}

/// Adds `delta` to `map[key]`, inserting it when absent; counts `full` when there is no room.
#[inline(always)]
pub fn add_to<K>(map: &HashMap<K, u64>, key: &K, delta: u64, full: Drop) {
    if let Some(v) = map.get_ptr_mut(key) {
        atomic_add(v, delta);
        return;
    }
    // BPF_NOEXIST: another CPU may have inserted it in between; then add to that entry.
    match map.insert(key, &delta, 1) {
        Ok(()) => {}
        Err(_) => match map.get_ptr_mut(key) {
            Some(v) => atomic_add(v, delta),
            None => count_drop(full),
        },
    }
}
