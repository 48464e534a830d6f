//! Probe families beyond the CPU sampler (time accounting, CUDA, ...) plug into a trace through
//! one trait, so the session stays the same size as families are added.

use anyhow::Result;
use aya::Ebpf;

use crate::{cli::TraceArgs, report::ReportData, symbolize::Symbolizer, tracker::Tracker};

pub struct AttachCtx<'a> {
    pub args: &'a TraceArgs,
    /// Processes traced at attach time (roots and their existing descendants).
    pub pids: &'a [u32],
    /// The `-- CMD` child, still waiting to exec: its life in the trace starts at the release.
    pub launched: Option<u32>,
    /// The uprobe programs, loaded for the links this kernel has.
    pub uprobes: &'a crate::uprobes::Uprobes,
    /// The kernel's BTF as aya reads it, where it was read for the programs loaded ahead
    /// (`bpf::preload`; ~20 ms a read here).
    pub btf: Option<&'a aya::Btf>,
}

pub struct FinishCtx<'a> {
    pub args: &'a TraceArgs,
    pub tracker: &'a Tracker,
    pub symbolizer: &'a mut Symbolizer,
    /// Splices Python frames into the stacks the accounting rows carry.
    pub python: &'a crate::python::Python,
    /// The window in CLOCK_MONOTONIC ns (the clock of `bpf_ktime_get_ns`).
    pub window_start_ktime: u64,
    pub window_end_ktime: u64,
    pub uprobes: &'a crate::uprobes::Uprobes,
}

pub trait ProbeFamily {
    fn name(&self) -> &'static str;
    /// Sets loader globals before the object is loaded (`override_global`); the values live
    /// in the family, set up by its constructor.
    fn configure<'a>(&'a self, _loader: &mut aya::EbpfLoader<'a>) -> Result<()> {
        Ok(())
    }
    /// The programs `attach` will load first, heaviest first, to be loaded ahead of it on
    /// every CPU (`bpf::preload`).
    fn preload(&self) -> Vec<crate::bpf::Preload> {
        Vec::new()
    }
    /// Loads and attaches this family's programs.
    fn attach(&mut self, ebpf: &mut Ebpf, ctx: &AttachCtx<'_>) -> Result<()>;
    /// Called once every family has attached, as the trace's window starts: at `opened_ns`
    /// (`ktime_now`), read just before the first family's call, from which the report's
    /// window and what a family times from the window's start count.
    fn attached(&mut self, _ebpf: &mut Ebpf, _opened_ns: u64) -> Result<()> {
        Ok(())
    }
    /// Called just before a launched command (`-- CMD`) is released to exec.
    fn before_release(&mut self, _ebpf: &mut Ebpf, _pid: u32) -> Result<()> {
        Ok(())
    }
    /// Called as the trace's window ends, in the families' order (but the one that
    /// [`ProbeFamily::ends_the_window`] first), before anything else is read: what counts to
    /// the window's end stops counting here (the report that follows takes from ~0.1 s to
    /// seconds to build).
    fn window_ended(&mut self, _ebpf: &mut Ebpf, _tracker: &Tracker) -> Result<()> {
        Ok(())
    }
    /// Whether this family's `window_ended` is the window's end: called first, just after
    /// the session reads the end's clock. The time accounting's stop is: a thread alive
    /// throughout was alive for the window, not for the window and the other families' stops.
    fn ends_the_window(&self) -> bool {
        false
    }
    /// Called once the trace has ended, before any family's `finish`: measurements that every
    /// family's report should see (the trap costs).
    fn ended(&mut self, _ebpf: &mut Ebpf, _tracker: &Tracker) {}
    /// Called every 100 ms while tracing (drain ring buffers, attach to new libraries).
    fn tick(&mut self, _ebpf: &mut Ebpf, _tracker: &Tracker) -> Result<()> {
        Ok(())
    }
    /// Threads whose syscalls cost more than the budget (`ProcEventKind::SyscallStorm`), as
    /// soon as the kernel reports them.
    fn storms(
        &mut self,
        _ebpf: &mut Ebpf,
        _storms: &[tracer_common::proc::ProcEvent],
    ) -> Result<()> {
        Ok(())
    }
    /// Processes that mapped a file executable (a library came in), a few milliseconds after
    /// the kernel reported it: a family that probes libraries looks at their maps now rather
    /// than at its next scan, before the library's first calls. `pids`: (pid, when it mapped
    /// the first of them, ktime ns).
    fn mapped(&mut self, _ebpf: &mut Ebpf, _pids: &[(u32, u64)]) -> Result<()> {
        Ok(())
    }
    /// Reads what the kernel aggregated and fills in its part of the report.
    fn finish(
        &mut self,
        ebpf: &mut Ebpf,
        ctx: &mut FinishCtx<'_>,
        data: &mut ReportData,
    ) -> Result<()>;
}

/// CLOCK_MONOTONIC now, in ns: the clock `bpf_ktime_get_ns` reads.
pub fn ktime_now() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// `clock` now, in ns.
pub fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The families a trace runs, in the order they attach.
pub fn families(args: &TraceArgs) -> Vec<Box<dyn ProbeFamily>> {
    let trap = crate::overhead::SharedTrapCost::default();
    let sys_trap = crate::overhead::SharedSyscallTrap::default();
    vec![
        // First: it reads every program's run time before a family unloads its programs, and
        // it measures the trap costs the CUDA family's gate works with.
        Box::new(crate::overhead::OverheadFamily::new(
            args.max_overhead,
            trap.clone(),
            sys_trap.clone(),
        )),
        Box::new(crate::accounting::Accounting::new(
            args.max_overhead,
            sys_trap,
        )),
        // Before CUDA: the CUDA family names the kernels of the launches on the timeline.
        Box::new(crate::streams::TimelineFamily::new(args)),
        Box::new(crate::cuda::CudaFamily::new(args, trap)),
    ]
}
