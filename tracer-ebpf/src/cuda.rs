//! CUDA runtime and driver API probes: one entry and one return program for every function,
//! told apart by the attachment cookie (`tracer_common::cuda::Cookie`).
//!
//! The entry stashes the arguments keyed by (thread, nesting depth); the return does the work.
//! A runtime call that enters the driver (cudaLaunchKernel -> cuLaunchKernel) is counted once,
//! at the outermost level; inner levels only contribute kernel names, which are wanted whoever
//! asks for them (the runtime's lazy module loading calls cuModuleGetFunction itself).

use aya_ebpf::{
    helpers::{
        bpf_get_attach_cookie, bpf_ktime_get_ns, bpf_probe_read_user, bpf_probe_read_user_str_bytes,
    },
    macros::{map, tracepoint, uprobe, uretprobe},
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::{ProbeContext, RetProbeContext, TracePointContext},
    EbpfContext, Global,
};
use tracer_common::{
    cuda::{
        log2_bucket, ApiKey, ApiVal, Cookie, CopyKey, CopyVal, CudaEvent, ErrKey, EventKind,
        LaunchKey, LaunchVal, RtText, Shape, API_ENTRIES, CALL_GEN_SLOT, CALL_RUNS_SLOT,
        CLOSING_RUNS_SLOT, COPY_ENTRIES, DIR_NONE, ERRS_ENTRIES, EVENTS_BYTES, FLAG_ASYNC,
        FLAG_NO_RESULT, HIST_BUCKETS, LAUNCHER_SLOT, LAUNCHES_OFF_SLOT, LAUNCH_ENTRIES,
        LAUNCH_RUNS_SLOTS, OTHER_ENTRY_SLOT, OTHER_RET_SLOT, OUTER_LAUNCH_SLOT, RET_GEN_SLOTS,
        RT_TEXT_ENTRIES, STASH_ENTRIES, STEADY_CALLS_SLOT, STEADY_ON_SLOT, STEADY_STEPS_SLOT,
        WINDOW_GEN_SLOT,
    },
    drops::Drop,
    time::Category,
};

use crate::{
    account,
    maps::{add_to, atomic_add, count_drop, current_ids, is_traced, maybe_traced},
};

#[no_mangle]
static CUDA_ENTRY_ONLY: Global<u32> = Global::new(0);

#[map(name = "CUDA_API")]
static CUDA_API: HashMap<ApiKey, ApiVal> = HashMap::with_max_entries(API_ENTRIES, 0);
#[map(name = "CUDA_ERRS")]
static CUDA_ERRS: HashMap<ErrKey, u64> = HashMap::with_max_entries(ERRS_ENTRIES, 0);
#[map(name = "CUDA_LAUNCH")]
static CUDA_LAUNCH: HashMap<LaunchKey, LaunchVal> = HashMap::with_max_entries(LAUNCH_ENTRIES, 0);
#[map(name = "CUDA_COPY")]
static CUDA_COPY: HashMap<CopyKey, CopyVal> = HashMap::with_max_entries(COPY_ENTRIES, 0);
#[map(name = "CUDA_GATE_LAST")]
static CUDA_GATE_LAST: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);
#[map(name = "CUDA_GATE_FIRST")]
static CUDA_GATE_FIRST: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);
#[map(name = "CUDA_EVENTS")]
static CUDA_EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_BYTES, 0);

/// pid_tgid -> the thread's call state. Entries live until the thread exits (removed by
/// `cuda_thread_exit`), so a call costs lookups and stores, never a map insert or delete.
#[map(name = "CUDA_THREAD")]
static CUDA_THREAD: HashMap<u64, ThreadState> = HashMap::with_max_entries(STASH_ENTRIES, 0);
/// `tracer_common::cuda::RT_TEXT_MAP`, written by user space where it finds the libraries.
#[map(name = "CUDA_RT_TEXT")]
static CUDA_RT_TEXT: HashMap<u32, RtText> = HashMap::with_max_entries(RT_TEXT_ENTRIES, 0);
/// A zeroed ApiVal to insert from (too big for comfort on the 512-byte stack).
#[map(name = "CUDA_ZERO")]
static CUDA_ZERO: PerCpuArray<ApiVal> = PerCpuArray::with_max_entries(1, 0);

