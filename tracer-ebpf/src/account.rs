//! Per-thread wall-time accounting, shared by the scheduler, syscall and CUDA programs.
//!
//! Each traced thread has a [`ThreadState`] (found by [`state`]) holding the start of its
//! running interval and its phase (on CPU, blocked, runnable). Every event closes the running
//! interval at that instant and charges it to one row of `WALL`, so a thread's intervals tile
//! its life.
//!
//! While a thread is inside a CUDA call, all of its time, on or off CPU, is charged to the
//! call's category (`tracer_common::time::Category::Cuda*`). The CUDA entry probe calls
//! [`enter_override`], the return probe [`exit_override`]; both close the interval that was
//! running at that instant, so the split is exact.

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, PerCpuArray},
    Global,
};
use tracer_common::{
    drops::Drop,
    python::PY_STACK_PENDING,
    time::NO_OVERRIDE,
    wall::{
        LifeKey, LifeVal, ThreadState, WallKey, WallVal, LIFE_ENTRIES, MAP_F_MMAPABLE,
        PHASE_BLOCKED, PHASE_ONCPU, PHASE_RUNNABLE, SEEDED_SLOT, STOPPED_SLOT, STOPPED_SLOTS,
        THREADS_ENTRIES, THREAD_SLOTS, WALL_ENTRIES,
    },
};

use crate::maps::{count_drop, counter, counter_add};

/// Thread states, direct-mapped by tid (`tracer_common::wall::THREAD_SLOTS_MAP`).
#[map(name = "THREAD_SLOTS")]
static SLOTS: Array<ThreadState> = Array::with_max_entries(THREAD_SLOTS, MAP_F_MMAPABLE);

/// tid -> state of a traced thread whose slot another one holds.
#[map(name = "THREADS")]
static THREADS: HashMap<u32, ThreadState> = HashMap::with_max_entries(THREADS_ENTRIES, 0);

/// Slot of thread `tid`: `tid & THREAD_SLOT_MASK` (fewer slots than the map has only in tests,
/// to exercise `THREADS`).
#[no_mangle]
static THREAD_SLOT_MASK: Global<u32> = Global::new(THREAD_SLOTS - 1);

#[inline(always)]
fn thread_slot(tid: u32) -> u32 {
    tid & THREAD_SLOT_MASK.load()
}

/// How many states `THREADS` holds (mapped: user space adds the states it seeds there).
#[map(name = "THREADS_SPILLED")]
static SPILLED: Array<u64> = Array::with_max_entries(1, MAP_F_MMAPABLE);

/// The `THREAD_SLOTS` index of `tid` when its state is there (not spilled to `THREADS`).
#[inline(always)]
pub fn own_slot(tid: u32) -> Option<u32> {
    let i = thread_slot(tid);
    let slot = SLOTS.get_ptr(i)?;
    (tid != 0 && unsafe { (*slot).tid } == tid).then_some(i)
}

/// The state of traced thread `tid`, if it has one. A thread's state is touched only from
/// its own events (serialised by the scheduler), so callers may hold the pointer for the run.
#[inline(always)]
pub fn state(tid: u32) -> Option<*mut ThreadState> {
    // Free slots hold tid 0: the idle task has no state.
    if tid == 0 {
        return None;
    }
    let slot = SLOTS.get_ptr_mut(thread_slot(tid))?;
    if unsafe { (*slot).tid } == tid {
        return Some(slot);
    }
    if counter(&SPILLED) == 0 {
        return None;
    }
    THREADS.get_ptr_mut(&tid)
}

/// The state of thread `tid` of process `tgid` while the accounting runs, for the CUDA
/// probes' sums (`ThreadState::held_api_count`): once user space stops the accounting to read
/// the states, they count in their maps again.
#[inline(always)]
pub fn live_state(tgid: u32, tid: u32) -> Option<&'static mut ThreadState> {
    if stopped() {
        return None;
    }
    let st = unsafe { &mut *state(tid)? };
    (st.tgid == tgid).then_some(st)
}

/// Forgets `tid`'s state.
#[inline(always)]
fn forget(tid: u32) {
    if let Some(slot) = SLOTS.get_ptr_mut(thread_slot(tid)) {
        if unsafe { (*slot).tid } == tid {
            unsafe { (*slot).tid = 0 };
            return;
        }
    }
    forget_spilled(tid);
}

/// Forgets `tid`'s state in `THREADS`, if it has one there.
#[inline(always)]
fn forget_spilled(tid: u32) {
    if counter(&SPILLED) != 0 && THREADS.remove(&tid).is_ok() {
        counter_add(&SPILLED, u64::MAX);
    }
}

