//! Scheduler tracepoints: exact on/off-CPU intervals of traced threads (see `account`).
//!
//! `sched_switch` runs in the context of `prev`, so `prev`'s tgid comes from
//! `bpf_get_current_pid_tgid`; `next` is found by tid (`account::state`): only traced threads
//! have a state. Off-CPU intervals carry what the thread was doing when it left the CPU (syscall,
//! task state, user and kernel stacks) and are classified in user space.
//!
//! Each program comes three times. On a BTF tracepoint (`*_btf`, the default): it runs on every
//! context switch of the machine, and the task's pid is a plain load there
//! (`crate::kread::Direct`). On a raw tracepoint, the same code reading the pid with a helper
//! call, for kernels that refuse the typed programs. And on the classic tracepoint (`*_tp`),
//! which first copies its record, names included, for kernels whose BTF does not show the raw
//! arguments expected here. User space loads one of the three.

use aya_ebpf::{
    helpers::{bpf_get_current_task, bpf_ktime_get_ns},
    macros::{btf_tracepoint, map, raw_tracepoint, tracepoint},
    maps::{Array, PerCpuArray},
    programs::{
        tracing::StackIdContext, BtfTracePointContext, RawTracePointContext, TracePointContext,
    },
    Global,
};
use tracer_common::wall::{
    report_state, ThreadState, PHASE_BLOCKED, PHASE_ONCPU, PHASE_RUNNABLE, RUN_DELAY_UNKNOWN,
    SYS_LEFT_CPU, WALK_SLOTS,
};

use crate::{
    account::{born, close, died, gputrace_flush, state},
    kread::{Direct, Kernel, Probe},
    maps::{
        by_path, count_drop, current_ids, is_traced, kernel_stack_id, maybe_traced, traced,
        user_stack_id,
    },
};
use tracer_common::{drops::Drop, hits::Prog, python::PY_STACK_PENDING};

#[no_mangle]
static OFF_SW_PREV_STATE: Global<u32> = Global::new(32);
#[no_mangle]
static OFF_SW_NEXT_PID: Global<u32> = Global::new(56);
#[no_mangle]
static OFF_WAKE_PID: Global<u32> = Global::new(24);
/// `task_struct.pid`, from the kernel's BTF (raw tracepoints pass tasks, not their fields).
#[no_mangle]
static OFF_TASK_PID: Global<u32> = Global::new(0);
#[no_mangle]
static OFF_TN_PID: Global<u32> = Global::new(8);
#[no_mangle]
static OFF_TN_FLAGS: Global<u32> = Global::new(32);
/// 1 to capture user and kernel stacks at every switch-out (off-CPU flame graphs).
#[no_mangle]
static OFFCPU_STACKS: Global<u32> = Global::new(1);
/// 1 when `sched_switch_btf` tells the runqueue part of a woken thread's wait at its
/// switch-in, from the scheduler's own accounting ([`queued_ns`]), and no `sched_wakeup`
/// program runs: set by user space when the kernel's BTF shows the fields read here. Every
/// wakeup on the machine then costs no program run (a traced one cost ~180-210 ns here, an
/// untraced one its dispatch and an early return).
#[no_mangle]
static SPLIT_AT_SWITCH_IN: Global<u32> = Global::new(0);
/// 1 when the kernel's BTF shows the scheduler's fields read below, whichever program set
/// runs: [`gputrace_switched_in`] dates an arrival from them.
#[no_mangle]
static ARRIVAL_KNOWN: Global<u32> = Global::new(0);
/// `task_struct.sched_info.last_queued` and `.run_delay`, `task_struct.se.cfs_rq`,
/// `cfs_rq.rq` and `rq.clock`, from the kernel's BTF.
#[no_mangle]
static OFF_TASK_LAST_QUEUED: Global<u32> = Global::new(0);
/// `task_struct.sched_info.last_arrival`, from the kernel's BTF.
#[no_mangle]
static OFF_TASK_LAST_ARRIVAL: Global<u32> = Global::new(0);
#[no_mangle]
static OFF_TASK_RUN_DELAY: Global<u32> = Global::new(0);
#[no_mangle]
static OFF_TASK_CFS_RQ: Global<u32> = Global::new(0);
#[no_mangle]
static OFF_CFS_RQ_RQ: Global<u32> = Global::new(0);
#[no_mangle]
static OFF_RQ_CLOCK: Global<u32> = Global::new(0);
/// A CPU sample closes an unseen switch-in's wait only after a run this long
/// ([`gputrace_switched_in`]): a scheduler tick (4-10 ms) is then a small part of it.
pub const SAMPLE_MIN_RUN_NS: u64 = 20_000_000;
/// Tests only (`GPUTRACE_TEST_UNSEEN_SWITCH_INS=1`): the switch program leaves every traced
/// thread's switch-in alone, as the kernel does for a switch from a task it hides (see
/// [`gputrace_switched_in`]). A read-only value, so the verifier drops the branch at 0.
#[no_mangle]
static UNSEEN_SWITCH_INS: Global<u32> = Global::new(0);
/// The futex syscall's number (set by user space per architecture): a futex wait on the GIL's
/// words is a GIL wait.
#[no_mangle]
static SYS_FUTEX: Global<u32> = Global::new(202);