#[repr(C)]
#[derive(Clone, Copy)]
struct ThreadState {
    /// Probed calls in progress on this thread (runtime -> driver nesting).
    depth: u32,
    /// `CUDA_RET_GEN` at the outermost call's entry.
    gen: u32,
    /// The stack pointer at the outermost call's entry. A call nested in it runs on a lower
    /// stack; a later call at its level or above it means it returned, unseen; a return above
    /// it is its own.
    outer_sp: u64,
    /// The outermost call: entry time and register arguments.
    ts: u64,
    args: [u64; 6],
    /// The first stack argument (the 7th), read at entry while the frame is intact.
    arg7: u64,
    /// The innermost nested call's first three arguments: nested calls matter only for names
    /// (cuModuleGetFunction inside the runtime's lazy loading), which need no more.
    inner: [u64; 3],
    /// For the budget's estimate (`count_step`): the window generation + 1 at the thread's
    /// last counted launch (0: none yet), and the copies and syncs it made since.
    launched_gen: u32,
    pending: u32,
    /// The outermost call is a launch entered while launches were off (`LAUNCHES_OFF_SLOT`):
    /// tracked, so that the calls inside it are taken as nested (a runtime launch's driver
    /// launch, made once launches are on again), but not counted.
    uncounted: u32,
    /// For an outermost copy or sync, `CALL_GEN_SLOT` + 1 at its entry (0: another call).
    call_gen: u32,
}

const FRESH: ThreadState = ThreadState {
    depth: 0,
    gen: 0,
    outer_sp: 0,
    ts: 0,
    args: [0; 6],
    arg7: 0,
    inner: [0; 3],
    launched_gen: 0,
    pending: 0,
    uncounted: 0,
    call_gen: 0,
};

/// `tracer_common::cuda::GATE_AT_MAP` and `GATE_WAKE_MAP`.
#[map(name = "CUDA_GATE_AT")]
static CUDA_GATE_AT: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);
#[map(name = "CUDA_GATE_WAKE")]
static CUDA_GATE_WAKE: RingBuf = RingBuf::with_byte_size(4096, 0);

/// `tracer_common::cuda::RET_GEN_MAP`, the window generation (`WINDOW_GEN_SLOT`) and whether
/// launches are off (`LAUNCHES_OFF_SLOT`).
#[map(name = "CUDA_RET_GEN")]
static CUDA_RET_GEN: Array<u64> = Array::with_max_entries(RET_GEN_SLOTS, 0);

/// `tracer_common::cuda::LAUNCH_RUNS_MAP`.
#[map(name = "CUDA_LAUNCH_RUNS")]
static CUDA_LAUNCH_RUNS: PerCpuArray<u64> = PerCpuArray::with_max_entries(LAUNCH_RUNS_SLOTS, 0);

/// Counts a run at a launch function in `slot` (0 entry, 1 return), or a traced thread's step
/// (`count_step`); the count so far.
#[inline(always)]
fn launch_run(slot: u32) -> u64 {
    launch_add(slot, 1)
}

#[inline(always)]
fn launch_add(slot: u32, n: u64) -> u64 {
    match CUDA_LAUNCH_RUNS.get_ptr_mut(slot) {
        // Per-CPU slot, as `PROG_HITS`.
        Some(p) => unsafe {
            *p += n;
            *p
        },
        None => 0,
    }
}

/// Counts a traced thread's run at a function the launch windows do not switch (a copy, a
/// sync, an allocation) in `slot` (`OTHER_ENTRY_SLOT`, `OTHER_RET_SLOT`).
#[inline(always)]
fn other_run(shape: u8, slot: u32) {
    if !is_launch_shape(shape) {
        launch_run(slot);
    }
}

/// Whether the call is a copy or a sync: the calls the copy and sync probes' windows switch.
#[inline(always)]
fn is_call(cookie: &Cookie) -> bool {
    cookie.category == Category::CudaMemcpy as u8 || cookie.category == Category::CudaSync as u8
}

/// Counts a traced thread's entry at a copy or a sync (`CALL_RUNS_SLOT`): the calls the copy
/// and sync probes' windows see.
#[inline(always)]
fn call_run(cookie: &Cookie) {
    if is_call(cookie) {
        launch_run(CALL_RUNS_SLOT);
    }
}

/// What an outermost call entered now keeps as its `call_gen`.
#[inline(always)]
fn outer_call_gen(cookie: &Cookie) -> u32 {
    if is_call(cookie) {
        (CUDA_RET_GEN.get(CALL_GEN_SLOT).copied().unwrap_or(0) as u32).wrapping_add(1)
    } else {
        0
    }
}