#[map(name = "NEW_STATE")]
static NEW_STATE: PerCpuArray<ThreadState> = PerCpuArray::with_max_entries(1, 0);

/// Set by user space as the trace's window ends, before it detaches the scheduler, syscall and
/// block programs and reads `WALL` and then the thread states: from here no program moves a
/// thread's state or writes its rows (the scheduler's, the syscalls', births and deaths, the
/// CUDA probes'), so what is read is one instant's, the window's end. Detaching takes a grace
/// period a link (~0.1 s in all here), and the CPU profile's symbolisation as long again or
/// more: rows written through them had threads alive past the window. The CUDA probes stay
/// attached until the report is out; without this a CUDA call between the two reads would
/// move time a thread holds into a `WALL` row already read, and it would be in neither.
/// Slot `SEEDED_SLOT`: set once user space has seeded the threads that existed at the attach
/// ([`seeded`]).
#[map(name = "ACCOUNT_STOPPED")]
static STOPPED: Array<u32> = Array::with_max_entries(STOPPED_SLOTS, 0);

#[inline(always)]
pub fn stopped() -> bool {
    // An array lookup with a constant key: the verifier inlines it, a load or two.
    STOPPED.get(STOPPED_SLOT).is_some_and(|s| *s != 0)
}

/// Whether the threads that existed at the attach are seeded: until then a traced thread
/// with no state is not taken as born (`tracer_common::wall::SEEDED_SLOT`).
#[inline(always)]
pub fn seeded() -> bool {
    STOPPED.get(SEEDED_SLOT).is_some_and(|s| *s != 0)
}

/// Time sums per (thread, category or off-CPU reason, stacks).
#[map(name = "WALL")]
pub static WALL: HashMap<WallKey, WallVal> = HashMap::with_max_entries(WALL_ENTRIES, 0);

/// Threads that died during the trace: (born, tid) -> death time.
#[map(name = "LIFE")]
pub static LIFE: HashMap<LifeKey, LifeVal> = HashMap::with_max_entries(LIFE_ENTRIES, 0);

/// Closes `st`'s running interval at `now`, charges it, and starts the next one at `now`.
///
/// A thread's events are serialised by the scheduler (it cannot be switched in on one CPU while
/// being woken on another), so the plain read-modify-write of its rows is race free.
///
/// Time is held in the thread's state and written out by [`flush`] (see
/// `ThreadState::held_cpu`, `held_cuda`, `held_wait`): on-CPU time, time in one CUDA call
/// site, and the blocked and runqueue time of one wait.
#[inline(always)]
pub fn close(tid: u32, st: &mut ThreadState, now: u64) {
    if st.off_pystack == PY_STACK_PENDING && st.phase != PHASE_ONCPU {
        st.off_pystack = crate::python::seeded_stack(tid, st.off_ns);
    }
    let ns = now.saturating_sub(st.start_ns);
    st.start_ns = now;
    if st.override_cat == NO_OVERRIDE {
        if st.phase == PHASE_ONCPU {
            st.held_cpu.ns += ns;
            st.held_cpu.count += 1;
            return;
        }
        if !st.holds_current_wait() {
            flush_wait(tid, st);
            st.hold_current_wait();
        }
        let held = if st.phase == PHASE_BLOCKED {
            &mut st.held_blocked
        } else {
            &mut st.held_runqueue
        };
        held.ns += ns;
        held.count += 1;
        return;
    }
    if !st.running_is_held_cuda() {
        flush_cuda(tid, st);
        st.held_cat = st.override_cat;
        st.held_fid = st.cuda_fid;
        st.held_ustack = st.cuda_ustack;
        st.held_pystack = st.cuda_pystack;
    }
    st.held_cuda.ns += ns;
    st.held_cuda.count += 1;
}

/// Writes out the time `tid`'s state holds: at a thread's first switch-out, at death (user
/// space adds what live threads hold at the end), and before a stale state is replaced.
///
/// This, [`gputrace_born`] and [`gputrace_died`] are BPF global functions (see `crate`'s
/// docs): the verifier walks each once, where inlined it walked their map updates again on
/// every path of the scheduler program that reaches them. [`born`] and [`died`] call this
/// first and then theirs, one after the other: a global function's frame adds to its
/// caller's, so none calls another.
#[no_mangle]
#[inline(never)]
pub extern "C" fn gputrace_flush(tid: u32) -> u32 {
    if let Some(st) = state(tid) {
        flush(tid, unsafe { &mut *st });
    }
    0
}