const CLONE_THREAD: u64 = 0x0001_0000;
/// `prev_state` bits of a task that is exiting (EXIT_DEAD, EXIT_ZOMBIE in TASK_REPORT).
const EXIT_BITS: i64 = 0x10 | 0x20;

/// Bit `nr` set for the syscalls under 64 that take an fd first (user space sets it from
/// `accounting::classify::FD_SYSCALLS`): a blocked wait without a kernel stack in one of them
/// keeps its fd (`tracer_common::wall::unwalked_fd1`).
#[no_mangle]
static FD_SYSCALL_MASK: Global<u64> = Global::new(0);

// TP_PROTO(bool preempt, struct task_struct *prev, struct task_struct *next,
//          unsigned int prev_state)
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn sched_switch(ctx: RawTracePointContext) -> u32 {
    by_path(Prog::SchedSwitch, |p| {
        let tasks = Tasks {
            prev: ctx.arg(1),
            next: ctx.arg(2),
            split: false,
        };
        switch_args::<_, Probe>(&ctx, ctx.arg(0), tasks, ctx.arg(3), p)
    });
    0
}

#[btf_tracepoint(function = "sched_switch")]
pub fn sched_switch_btf(ctx: BtfTracePointContext) -> i32 {
    by_path(Prog::SchedSwitchBtf, |p| {
        let tasks = Tasks {
            prev: ctx.arg(1),
            next: ctx.arg(2),
            split: SPLIT_AT_SWITCH_IN.load() != 0,
        };
        switch_args::<_, Direct>(&ctx, ctx.arg(0), tasks, ctx.arg(3), p)
    });
    0
}

/// The switch's tasks, and whether the runqueue part of a woken thread's wait is told at its
/// switch-in (`SPLIT_AT_SWITCH_IN`; never on the raw and classic programs, which come with
/// `sched_wakeup`).
#[derive(Clone, Copy)]
struct Tasks {
    prev: u64,
    next: u64,
    split: bool,
}

impl Tasks {
    const NONE: Tasks = Tasks {
        prev: 0,
        next: 0,
        split: false,
    };
}

/// The raw and BTF programs' arguments: `preempt`, the tasks, the raw `prev_state`.
#[inline(always)]
fn switch_args<C: StackIdContext, K: Kernel>(
    ctx: &C,
    preempt: u64,
    tasks: Tasks,
    raw: u64,
    p: Prog,
) {
    let state = report_state(preempt & 0xff != 0, raw as u32);
    switch::<C, K>(ctx, state as i64, task_pid::<K>(tasks.next), tasks, p)
}

#[tracepoint]
pub fn sched_switch_tp(ctx: TracePointContext) -> u32 {
    by_path(Prog::SchedSwitchTp, |p| {
        let state: i64 = unsafe { ctx.read_at(OFF_SW_PREV_STATE.load() as usize) }.unwrap_or(0);
        let next: i32 = unsafe { ctx.read_at(OFF_SW_NEXT_PID.load() as usize) }.unwrap_or(0);
        switch::<_, Probe>(&ctx, state, next, Tasks::NONE, p);
    });
    0
}

#[inline(always)]
fn task_pid<K: Kernel>(task: u64) -> i32 {
    K::read(task, OFF_TASK_PID.load())
}