/// The thread's outermost call is a copy or sync entered before a copy window's return probes
/// went: it may have lost its return (a sync still waiting at the close), and a return at its
/// stack level now is another call's, whose entry went unseen (made as the next window's return
/// probes went on, before its entry probes): it would take the lost call's entry time, and
/// the seconds between the windows with it.
#[inline(always)]
fn stale_call(st: &ThreadState) -> bool {
    st.call_gen != 0
        && st.call_gen
            != (CUDA_RET_GEN.get(CALL_GEN_SLOT).copied().unwrap_or(0) as u32).wrapping_add(1)
}

#[uprobe]
pub fn cuda_entry(ctx: ProbeContext) -> u32 {
    crate::maps::hit(tracer_common::hits::Prog::CudaEntry);
    let cookie = Cookie::unpack(unsafe { bpf_get_attach_cookie(ctx.as_ptr()) });
    let mut off = false;
    if is_launch_shape(cookie.shape) {
        let runs = launch_run(0);
        // The budget's watchdog sleeps until this CPU's launch runs reach the count where the
        // window's share of the bucket may run dry: a storm is cut at once, a trickle wakes
        // nobody. Every run counts, as in the watchdog's sums (a process not traced pays the
        // trap too). Per CPU, as the runs: each CPU's own count is armed.
        let at = CUDA_GATE_AT.get(0).copied().unwrap_or(0);
        if at != 0 && runs == at {
            let _ = CUDA_GATE_WAKE.output::<u64>(&runs, 0);
        }
        // The window is being closed (or its probes are still going on): no outermost launch
        // starts (below). Its runs are not the window's.
        off = CUDA_RET_GEN.get(LAUNCHES_OFF_SLOT).copied().unwrap_or(0) != 0;
        if off {
            launch_run(CLOSING_RUNS_SLOT);
        }
    }
    let (tgid, tid) = current_ids();
    // Processes that are surely not traced stop at an array read (the library's probes fire
    // in every process that maps it).
    if !maybe_traced(tgid) {
        return 0;
    }
    // Once the trace's window has ended, calls are not its (the report, the counts per second
    // of the window, is built after it): tracked as the calls made while launches are off,
    // not counted.
    let stopped = account::stopped();
    if CUDA_ENTRY_ONLY.load() != 0 {
        // No call depth here: every launch entry counts, so none while launches are off.
        if off || stopped {
            return 0;
        }
        return count_entry(tgid, tid, &cookie);
    }
    let pid_tgid = ((tgid as u64) << 32) | tid as u64;
    // A thread has a call state only once its process was found traced, and loses it when it
    // exits (`cuda_thread_exit`): a found state spares the `TRACED` lookup on every call.
    let found = CUDA_THREAD.get_ptr_mut(&pid_tgid);
    if found.is_none() && !is_traced(tgid) {
        return 0;
    }
    other_run(cookie.shape, OTHER_ENTRY_SLOT);
    call_run(&cookie);
    // One clock read for the gate, the time accounting and the call's start. The gate sees
    // every traced launch, even one a full map leaves uncounted.
    let now = unsafe { bpf_ktime_get_ns() };
    if !off {
        gate_seen(cookie.shape, now);
    }
    let st = match found {
        Some(p) => p,
        None => {
            if CUDA_THREAD.insert(&pid_tgid, &FRESH, 0).is_err() {
                count_drop(Drop::CudaFull);
                return 0;
            }
            match CUDA_THREAD.get_ptr_mut(&pid_tgid) {
                Some(p) => p,
                None => return 0,
            }
        }
    };
    // Only this thread touches its state.
    let st = unsafe { &mut *st };
    // A call at the outermost call's stack level or above it is not nested in it: that call
    // returned without its return probe running (the budget's windows drop the entry and
    // return links one after another, and a launch in flight then loses its return). Its
    // depth would otherwise stay up for good: on an H100 a PyTorch loop's copies and syncs
    // went uncounted after the first window closed, 2 of 2,339 counted.
    // Likewise a call entered after a window's return probes went: the outermost call may
    // have been in flight then, and a deeper caller's later calls would look nested in it.
    let sp = unsafe { (*ctx.regs).rsp };
    let gen = CUDA_RET_GEN.get(0).copied().unwrap_or(0) as u32;
    let call_gen = outer_call_gen(&cookie);
    if st.depth > 0 && (sp >= st.outer_sp || st.gen != gen || stale_call(st)) {
        st.depth = 0;
    }
    // A launch inside one that started before launches went off is nested as usual (its
    // return must find the depth it raised). A new one is the outermost call, uncounted: the
    // launches inside it are its own even once launches are on again (a window opens while
    // the runtime's launch is in flight, before its driver launch). So is a driver launch
    // called from a runtime whose launch entry went unseen: not a direct driver launch.
    if st.depth == 0 {
        st.uncounted = u32::from(off || stopped || unseen_runtime_call(tgid, sp, cookie.shape));
        if st.uncounted != 0 {
            st.depth = 1;
            st.outer_sp = sp;
            st.gen = gen;
            st.call_gen = call_gen;
            return 0;
        }
    }
    st.depth += 1;
    if st.depth > 1 {
        if is_name_shape(cookie.shape) {
            st.inner = [
                ctx.arg::<u64>(0).unwrap_or(0),
                ctx.arg::<u64>(1).unwrap_or(0),
                ctx.arg::<u64>(2).unwrap_or(0),
            ];
        }
        return 0;
    }
    st.outer_sp = sp;
    st.gen = gen;
    st.call_gen = call_gen;
    count_step(&cookie, st, pid_tgid);
    let mut i = 0;
    while i < 6 {
        st.args[i] = ctx.arg::<u64>(i).unwrap_or(0);
        i += 1;
    }
    st.arg7 = 0;
    if cookie.shape == Shape::LaunchDrv as u8 || cookie.shape == Shape::Copy2dRt as u8 {
        let sp = unsafe { (*ctx.regs).rsp };
        st.arg7 = unsafe { bpf_probe_read_user((sp + 8) as *const u64) }.unwrap_or(0);
    }
    // Where the call was made. Launches skip the native stack walk: they are the high-rate
    // calls (the budget gates them), and their Python line says where they came from.
    let ustack = if is_launch_shape(cookie.shape) {
        -1
    } else {
        // As the sampler does.
        let young = match account::state(tid).filter(|st| unsafe { (**st).tgid } == tgid) {
            Some(st) => crate::maps::stacks_young(unsafe { &*st }, now),
            None => crate::maps::stateless_young(tgid),
        };
        crate::maps::user_stack(&ctx, young).unwrap_or(-1)
    };
    let pystack = crate::python::python_stack(tgid, tid);
    account::enter_override(
        tid,
        now,
        cookie.category as u32,
        cookie.fid as i32,
        ustack,
        pystack,
    );
    st.ts = now;
    0
}