#[inline(always)]
fn flush(tid: u32, st: &mut ThreadState) {
    let key = st.cpu_key(tid);
    write_out(&key, &mut st.held_cpu);
    flush_cuda(tid, st);
    flush_wait(tid, st);
    crate::syscalls::flush_file(st);
    crate::syscalls::flush_sys(tid);
    crate::block::flush_bio(st);
    crate::cuda::flush_api(tid, st);
}

#[inline(always)]
fn flush_wait(tid: u32, st: &mut ThreadState) {
    let key = st.wait_key(tid, &st.held_wait, true);
    write_out(&key, &mut st.held_blocked);
    let key = st.wait_key(tid, &st.held_wait, false);
    write_out(&key, &mut st.held_runqueue);
}

#[inline(always)]
fn flush_cuda(tid: u32, st: &mut ThreadState) {
    let key = st.held_cuda_key(tid);
    write_out(&key, &mut st.held_cuda);
}

/// Adds what `held` holds to row `key` and empties it.
#[inline(always)]
fn write_out(key: &WallKey, held: &mut WallVal) {
    if held.count != 0 {
        add_row(key, held.ns, held.count);
        *held = WallVal { ns: 0, count: 0 };
    }
}

#[inline(always)]
fn add_row(key: &WallKey, ns: u64, count: u64) {
    if let Some(v) = WALL.get_ptr_mut(key) {
        unsafe {
            (*v).ns += ns;
            (*v).count += count;
        }
        return;
    }
    if WALL.insert(key, &WallVal { ns, count }, 0).is_err() {
        count_drop(Drop::TimeMapFull);
    }
}

/// `tracer_common::wall::DEATHS_MAP`.
#[map(name = "DEATHS")]
static DEATHS: Array<u64> = Array::with_max_entries(1, 0);

/// Records that thread `tid` died at `now` (its last switch-out, in its own context) and
/// forgets its state, after writing out what it held.
#[inline(always)]
pub fn died(tid: u32, now: u64) {
    gputrace_flush(tid);
    gputrace_died(tid, now, 1);
}

/// As [`died`], from another thread's context (its name is not the current one's).
#[inline(always)]
pub fn ended(tid: u32, now: u64) {
    gputrace_flush(tid);
    gputrace_died(tid, now, 0);
}

/// [`died`] once the state was flushed; `own`: 1 when `tid` is the current thread.
#[no_mangle]
#[inline(never)]
pub extern "C" fn gputrace_died(tid: u32, now: u64, own: u32) -> u32 {
    if stopped() {
        return 0;
    }
    let Some(st) = state(tid) else {
        return 0;
    };
    let st = unsafe { &mut *st };
    let key = LifeKey {
        born_ns: st.born_ns,
        tid,
        _pad: 0,
    };
    let val = LifeVal {
        died_ns: now,
        tgid: st.tgid,
        _pad: 0,
        comm: if own != 0 {
            aya_ebpf::helpers::bpf_get_current_comm().unwrap_or([0; 16])
        } else {
            [0; 16]
        },
    };
    if LIFE.insert(&key, &val, 0).is_err() {
        count_drop(Drop::ThreadStateFull);
    } else {
        counter_add(&DEATHS, 1);
    }
    forget(tid);
    0
}

/// Starts accounting a thread created at `now`; it is runnable until it first runs. A state
/// left by a thread whose death went unseen keeps the time it held: written out first. Its
/// process's age is [`inherited_age`]'s, else it counts from now (a new process).
#[inline(always)]
pub fn born(tid: u32, tgid: u32, now: u64) {
    gputrace_flush(tid);
    gputrace_born(tid, tgid, now, 0);
}

/// [`born`] for a new process forked by the running thread, whose `mm` is `mm` (0: unknown,
/// then it counts from now): until it execs it takes its parent's age.
#[inline(always)]
pub fn born_forked(pid: u32, now: u64, mm: u64) {
    gputrace_flush(pid);
    gputrace_born(pid, pid, now, mm);
}

/// Thread state `st` runs a new image from `now`: young for its first second, as a new
/// process, and no longer its parent's (`ThreadState::image_mm`: a stale one would keep it young
/// for good, its `mm` never the running one's again).
#[inline(always)]
pub fn new_image(st: *mut ThreadState, now: u64) {
    unsafe {
        (*st).proc_born_ns = now;
        (*st).image_mm = 0;
    }
}