/// `prev_state` in the tracepoint's form (`tracer_common::wall::report_state`).
#[inline(always)]
fn switch<C: StackIdContext, K: Kernel>(
    ctx: &C,
    prev_state: i64,
    next: i32,
    tasks: Tasks,
    p: Prog,
) {
    let (tgid, tid) = current_ids();
    // Most switches of a machine are neither's: they return before the clock read. Read
    // where first needed, not decided up front: flags carried across `switch_out` doubled the
    // states the verifier walked there (attach ~0.5 s slower).
    let mut now = 0;
    // Looked up by tid first, not by TRACED: a process's last thread leaves TRACED at
    // sched_process_exit, before its final switch-out, which is when its life ends.
    if tid != 0 && (maybe_traced(tid) || maybe_traced(tgid)) {
        // Stopped as the window ended: what is read is that instant's (`account::stopped`).
        if crate::account::stopped() {
            return;
        }
        now = unsafe { bpf_ktime_get_ns() };
        switch_out::<C, K>(ctx, tgid, tid, now, prev_state, tasks, p);
    }
    if next > 0
        && UNSEEN_SWITCH_INS.load() == 0
        && maybe_traced(next as u32)
        && !crate::account::stopped()
    {
        if now == 0 {
            now = unsafe { bpf_ktime_get_ns() };
        }
        let next = next as u32;
        if let Some(st) = state(next) {
            traced(p);
            arrive::<K>(next, unsafe { &mut *st }, tasks.next, tasks.split, now);
        }
    }
}

/// Thread `tid` (its `task_struct` at `task`, read through `K`) is on a CPU from `now`: its
/// wait is closed, on the timeline too. With `split`, a blocked thread's wait is split where
/// it was queued to run, from the scheduler's own accounting ([`queued_ns`]).
#[inline(always)]
fn arrive<K: Kernel>(tid: u32, st: &mut ThreadState, task: u64, split: bool, now: u64) {
    // A wait under way when the thread was seeded has no switch-out: on the timeline it
    // begins where the seeded state does (the window's start), before the split below.
    let seeded_from = st.start_ns;
    if split && st.phase == PHASE_BLOCKED {
        // Blocked until it was queued to run, runnable since: what `sched_wakeup` would have
        // closed, told now.
        let queued = queued_ns::<K>(task, st.off_run_delay);
        close(tid, st, now.saturating_sub(queued).max(st.start_ns));
        st.phase = PHASE_RUNNABLE;
    }
    crate::timeline::offcpu(tid, st, now, seeded_from);
    close(tid, st, now);
    st.phase = PHASE_ONCPU;
}

/// A program running in `tid`'s own context (its syscall entry or exit, a CUDA call's entry,
/// a CPU sample, its switch-out) with `tid`'s state off CPU: the switch that put the thread on
/// a CPU ran no program. On the development VM (Linux 6.18) the kernel runs no BPF program
/// while one of the sandbox's own agent threads is current, so a switch from one of them to a
/// traced thread is never seen: bpftrace counted 19 switches into those threads in 8 s and
/// none out of them, and a traced thread's wait then went without its switch-in (a timeline
/// test's missing sleep, ~1 run in 40 beside two CPU hogs). Closed here as that switch-in
/// would have closed it, counted as `Drop::SwitchInUnseen`.
///
/// When: the scheduler stamps its arrival (`sched_info.last_arrival`) from its runqueue's
/// clock, so the run since is that clock's lead over the stamp. At a switch-out the clock was
/// just read (`__schedule`), so the arrival is exact; at a syscall it was read at the switch-in
/// microseconds before; in a CPU sample it may be a scheduler tick old, which puts the
/// arrival later than it was, never before: a sample closes only a run of at least `min_run`
/// ns by that clock, where a tick is a small part of it, and leaves shorter ones to the
/// switch-out. Without the scheduler's fields in the kernel's BTF, at `now`: a whole run late
/// at a switch-out (the run then counts in the wait). The runqueue part of a woken
/// thread's wait is the run-delay sum's growth since the switch-out: the arrival is past, so
/// the sum holds it.
///
/// A global function (see `crate`'s docs); its callers look their state up again after it.
#[no_mangle]
#[inline(never)]
pub extern "C" fn gputrace_switched_in(tid: u32, now: u64, min_run: u64) -> u32 {
    // Once user space has stopped the accounting to read it (the CPU sampler outlives the
    // scheduler programs), a state must not move.
    if crate::account::stopped() {
        return 0;
    }
    let Some(st) = state(tid) else {
        return 0;
    };
    let Some(closing) = CLOSING.get_ptr_mut(0) else {
        return 0;
    };
    // A CPU sample may interrupt a syscall program in here (tracepoint programs run with
    // interrupts on): the sample leaves the wait to it. The phase is read again under the
    // flag: a sample that came first closed it whole.
    if unsafe { *closing } != 0 {
        return 0;
    }
    unsafe { *closing = 1 };
    let st = unsafe { &mut *st };
    if st.phase != PHASE_ONCPU {
        close_unseen(tid, st, now, min_run);
    }
    unsafe { *closing = 0 };
    0
}