/// Whether a driver launch entered at no call depth was called from a shared runtime's code:
/// the runtime launch around it was entered before its entry probe was on. Only direct driver
/// launches (Triton's, a jiterator's) pay the read and the lookup; everything a runtime
/// launches arrives nested.
#[inline(always)]
fn unseen_runtime_call(tgid: u32, sp: u64, shape: u8) -> bool {
    if shape != Shape::LaunchDrv as u8 && shape != Shape::LaunchDrvEx as u8 {
        return false;
    }
    let Some(text) = (unsafe { CUDA_RT_TEXT.get(&tgid) }) else {
        return false;
    };
    // At a function's first instruction the stack pointer points at the return address.
    match unsafe { bpf_probe_read_user(sp as *const u64) } {
        Ok(ret) => text.holds(ret),
        Err(_) => false,
    }
}

/// A process's image is gone (an exec, or its last thread's exit): its runtimes' code with it.
#[inline(always)]
pub fn forget_runtime_text(tgid: u32) {
    let _ = CUDA_RT_TEXT.remove(&tgid);
}

/// `--cuda-entry-only`: counts the call in its (process, thread, function) row. A thread with
/// an accounting state sums its calls of one function there (`held_api_count`):
/// an array slot, where a row is a hash lookup per call. Otherwise a row is made only for a
/// traced process, so a found one spares the `TRACED` lookup; rows outlive their threads, so
/// a process that took a traced one's pid and thread id during the trace (a pid wrap) would be
/// counted under it.
#[inline(always)]
fn count_entry(tgid: u32, tid: u32, cookie: &Cookie) -> u32 {
    let fid = cookie.fid as u32;
    if let Some(st) = account::live_state(tgid, tid) {
        other_run(cookie.shape, OTHER_ENTRY_SLOT);
        call_run(cookie);
        gate_seen(cookie.shape, unsafe { bpf_ktime_get_ns() });
        if st.held_api_fid != fid as i32 {
            flush_api(tid, st);
            st.held_api_fid = fid as i32;
        }
        st.held_api_count += 1;
        return 0;
    }
    let key = ApiKey {
        pid: tgid,
        tid,
        fid,
        _pad: 0,
    };
    let found = CUDA_API.get_ptr_mut(&key);
    if found.is_none() && !is_traced(tgid) {
        return 0;
    }
    other_run(cookie.shape, OTHER_ENTRY_SLOT);
    call_run(cookie);
    gate_seen(cookie.shape, unsafe { bpf_ktime_get_ns() });
    let v = match found {
        Some(v) => v,
        None => match api_val(tgid, tid, fid) {
            Some(v) => v,
            None => return 0,
        },
    };
    // Only this thread writes its row.
    unsafe { (*v).count += 1 };
    0
}