/// `(ThreadState::proc_born_ns, ThreadState::image_mm)` of a new thread `tid` of live process
/// `tgid`: its leader's, or where the leader is gone (it left by pthread_exit) the running
/// thread's, its creator. For a process's first thread forked with `mm` (not 0), its parent's
/// age, the running thread's, and `mm`. None where no state says (a new process whose `mm` is
/// unknown; the thread itself runs: a birth first seen at its switch-out).
#[inline(always)]
pub fn inherited_age(tid: u32, tgid: u32, mm: u64) -> Option<(u64, u64)> {
    let (cur_tgid, cur) = crate::maps::current_ids();
    if tid == tgid {
        if mm == 0 || cur_tgid == tgid {
            return None;
        }
        return state(cur)
            .filter(|s| unsafe { (**s).tgid } == cur_tgid)
            .map(|s| (unsafe { (*s).proc_born_ns }, mm));
    }
    if let Some(l) = state(tgid).filter(|l| unsafe { (**l).tgid } == tgid) {
        return Some(unsafe { ((*l).proc_born_ns, (*l).image_mm) });
    }
    if cur == tid || cur_tgid != tgid {
        return None;
    }
    state(cur)
        .filter(|s| unsafe { (**s).tgid } == tgid)
        .map(|s| unsafe { ((*s).proc_born_ns, (*s).image_mm) })
}

/// [`born`] once a state left under `tid` was flushed; `mm` as [`born_forked`]'s. The
/// process's age is looked up here, not at the call sites: this function is verified once.
#[no_mangle]
#[inline(never)]
pub extern "C" fn gputrace_born(tid: u32, tgid: u32, now: u64, mm: u64) -> u32 {
    // Before the seeding, a thread born while the other families attached would be alive
    // before the window: the seeding takes it from /proc as the window opens, or its first
    // switch-out after it (a child process forked meanwhile).
    if tid == 0 || stopped() || !seeded() {
        return 0;
    }
    let Some(slot) = SLOTS.get_ptr_mut(thread_slot(tid)) else {
        return 0;
    };
    if let Some(old) = state(tid) {
        if old != slot {
            forget_spilled(tid);
        }
    }
    crate::maps::mark_maybe(tid);
    // Built once in a per-CPU slot and copied from there: a state built by value goes
    // through the stack, and this function's frame adds to its caller's (`crate`'s docs).
    let Some(st) = NEW_STATE.get_ptr_mut(0) else {
        return 0;
    };
    let (age, image_mm) = inherited_age(tid, tgid, mm).unwrap_or((now, 0));
    unsafe {
        *st = ThreadState::new(now, tid, tgid, PHASE_RUNNABLE);
        (*st).proc_born_ns = age;
        (*st).image_mm = image_mm;
    }
    let owner = unsafe { (*slot).tid };
    if owner == 0 || owner == tid {
        // Two CPUs may fill one free slot at once (plain stores) only for two threads born
        // together whose ids differ by a multiple of THREAD_SLOTS.
        unsafe { *slot = *st };
        return 0;
    }
    if THREADS.insert(&tid, unsafe { &*st }, 0).is_ok() {
        counter_add(&SPILLED, 1);
    } else {
        count_drop(Drop::ThreadStateFull);
    }
    0
}

/// From now on, charge `tid`'s time to `category` until [`exit_override`], under the call's
/// function id and where it was called from (user and Python stacks).
#[inline(always)]
pub fn enter_override(tid: u32, now: u64, category: u32, fid: i32, ustack: i32, pystack: u64) {
    if stopped() {
        return;
    }
    if let Some(st) = state(tid) {
        // A call's entry runs in the thread: one still off CPU missed its switch-in. Not at
        // the call's return: the return program's frame (352 bytes) and the closing's would
        // pass the 512 that kernels before 6.13 allow a call chain, and inside the call its
        // category takes all the time anyway. Only outermost counted calls get here: a launch
        // storm's gated-off or nested launches leave it to a CPU sample.
        crate::sched::running(tid, st, 0, || now);
        let st = unsafe { &mut *st };
        close(tid, st, now);
        st.override_cat = category;
        st.cuda_fid = fid;
        st.cuda_ustack = ustack;
        st.cuda_pystack = pystack;
    }
}

/// Ends the override started by [`enter_override`].
#[inline(always)]
pub fn exit_override(tid: u32, now: u64) {
    if stopped() {
        return;
    }
    if let Some(st) = state(tid) {
        let st = unsafe { &mut *st };
        close(tid, st, now);
        st.override_cat = NO_OVERRIDE;
    }
}
