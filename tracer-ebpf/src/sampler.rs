//! CPU sampler: a perf_event program on the software cpu-clock event, one per CPU. Samples of
//! traced processes are counted in the kernel by (pid, tid, user stack, kernel stack, comm);
//! nothing is streamed per sample.

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_ktime_get_ns},
    macros::{map, perf_event},
    maps::HashMap,
    programs::PerfEventContext,
};
use tracer_common::{
    cpu::{SampleKey, CPU_COUNTS_ENTRIES},
    drops::Drop,
};

use tracer_common::hits::Prog;

use crate::maps::{
    add_to, by_path, current_ids, is_traced, kernel_stack_id, stacks_young, stateless_young,
    traced, user_stack_id,
};

#[map(name = "CPU_COUNTS")]
static CPU_COUNTS: HashMap<SampleKey, u64> = HashMap::with_max_entries(CPU_COUNTS_ENTRIES, 0);

#[perf_event]
pub fn cpu_sample(ctx: PerfEventContext) -> u32 {
    by_path(Prog::CpuSample, |p| sample(&ctx, p));
    0
}

#[inline(always)]
fn sample(ctx: &PerfEventContext, p: Prog) {
    let (tgid, tid) = current_ids();
    if tid == 0 || !is_traced(tgid) {
        return;
    }
    traced(p);
    // It is running: a state off CPU missed its switch-in (`sched::gputrace_switched_in`).
    // A thread that makes no syscall and never leaves the CPU would have no other program
    // of its own to close it.
    let mut young = None;
    if let Some(st) = crate::account::state(tid) {
        if unsafe { (*st).tgid } == tgid {
            let now = unsafe { bpf_ktime_get_ns() };
            young = Some(stacks_young(unsafe { &*st }, now));
            crate::sched::running(tid, st, crate::sched::SAMPLE_MIN_RUN_NS, || now);
        }
    }
    let young = young.unwrap_or_else(|| stateless_young(tgid));
    let user_stack_id = user_stack_id(ctx, young);
    let kernel_stack_id = kernel_stack_id(ctx);
    let key = SampleKey {
        pid: tgid,
        tid,
        user_stack_id,
        kernel_stack_id,
        comm: bpf_get_current_comm().unwrap_or([0; 16]),
        py_stack: crate::python::python_stack(tgid, tid),
        exec_id: crate::proc::self_exec_id(),
        _pad: 0,
    };
    add_to(&CPU_COUNTS, &key, 1, Drop::CpuCountsFull);
}