/// Writes out the calls the accounting state `st` holds (`held_api_count`) to its thread's row.
#[inline(always)]
pub fn flush_api(tid: u32, st: &mut tracer_common::wall::ThreadState) {
    if st.held_api_count == 0 {
        return;
    }
    if let Some(v) = api_val(st.tgid, tid, st.held_api_fid as u32) {
        // Only the thread writes its row (its own probes, its death, a replaced stale state).
        unsafe { (*v).count += st.held_api_count };
    }
    st.held_api_count = 0;
}

/// Counts a traced thread's outermost launches and copies and syncs for the budget's estimate,
/// which fills in the launches between its windows from the copies and syncs made there.
/// The copies and syncs made between two counted launches of one window are the window's
/// (`STEADY_ON_SLOT`): the launch entry runs only while a window's probes are on, and the
/// window generation (`WINDOW_GEN_SLOT`) moves on as each window opens, so copies followed
/// by a launch of the next window are not. A window then holds as many steps' launches as steps'
/// copies on average, the partial step at its start and the one at its end making up one
/// between them, whatever the time its probes took to go on and off. Counted here, where the
/// launch probes run, since user space cannot tell when they started and stopped to better
/// than milliseconds.
#[inline(always)]
fn count_step(cookie: &Cookie, st: &mut ThreadState, pid_tgid: u64) {
    let gen = CUDA_RET_GEN.get(WINDOW_GEN_SLOT).copied().unwrap_or(0) as u32;
    let this = gen.wrapping_add(1);
    if is_launch_shape(cookie.shape) {
        launch_run(OUTER_LAUNCH_SLOT);
        if let Some(p) = CUDA_LAUNCH_RUNS.get_ptr_mut(LAUNCHER_SLOT) {
            // Per-CPU slot: only this CPU writes it.
            unsafe { *p = pid_tgid };
        }
        if st.launched_gen == this && st.pending > 0 {
            launch_add(STEADY_ON_SLOT, st.pending as u64);
            launch_run(STEADY_STEPS_SLOT);
        }
        st.pending = 0;
        st.launched_gen = this;
    } else if (cookie.category == Category::CudaMemcpy as u8
        || cookie.category == Category::CudaSync as u8)
        // Only a thread that has launched: a thread that copies and never launches (a
        // loader's) would have its copies multiplied by another thread's launches per copy.
        && st.launched_gen != 0
    {
        launch_run(STEADY_CALLS_SLOT);
        if st.launched_gen == this {
            st.pending = st.pending.saturating_add(1);
        }
    }
}

/// Records a traced launch's time for the budget's gate (first and last of the window).
#[inline(always)]
fn gate_seen(shape: u8, now: u64) {
    if !is_launch_shape(shape) {
        return;
    }
    // Per-CPU slots: only this CPU writes them (and user space, between windows).
    if let Some(last) = CUDA_GATE_LAST.get_ptr_mut(0) {
        unsafe { *last = now };
    }
    if let Some(first) = CUDA_GATE_FIRST.get_ptr_mut(0) {
        if unsafe { *first } == 0 {
            unsafe { *first = now };
        }
    }
}

#[inline(always)]
fn is_launch_shape(shape: u8) -> bool {
    shape == Shape::LaunchRt as u8
        || shape == Shape::LaunchRtEx as u8
        || shape == Shape::LaunchDrv as u8
        || shape == Shape::LaunchDrvEx as u8
}