/// [`gputrace_switched_in`]'s closing, `st` off CPU.
#[inline(always)]
fn close_unseen(tid: u32, st: &mut ThreadState, now: u64, min_run: u64) {
    let task = unsafe { bpf_get_current_task() };
    let at = if ARRIVAL_KNOWN.load() != 0 {
        let arrival: u64 = Probe::read(task, OFF_TASK_LAST_ARRIVAL.load());
        let ran = rq_clock::<Probe>(task).saturating_sub(arrival);
        if ran < min_run {
            return;
        }
        let at = now.saturating_sub(ran);
        // A stamp from before the switch-out seen last is not this arrival's (the scheduler
        // stamps only an arrival it had queued): then where it was found.
        if st.off_ns != 0 && at < st.off_ns {
            now
        } else {
            at.max(st.start_ns)
        }
    } else {
        now
    };
    // A thread seeded blocked at the attach may have woken before its seed was written: the
    // seed, not the kernel, missed that switch-in.
    if st.off_ns != 0 || st.phase != PHASE_BLOCKED {
        count_drop(Drop::SwitchInUnseen);
    }
    arrive::<Probe>(tid, st, task, SPLIT_AT_SWITCH_IN.load() != 0, at);
}

/// `tid`, whose state is at `st`, is running a program of its own: a state off CPU missed its
/// switch-in, closed by [`gputrace_switched_in`] (`min_run` there) at the clock `now` reads
/// (read only then). That global function writes the state through a pointer of its own: the
/// caller references `st` only after this.
#[inline(always)]
pub fn running(tid: u32, st: *mut ThreadState, min_run: u64, now: impl FnOnce() -> u64) {
    if unsafe { (*st).phase } != PHASE_ONCPU {
        gputrace_switched_in(tid, now(), min_run);
    }
}

/// Per CPU: 1 while [`gputrace_switched_in`] closes a wait on this CPU.
#[map(name = "SWITCH_IN_CLOSING")]
static CLOSING: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);

/// The clock of the runqueue `task` is on (`rq->clock`, reached through its CFS runqueue).
#[inline(always)]
fn rq_clock<K: Kernel>(task: u64) -> u64 {
    let cfs_rq: u64 = K::read(task, OFF_TASK_CFS_RQ.load());
    let rq: u64 = K::read(cfs_rq, OFF_CFS_RQ_RQ.load());
    K::read(rq, OFF_RQ_CLOCK.load())
}

/// How long `task`, being switched in, waited on a runqueue since it last left the CPU, when
/// its run-delay sum was `base`: the scheduler adds a wait to `sched_info.run_delay` when the
/// task arrives on the CPU (just after this tracepoint: `sched_info_arrive`, from the same
/// `rq->clock` read here) or is dequeued while queued (a migration), and `last_queued` holds
/// when the wait under way began. Exactly the runqueue time a `sched_wakeup` program would
/// have seen start at the wakeup, migrations included, in the scheduler's clock (the same
/// rate as ours). A thread seeded blocked (`base` unknown) gets the wait under way only.
#[inline(always)]
fn queued_ns<K: Kernel>(task: u64, base: u64) -> u64 {
    let queued: u64 = K::read(task, OFF_TASK_LAST_QUEUED.load());
    let mut ns = 0;
    if queued != 0 {
        ns = rq_clock::<K>(task).saturating_sub(queued);
    }
    if base != RUN_DELAY_UNKNOWN {
        ns += K::read::<u64>(task, OFF_TASK_RUN_DELAY.load()).saturating_sub(base);
    }
    ns
}