#[inline(always)]
fn is_name_shape(shape: u8) -> bool {
    shape == Shape::NameOut as u8
        || shape == Shape::AliasOut as u8
        || shape == Shape::Register as u8
}

#[uretprobe]
pub fn cuda_ret(ctx: RetProbeContext) -> u32 {
    crate::maps::hit(tracer_common::hits::Prog::CudaRet);
    let cookie = Cookie::unpack(unsafe { bpf_get_attach_cookie(ctx.as_ptr()) });
    if is_launch_shape(cookie.shape) {
        launch_run(1);
    }
    // Only traced threads have a call state (no TRACED lookup: one hash lookup less per call).
    let (tgid, tid) = current_ids();
    let now = unsafe { bpf_ktime_get_ns() };
    let pid_tgid = ((tgid as u64) << 32) | tid as u64;
    let Some(st) = CUDA_THREAD.get_ptr_mut(&pid_tgid) else {
        // Attached while the call was already running: no entry was seen.
        return 0;
    };
    other_run(cookie.shape, OTHER_RET_SLOT);
    let st = unsafe { &mut *st };
    if st.depth == 0 {
        return 0;
    }
    if stale_call(st) {
        st.depth = 0;
        return 0;
    }
    // After its `ret` the stack pointer is one slot above the call's entry one (x86-64: the
    // return address popped). One slot above the outermost call's, this is the outermost call
    // returning, whatever nested returns went unseen. Higher still, the state is a lost
    // call's (a call made in a shallower frame since): forgotten, and this return, whose
    // entry was not seen, not counted. At or below it, a nested call returns; at depth 1 that
    // is one whose entry was not seen (its return probe on and its entry probe not yet or no
    // longer, as the budget's windows attach and drop the links one after another), which
    // must not take the outermost call's count: a runtime launch would read as a driver
    // launch.
    let sp = unsafe { (*ctx.regs).rsp };
    let outer_ret = st.outer_sp.wrapping_add(8);
    if sp == outer_ret {
        st.depth = 1;
    } else if sp > outer_ret {
        st.depth = 0;
        return 0;
    } else if st.depth == 1 {
        return 0;
    }
    let depth = st.depth;
    st.depth = depth - 1;
    // The arguments of this level: the outermost call's, or the innermost nested call's.
    let stash_args = if depth == 1 {
        st.args
    } else {
        [st.inner[0], st.inner[1], st.inner[2], 0, 0, 0]
    };
    let stash_ts = st.ts;
    let stash_arg7 = st.arg7;
    let rc: i64 = ctx.ret();
    let code = if cookie.flags & FLAG_NO_RESULT != 0 {
        0
    } else {
        rc as i32
    };
    let ok = code == 0;
    let shape = cookie.shape;
    // Names are useful from any level; everything else only from the outermost call.
    if ok {
        if shape == Shape::NameOut as u8 {
            emit_name(
                tgid,
                tid,
                cookie.fid as u32,
                read_u64(stash_args[0]),
                stash_args[2],
            );
        } else if shape == Shape::Register as u8 {
            emit_name(tgid, tid, cookie.fid as u32, stash_args[1], stash_args[2]);
        } else if shape == Shape::AliasOut as u8 {
            emit(
                EventKind::Alias,
                tgid,
                tid,
                cookie.fid as u32,
                read_u64(stash_args[0]),
                stash_args[1],
            );
        }
    }
    if depth != 1 || st.uncounted != 0 {
        return 0;
    }
    account::exit_override(tid, now);
    let dur = now.saturating_sub(stash_ts);
    let fid = cookie.fid as u32;
    crate::timeline::cuda_call(
        tgid,
        tid,
        fid,
        &cookie,
        code,
        stash_ts,
        dur,
        &stash_args,
        stash_arg7,
    );
    if let Some(v) = api_val(tgid, tid, fid) {
        // Only this thread writes this key, and a thread runs on one CPU at a time.
        let v = unsafe { &mut *v };
        v.count += 1;
        v.total_ns += dur;
        if v.min_ns == 0 || dur < v.min_ns {
            v.min_ns = dur;
        }
        if dur > v.max_ns {
            v.max_ns = dur;
        }
        let b = log2_bucket(dur);
        if b < HIST_BUCKETS {
            v.hist[b] += 1;
        }
        if !ok {
            v.errors += 1;
        }
    }
    if !ok {
        let k = ErrKey {
            pid: tgid,
            fid,
            code,
            _pad: 0,
        };
        add_to(&CUDA_ERRS, &k, 1, Drop::CudaFull);
        return 0;
    }
    let a = &stash_args;
    if shape == Shape::LaunchRt as u8 {
        // dim3 is 12 bytes, passed by value in two registers: (x | y << 32), z.
        let grid = [a[1] as u32, (a[1] >> 32) as u32, a[2] as u32];
        let block = [a[3] as u32, (a[3] >> 32) as u32, a[4] as u32];
        launch(tgid, fid, a[0], grid, block, dur);
    } else if shape == Shape::LaunchDrv as u8 {
        let grid = [a[1] as u32, a[2] as u32, a[3] as u32];
        let block = [a[4] as u32, a[5] as u32, stash_arg7 as u32];
        launch(tgid, fid, a[0], grid, block, dur);
    } else if shape == Shape::LaunchRtEx as u8 || shape == Shape::LaunchDrvEx as u8 {
        // cudaLaunchConfig_t (dim3 gridDim, dim3 blockDim) and CUlaunchConfig (gridDimX..Z,
        // blockDimX..Z) both start with six unsigned ints.
        let dims: [u32; 6] =
            unsafe { bpf_probe_read_user(a[0] as *const [u32; 6]) }.unwrap_or([0; 6]);
        launch(
            tgid,
            fid,
            a[1],
            [dims[0], dims[1], dims[2]],
            [dims[3], dims[4], dims[5]],
            dur,
        );
    } else if shape == Shape::CopyRt as u8 {
        copy(tgid, a[3] as u32, cookie.flags, a[2], dur);
    } else if shape == Shape::Copy2dRt as u8 {
        copy(
            tgid,
            stash_arg7 as u32,
            cookie.flags,
            a[4].wrapping_mul(a[5]),
            dur,
        );
    } else if shape == Shape::Copy3dRt as u8 {
        // cudaMemcpy3DParms: srcArray, srcPos (3 x size_t), srcPtr (4 x 8), dstArray, dstPos,
        // dstPtr, then extent {width, height, depth} at 128 and kind at 152.
        let ext: [u64; 4] =
            unsafe { bpf_probe_read_user((a[0] + 128) as *const [u64; 4]) }.unwrap_or([0; 4]);
        let bytes = ext[0].wrapping_mul(ext[1]).wrapping_mul(ext[2]);
        copy(tgid, ext[3] as u32, cookie.flags, bytes, dur);
    } else if shape == Shape::CopyBytes3 as u8 {
        copy(tgid, cookie.dir as u32, cookie.flags, a[2], dur);
    } else if shape == Shape::CopyBytes5 as u8 {
        copy(tgid, cookie.dir as u32, cookie.flags, a[4], dur);
    } else if shape == Shape::AllocOut as u8 {
        emit(EventKind::Alloc, tgid, tid, fid, read_u64(a[0]), a[1]);
    } else if shape == Shape::AllocPitch as u8 {
        let pitch = read_u64(a[1]);
        emit(
            EventKind::Alloc,
            tgid,
            tid,
            fid,
            read_u64(a[0]),
            pitch.wrapping_mul(a[3]),
        );
    } else if shape == Shape::Free as u8 && a[0] != 0 {
        emit(EventKind::Free, tgid, tid, fid, a[0], 0);
    }
    0
}

/// A thread that exits inside a probed call (killed, `pthread_exit` in a callback) never
/// returns; its depth must not survive into a later thread that reuses the id.
#[tracepoint]
pub fn cuda_thread_exit(_ctx: TracePointContext) -> u32 {
    crate::maps::hit(tracer_common::hits::Prog::CudaThreadExit);
    let (tgid, tid) = current_ids();
    // Not `is_traced`: a process's last thread leaves `TRACED` (sched_process_exit, attached
    // before this) before it gets here, and a state left behind would pass `cuda_entry`'s
    // check for a later process with the same ids.
    if !maybe_traced(tgid) {
        return 0;
    }
    let pid_tgid = ((tgid as u64) << 32) | tid as u64;
    let _ = CUDA_THREAD.remove(&pid_tgid);
    0
}

#[inline(always)]
fn api_val(pid: u32, tid: u32, fid: u32) -> Option<*mut ApiVal> {
    let key = ApiKey {
        pid,
        tid,
        fid,
        _pad: 0,
    };
    if let Some(v) = CUDA_API.get_ptr_mut(&key) {
        return Some(v);
    }
    let zero = CUDA_ZERO.get_ptr(0)?;
    if CUDA_API.insert(&key, unsafe { &*zero }, 1).is_err() && CUDA_API.get_ptr(&key).is_none() {
        count_drop(Drop::CudaFull);
        return None;
    }
    CUDA_API.get_ptr_mut(&key)
}