/// `tid` of `tgid` leaves the CPU; either may be traced (`maybe_traced`).
#[inline(always)]
fn switch_out<C: StackIdContext, K: Kernel>(
    ctx: &C,
    tgid: u32,
    tid: u32,
    now: u64,
    prev_state: i64,
    tasks: Tasks,
    p: Prog,
) {
    let st = match state(tid) {
        Some(st) => st,
        None => {
            // A thread never seen alive that is dying: no life to count (the old leader's
            // final switch-out after a thread's exec took its id, under that thread's old id).
            if !is_traced(tgid) || prev_state & 0xff & EXIT_BITS != 0 {
                return;
            }
            // A thread we never saw start (created between the attach and the seeding, its
            // birth unseen): accounted from now on. Before the seeding, none is taken as born
            // (`gputrace_born`, `account::seeded`): the seeding accounts the threads that
            // existed at the attach from the window's start.
            born(tid, tgid, now);
            match state(tid) {
                Some(st) => {
                    unsafe { (*st).phase = PHASE_ONCPU };
                    st
                }
                None => return,
            }
        }
    };
    traced(p);
    running(tid, st, 0, || now);
    {
        // An untimed syscall's first switch-out (its entry set `sys_in_ns` to the running
        // interval it began in, which this switch-out ends): its exit times the wait from here.
        let st = unsafe { &mut *st };
        if st.sys_in_ns == st.start_ns {
            st.sys_in_ns = now | SYS_LEFT_CPU;
        }
    }
    close(tid, unsafe { &mut *st }, now);
    if prev_state & 0xff & EXIT_BITS != 0 {
        // died() writes out what the thread holds.
        died(tid, now);
        return;
    }
    // On-CPU time stays held across switches once its row exists (written at the first
    // switch-out, while WALL has room): the row never changes in the thread's life, user space
    // adds what is held at the end (`accounting::aggregate::open_rows`) and died() writes it
    // out, so a WALL lookup per switch-out (~0.2 µs here) buys nothing. Time in one CUDA call
    // site stays held the same way until the site changes (the CUDA probes leave the states
    // alone once user space stops the accounting to read it: `account::stopped`).
    if unsafe { (*st).cpu_row } == 0 {
        gputrace_flush(tid);
        unsafe { (*st).cpu_row = 1 };
    }
    // Referenced only now: the global functions above write the state through pointers of
    // their own.
    let st: &mut ThreadState = unsafe { &mut *st };
    // The syscall it is in, if its entry was seen since the syscall programs last came on
    // (else `SYSCALL_UNSEEN`, and the wait is told by nothing but its stacks: they are
    // walked, not reused from another wait, as all of a thread's waits look alike then).
    let off_at = crate::syscalls::off_at();
    let sys_nr = crate::syscalls::nr_since(st, off_at);
    let seen = crate::syscalls::seen_since(st, off_at);
    st.off_state = prev_state as u32;
    st.off_ns = now;
    if tasks.split {
        st.off_run_delay = K::read(tasks.prev, OFF_TASK_RUN_DELAY.load());
    }
    st.off_sys_nr = sys_nr;
    st.phase = if prev_state & 0xff == 0 {
        PHASE_RUNNABLE
    } else {
        PHASE_BLOCKED
    };
    // Stack walks are most of this program's cost: only for blocking switch-outs, whose
    // kernel stack says what the thread waits for. A preempted thread is simply runnable. A
    // thread that blocks again in one of its last WALK_SLOTS waits (same syscall on the same
    // fd or futex word) within `Walked::reuse_ns` of that wait's walk reuses its stacks: a
    // thread looping on a read, or cycling through a few waits (a trainer reading two
    // loaders' pipes in turn with a sync between), then costs one walk per wait per 50 ms,
    // not one per switch, and a wait whose walks keep finding the same stacks one per 0.4 s
    // (`STEADY_MAX`).
    if st.phase == PHASE_BLOCKED && OFFCPU_STACKS.load() != 0 {
        let (nr, arg0) = (sys_nr, st.sys_arg0);
        let young = crate::maps::stacks_young(st, now);
        let mut found = WALK_SLOTS;
        // Replaced on a miss: this wait's expired walk, else an empty slot or the oldest walk
        // (a live one's walk is under 50 ms old, so the oldest is the next to expire).
        let (mut victim, mut victim_rank) = (0, u64::MAX);
        for i in 0..WALK_SLOTS {
            let w = &st.walked[i];
            if w.reusable(nr, arg0, now, seen) {
                found = i;
                break;
            }
            let rank = if w.is_for(nr, arg0) { 0 } else { w.ns };
            if rank < victim_rank {
                (victim, victim_rank) = (i, rank);
            }
        }
        let fresh = found == WALK_SLOTS;
        if fresh {
            found = victim;
            if let Some(w) = st.walked.get_mut(victim) {
                // Field by field: a whole `Walked` built first goes through the stack.
                let kstack = kernel_stack_id(ctx);
                let ustack = user_stack_id(ctx, young);
                let pystack = crate::python::python_stack(tgid, tid);
                // A process not classified yet is walked again at the first reuse limit: its
                // slot's pending Python stack costs a lookup at every reuse until then.
                w.steady = if pystack == PY_STACK_PENDING {
                    0
                } else {
                    w.steady_after(nr, arg0, kstack, ustack)
                };
                w.ns = now;
                w.arg0 = arg0;
                w.sys_nr = nr;
                w.kstack = kstack;
                w.ustack = ustack;
                w.pystack = pystack;
            }
        }
        if let Some(w) = st.walked.get(found) {
            st.off_kstack = w.kstack;
            st.off_ustack = w.ustack;
            // A Python thread's line is walked at every blocking wait: waits alike to the
            // kernel (a `time.sleep`'s first argument is its clock, every GIL wait's futex
            // is one word) come from other lines, and a reused walk charged a loop's waits to
            // the line of the first one in 50 ms (99% of a 30 ms sleep's time to a 1 ms
            // sleep's line). Native frames, the same C path for all of them, are reused.
            st.off_pystack = if fresh || w.pystack == 0 {
                w.pystack
            } else {
                crate::python::python_stack(tgid, tid)
            };
            // This wait goes without the stacks that failed: counted as a walk would be.
            if !fresh {
                crate::maps::count_stack_error(w.kstack, Drop::KernelStackCollision);
                crate::maps::count_stack_error(w.ustack, crate::maps::user_collision(young));
            }
        }
    } else {
        st.off_kstack = -1;
        st.off_ustack = -1;
        st.off_pystack = 0;
    }
    st.off_fd1 = tracer_common::wall::unwalked_fd1(
        st.phase,
        st.off_kstack,
        sys_nr,
        FD_SYSCALL_MASK.load(),
        st.sys_arg0,
    );
    st.off_gil = 0;
    if st.phase == PHASE_BLOCKED && sys_nr == SYS_FUTEX.load() as i32 {
        st.off_gil = crate::python::gil_holder(tgid, st.sys_arg0);
    }
}

/// A blocked thread became runnable: what follows until it runs is runqueue time.
// TP_PROTO(struct task_struct *p)
#[raw_tracepoint(tracepoint = "sched_wakeup")]
pub fn sched_wakeup(ctx: RawTracePointContext) -> u32 {
    by_path(Prog::SchedWakeup, |p| {
        wakeup(task_pid::<Probe>(ctx.arg(0)), p)
    });
    0
}

#[btf_tracepoint(function = "sched_wakeup")]
pub fn sched_wakeup_btf(ctx: BtfTracePointContext) -> i32 {
    by_path(Prog::SchedWakeupBtf, |p| {
        wakeup(task_pid::<Direct>(ctx.arg(0)), p)
    });
    0
}

#[tracepoint]
pub fn sched_wakeup_tp(ctx: TracePointContext) -> u32 {
    by_path(Prog::SchedWakeupTp, |p| {
        wakeup(
            unsafe { ctx.read_at(OFF_WAKE_PID.load() as usize) }.unwrap_or(0),
            p,
        );
    });
    0
}

#[inline(always)]
fn wakeup(pid: i32, p: Prog) {
    if pid <= 0 {
        return;
    }
    let tid = pid as u32;
    if !maybe_traced(tid) || crate::account::stopped() {
        return;
    }
    if let Some(st) = state(tid) {
        traced(p);
        let st = unsafe { &mut *st };
        if st.phase == PHASE_BLOCKED {
            close(tid, st, unsafe { bpf_ktime_get_ns() });
            st.phase = PHASE_RUNNABLE;
        }
    }
}