#[inline(always)]
fn read_u64(ptr: u64) -> u64 {
    if ptr == 0 {
        return 0;
    }
    unsafe { bpf_probe_read_user(ptr as *const u64) }.unwrap_or(0)
}

#[inline(always)]
fn launch(pid: u32, fid: u32, func: u64, grid: [u32; 3], block: [u32; 3], dur: u64) {
    let key = LaunchKey {
        pid,
        fid,
        func,
        grid,
        block,
    };
    if let Some(v) = CUDA_LAUNCH.get_ptr_mut(&key) {
        // Several threads may launch the same kernel at once.
        unsafe {
            atomic_add(&raw mut (*v).count, 1);
            atomic_add(&raw mut (*v).total_ns, dur);
        }
        return;
    }
    let val = LaunchVal {
        count: 1,
        total_ns: dur,
    };
    if CUDA_LAUNCH.insert(&key, &val, 1).is_err() {
        match CUDA_LAUNCH.get_ptr_mut(&key) {
            Some(v) => unsafe {
                atomic_add(&raw mut (*v).count, 1);
                atomic_add(&raw mut (*v).total_ns, dur);
            },
            None => count_drop(Drop::CudaFull),
        }
    }
}

#[inline(always)]
fn copy(pid: u32, dir: u32, flags: u8, bytes: u64, dur: u64) {
    if dir == DIR_NONE as u32 {
        return;
    }
    let key = CopyKey {
        pid,
        dir,
        asynchronous: (flags & FLAG_ASYNC) as u32,
        _pad: 0,
    };
    let add = |v: *mut CopyVal| unsafe {
        atomic_add(&raw mut (*v).count, 1);
        atomic_add(&raw mut (*v).bytes, bytes);
        atomic_add(&raw mut (*v).total_ns, dur);
    };
    if let Some(v) = CUDA_COPY.get_ptr_mut(&key) {
        add(v);
        return;
    }
    let val = CopyVal {
        count: 1,
        bytes,
        total_ns: dur,
    };
    if CUDA_COPY.insert(&key, &val, 1).is_err() {
        match CUDA_COPY.get_ptr_mut(&key) {
            Some(v) => add(v),
            None => count_drop(Drop::CudaFull),
        }
    }
}

#[inline(always)]
fn emit(kind: EventKind, pid: u32, tid: u32, fid: u32, addr: u64, size: u64) {
    let Some(mut entry) = CUDA_EVENTS.reserve::<[u64; 5]>(0) else {
        count_drop(Drop::CudaEventsFull);
        return;
    };
    // The header of a CudaEvent, without the name.
    entry.write([
        (kind as u64) | ((pid as u64) << 32),
        (tid as u64) | ((fid as u64) << 32),
        unsafe { bpf_ktime_get_ns() },
        addr,
        size,
    ]);
    entry.submit(crate::maps::BPF_RB_NO_WAKEUP);
}

#[inline(always)]
fn emit_name(pid: u32, tid: u32, fid: u32, handle: u64, name_ptr: u64) {
    if handle == 0 || name_ptr == 0 {
        return;
    }
    let Some(mut entry) = CUDA_EVENTS.reserve::<CudaEvent>(0) else {
        count_drop(Drop::CudaEventsFull);
        return;
    };
    let ev = entry.as_mut_ptr();
    unsafe {
        (*ev).kind = EventKind::Name as u32;
        (*ev).pid = pid;
        (*ev).tid = tid;
        (*ev).fid = fid;
        (*ev).ts_ns = bpf_ktime_get_ns();
        (*ev).addr = handle;
        (*ev).size = 0;
        let name = &mut (*ev).name;
        if bpf_probe_read_user_str_bytes(name_ptr as *const u8, name).is_err() {
            name[0] = 0;
        }
    }
    entry.submit(crate::maps::BPF_RB_NO_WAKEUP);
}