/// New threads of traced processes (clone_flags tell a thread from a process here).
#[tracepoint]
pub fn acct_newtask(ctx: TracePointContext) -> u32 {
    crate::maps::hit(tracer_common::hits::Prog::AcctNewtask);
    let flags: u64 = unsafe { ctx.read_at(OFF_TN_FLAGS.load() as usize) }.unwrap_or(0);
    if flags & CLONE_THREAD == 0 {
        return 0;
    }
    let (tgid, _) = current_ids();
    if !is_traced(tgid) {
        return 0;
    }
    let child: i32 = unsafe { ctx.read_at(OFF_TN_PID.load() as usize) }.unwrap_or(0);
    if child > 0 {
        born(child as u32, tgid, unsafe { bpf_ktime_get_ns() });
    }
    0
}

/// `task/task_rename`'s `pid`: the renamed task, not always the caller (a thread may name
/// another through /proc).
#[no_mangle]
static OFF_RN_PID: Global<u32> = Global::new(8);

/// Renames (prctl, a write to /proc/.../comm, exec) of tasks that may be traced: user space
/// re-reads the names of live threads only when this moved, not every time it looks.
#[map(name = "RENAMES")]
static RENAMES: Array<u64> = Array::with_max_entries(1, 0);

#[tracepoint]
pub fn task_rename(ctx: TracePointContext) -> u32 {
    crate::maps::hit(tracer_common::hits::Prog::TaskRename);
    let pid: i32 = unsafe { ctx.read_at(OFF_RN_PID.load() as usize) }.unwrap_or(0);
    if pid > 0 && maybe_traced(pid as u32) {
        crate::maps::counter_add(&RENAMES, 1);
    }
    0
}

/// New processes: by now proc.rs's task_newtask has put a followed child in TRACED.
// TP_PROTO(struct task_struct *p)
#[raw_tracepoint(tracepoint = "sched_wakeup_new")]
pub fn sched_wakeup_new(ctx: RawTracePointContext) -> u32 {
    crate::maps::hit(tracer_common::hits::Prog::SchedWakeupNew);
    let task: u64 = ctx.arg(0);
    wakeup_new(task_pid::<Probe>(task), crate::proc::task_mm::<Probe>(task))
}

#[btf_tracepoint(function = "sched_wakeup_new")]
pub fn sched_wakeup_new_btf(ctx: BtfTracePointContext) -> i32 {
    crate::maps::hit(tracer_common::hits::Prog::SchedWakeupNewBtf);
    let task: u64 = ctx.arg(0);
    // The mm through a helper: a BTF program's plain load of a pointer field is refused.
    wakeup_new(
        task_pid::<Direct>(task),
        crate::proc::task_mm::<Probe>(task),
    ) as i32
}

#[tracepoint]
pub fn sched_wakeup_new_tp(ctx: TracePointContext) -> u32 {
    crate::maps::hit(tracer_common::hits::Prog::SchedWakeupNewTp);
    wakeup_new(
        unsafe { ctx.read_at(OFF_WAKE_PID.load() as usize) }.unwrap_or(0),
        0,
    )
}

/// `mm`: the new process's (0: unknown).
#[inline(always)]
fn wakeup_new(pid: i32, mm: u64) -> u32 {
    if pid <= 0 {
        return 0;
    }
    let pid = pid as u32;
    if !is_traced(pid) {
        return 0;
    }
    match state(pid) {
        None => crate::account::born_forked(pid, unsafe { bpf_ktime_get_ns() }, mm),
        // A state before the process first ran: the seeding's (it read /proc while the fork
        // went on), or one left under its pid by a process whose death went unseen (whose age
        // would make this one old). It is new, as a birth here would have it.
        Some(st) => crate::account::new_image(st, unsafe { bpf_ktime_get_ns() }),
    }
    0
}
