//! gputrace's own cost while tracing (issue 6): the programs' run time from the kernel's BPF
//! statistics plus calibrated trap costs (`budget`), shown in every report; and the gate that
//! switches the CUDA launch probes on and off to stay under `--max-overhead`.
//!
//! The gate detaches and re-attaches the launch probes' links: an attached uprobe or uretprobe
//! costs its trap on every call even when the program returns at once, so a BPF-side flag would
//! not save the cost that matters.

use std::{
    collections::HashMap,
    os::fd::{AsFd, AsRawFd, OwnedFd},
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::Result;
use aya::{
    programs::{
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLink, UProbeLinkId, UProbeScope},
        Program, UProbe,
    },
    Ebpf,
};
use tracer_common::cuda::{ENTRY_PROG, RET_PROG};

use crate::{
    budget::{self, Gate, TickObs},
    cuda::table::FUNCS,
    probes::{AttachCtx, FinishCtx, ProbeFamily},
    report::{
        model::overhead::{Overhead, ProbeSampling, ProgramCost, ThreadOverhead},
        model::Report,
        ReportData,
    },
};

/// Keeps the kernel's BPF run-time statistics on for the trace and reads every program's cost
/// at the end (before any family unloads its programs: this family finishes first).
pub struct OverheadFamily {
    budget: f64,
    stats: Option<OwnedFd>,
}

impl OverheadFamily {
    pub fn new(budget: f64) -> OverheadFamily {
        OverheadFamily {
            budget,
            stats: None,
        }
    }
}

/// Trap cost outside the program for one hit of `name`.
fn trap_ns(name: &str, prog: &Program) -> f64 {
    match prog {
        Program::UProbe(_) if name == RET_PROG => budget::URETPROBE_TRAP_NS,
        Program::UProbe(_) => budget::UPROBE_TRAP_NS,
        _ => budget::TRACEPOINT_NS,
    }
}

impl ProbeFamily for OverheadFamily {
    fn name(&self) -> &'static str {
        "overhead"
    }

    fn attach(&mut self, _ebpf: &mut Ebpf, _ctx: &AttachCtx<'_>) -> Result<()> {
        // Costs ~two clock reads per program run; without it only the trap constants count.
        self.stats = aya::sys::enable_stats(aya::sys::Stats::RunTime).ok();
        Ok(())
    }

    fn finish(
        &mut self,
        ebpf: &mut Ebpf,
        _ctx: &mut FinishCtx<'_>,
        data: &mut ReportData,
    ) -> Result<()> {
        let mut programs = Vec::new();
        for (name, prog) in ebpf.programs() {
            let Ok(info) = prog.info() else { continue };
            let hits = info.run_count();
            if hits == 0 {
                continue;
            }
            programs.push(ProgramCost {
                program: name.to_string(),
                hits,
                bpf_ns_per_hit: info.run_time().as_nanos() as f64 / hits as f64,
                trap_ns_per_hit: trap_ns(name, prog),
            });
        }
        let cost = |p: &ProgramCost| p.hits as f64 * (p.bpf_ns_per_hit + p.trap_ns_per_hit);
        programs.sort_by(|a, b| cost(b).total_cmp(&cost(a)));
        let o = data.report.overhead.get_or_insert_with(Overhead::default);
        o.budget = self.budget;
        o.probe_hits = programs.iter().map(|p| p.hits).sum();
        o.probe_cost_ns = programs.iter().map(cost).sum::<f64>() as u64;
        o.programs = programs;
        if self.stats.is_none() {
            data.report.warnings.push(
                "the kernel's BPF run-time statistics could not be enabled: the overhead \
                 estimate counts trap costs only"
                    .into(),
            );
        }
        Ok(())
    }
}

/// After every family has finished: the overhead as a share of the traced threads' alive time.
pub fn complete(report: &mut Report) {
    let traced = traced_cost_ns(report);

    let alive: u64 = report
        .processes
        .iter()
        .flat_map(|p| p.threads.iter())
        .filter_map(|t| t.time.as_ref().map(|t| t.alive_ns))
        .sum();
    let Some(o) = report.overhead.as_mut() else {
        return;
    };
    // Without per-thread times, charge everything to one thread alive for the whole window.
    let denom = if alive > 0 {
        alive
    } else {
        report.window.duration_ns
    };
    o.traced_cost_ns = traced;
    o.estimated = traced as f64 / denom.max(1) as f64;
}

/// Hits of each program that the traced threads caused, from what the report counts for them.
fn traced_cost_ns(r: &Report) -> u64 {
    let Some(o) = &r.overhead else { return 0 };
    let syscalls: u64 = r
        .processes
        .iter()
        .flat_map(|p| p.syscalls.iter())
        .map(|s| s.count)
        .sum();
    let mut cuda: u64 = 0;
    let mut launches_scaled: u64 = 0;
    for c in r.processes.iter().filter_map(|p| p.cuda.as_ref()) {
        for a in &c.api {
            cuda += a.count;
            if FUNCS.iter().any(|f| f.is_launch() && f.name == a.function) {
                launches_scaled += a.count;
            }
        }
    }
    if let Some(s) = &o.sampled {
        // The probes paid for the calls they saw, not for the scaled-up ones.
        cuda = cuda - launches_scaled + s.seen_hits;
    }
    o.programs
        .iter()
        .map(|p| {
            let hits = match p.program.as_str() {
                "sys_enter" | "sys_exit" => syscalls,
                n if n == ENTRY_PROG || n == RET_PROG => cuda,
                "cpu_sample" => r.sampling.samples,
                _ => p.hits,
            }
            .min(p.hits);
            hits as f64 * (p.bpf_ns_per_hit + p.trap_ns_per_hit)
        })
        .sum::<f64>() as u64
}

/// The launch probes' links, switched on and off by the budget's gate: the main thread opens
/// a window at a tick (attaches the links and hands them to the watchdog); the watchdog
/// thread closes it (drops the links) as soon as the bucket is empty, checking every
/// [`WATCH_EVERY`], so a launch storm is cut off within milliseconds, not at the next tick.
pub struct LaunchGate {
    gate: Gate,
    links: Vec<GateLink>,
    last: Option<(Instant, Counts)>,
    cost_per_hit: f64,
    entry_only: bool,
    /// Whether a window is open (links attached) as far as the main thread asked.
    open: bool,
    /// When the window now open was opened, if in the current tick.
    opened_at: Option<Instant>,
    watch: Option<Watch>,
}

const WATCH_EVERY: Duration = Duration::from_millis(2);

struct GateLink {
    prog: &'static str,
    path: PathBuf,
    offset: u64,
    cookie: u64,
}

/// What the main thread and the watchdog share.
#[derive(Default)]
struct Window {
    /// Entry links first: dropped in this order, so a call inside still finds its return probe.
    links: Vec<UProbeLink>,
    ret_links: Vec<UProbeLink>,
    /// Bucket at the window's last tick, the entry program's run count then, and the time.
    tokens_ns: f64,
    base_runs: u64,
    base_at: Option<Instant>,
    cost_per_hit: f64,
    budget: f64,
    /// Set by the watchdog when it closed the window.
    closed_at: Option<Instant>,
    stop: bool,
}

struct Watch {
    shared: Arc<Mutex<Window>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Ok(mut w) = self.shared.lock() {
            w.stop = true;
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[derive(Clone, Copy, Default)]
struct Counts {
    entry_runs: u64,
    entry_ns: u64,
    ret_runs: u64,
    ret_ns: u64,
}

fn counts(ebpf: &Ebpf) -> Counts {
    let read = |name: &str| {
        ebpf.program(name)
            .and_then(|p| p.info().ok())
            .map(|i| (i.run_count(), i.run_time().as_nanos() as u64))
            .unwrap_or((0, 0))
    };
    let (entry_runs, entry_ns) = read(ENTRY_PROG);
    let (ret_runs, ret_ns) = read(RET_PROG);
    Counts {
        entry_runs,
        entry_ns,
        ret_runs,
        ret_ns,
    }
}

/// `run_cnt` of a program through its fd (BPF_OBJ_GET_INFO_BY_FD): the watchdog's cheap read.
fn run_count(fd: &OwnedFd) -> Option<u64> {
    // struct bpf_prog_info up to run_cnt (offset 200, linux/bpf.h); the kernel fills what
    // fits in info_len.
    let mut info = [0u8; 208];
    #[repr(C)]
    struct InfoAttr {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
    }
    let attr = InfoAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: info.len() as u32,
        info: info.as_mut_ptr() as u64,
    };
    const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
    // SAFETY: attr points at a live buffer of info_len bytes for the duration of the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_GET_INFO_BY_FD,
            &attr as *const InfoAttr,
            std::mem::size_of::<InfoAttr>(),
        )
    };
    (r == 0).then(|| u64::from_ne_bytes(info[200..208].try_into().unwrap()))
}

fn watchdog(fd: OwnedFd, shared: Arc<Mutex<Window>>) {
    loop {
        std::thread::sleep(WATCH_EVERY);
        let (links, rets) = {
            let Ok(mut w) = shared.lock() else { return };
            if w.stop {
                return;
            }
            let Some(base_at) = w.base_at else { continue };
            if w.links.is_empty() && w.ret_links.is_empty() {
                continue;
            }
            let Some(runs) = run_count(&fd) else { continue };
            let spent = runs.saturating_sub(w.base_runs) as f64 * w.cost_per_hit;
            let since = base_at.elapsed().as_nanos() as u64;
            if !budget::must_close(w.tokens_ns, w.budget, since, spent) {
                continue;
            }
            (
                std::mem::take(&mut w.links),
                std::mem::take(&mut w.ret_links),
            )
        };
        // Closing a uprobe link takes 100-200 ms here (the kernel waits for a grace period
        // after removing the breakpoint): the entry links close on their own thread, and the
        // return links follow 1 ms later, once the entry breakpoints are gone, instead of
        // after the entry's whole close, during which every call would still pay the return
        // probe.
        let entries = std::thread::spawn(move || drop(links));
        std::thread::sleep(Duration::from_millis(1));
        if let Ok(mut w) = shared.lock() {
            w.closed_at = Some(Instant::now());
        }
        drop(rets);
        let _ = entries.join();
    }
}

impl LaunchGate {
    pub fn new(budget: f64, entry_only: bool) -> LaunchGate {
        LaunchGate {
            gate: Gate::new(budget),
            links: Vec::new(),
            last: None,
            cost_per_hit: budget::UPROBE_TRAP_NS
                + if entry_only {
                    0.0
                } else {
                    budget::URETPROBE_TRAP_NS
                },
            entry_only,
            open: true,
            opened_at: None,
            watch: None,
        }
    }

    /// Whether probes on function `fid` are switched by the gate.
    pub fn gated(&self, fid: usize) -> bool {
        self.gate.samples() && FUNCS.get(fid).is_some_and(|f| f.is_launch())
    }

    fn start_watch(&mut self, ebpf: &Ebpf) -> Option<&Arc<Mutex<Window>>> {
        if self.watch.is_none() {
            let fd = ebpf
                .program(ENTRY_PROG)?
                .fd()
                .ok()?
                .as_fd()
                .try_clone_to_owned()
                .ok()?;
            let shared = Arc::new(Mutex::new(Window {
                tokens_ns: self.gate.tokens_ns(),
                base_runs: counts(ebpf).entry_runs,
                base_at: Some(Instant::now()),
                cost_per_hit: self.cost_per_hit,
                budget: self.gate.budget(),
                ..Window::default()
            }));
            let s = shared.clone();
            let thread = std::thread::Builder::new()
                .name("gputrace-budget".into())
                .spawn(move || watchdog(fd, s))
                .ok()?;
            self.watch = Some(Watch {
                shared,
                thread: Some(thread),
            });
        }
        self.watch.as_ref().map(|w| &w.shared)
    }

    /// Records a launch probe just attached and hands its link to the watchdog (or drops it
    /// at once while the gate is closed).
    pub fn add(
        &mut self,
        ebpf: &mut Ebpf,
        prog: &'static str,
        path: PathBuf,
        offset: u64,
        cookie: u64,
        id: UProbeLinkId,
    ) {
        self.links.push(GateLink {
            prog,
            path,
            offset,
            cookie,
        });
        let Some(link) = ebpf
            .program_mut(prog)
            .and_then(|p| <&mut UProbe>::try_from(p).ok())
            .and_then(|p| p.take_link(id).ok())
        else {
            return;
        };
        if !self.open {
            return;
        }
        if let Some(shared) = self.start_watch(ebpf) {
            if let Ok(mut w) = shared.lock() {
                if w.closed_at.is_none() {
                    if prog == RET_PROG {
                        w.ret_links.push(link);
                    } else {
                        w.links.push(link);
                    }
                }
            }
        }
    }

    /// One tick: observe, decide, open a window if the bucket allows.
    pub fn tick(&mut self, ebpf: &mut Ebpf) {
        if !self.gate.samples() || self.links.is_empty() {
            return;
        }
        let now = Instant::now();
        let c = counts(ebpf);
        let Some((t0, c0)) = self.last.replace((now, c)) else {
            return;
        };
        let hits = c.entry_runs.saturating_sub(c0.entry_runs);
        let ret_hits = c.ret_runs.saturating_sub(c0.ret_runs);
        // Per program over the whole trace: run times per hit are steady.
        let entry = budget::cost_per_hit(c.entry_ns, c.entry_runs, budget::UPROBE_TRAP_NS);
        let ret = if self.entry_only {
            0.0
        } else {
            budget::cost_per_hit(c.ret_ns, c.ret_runs, budget::URETPROBE_TRAP_NS)
        };
        self.cost_per_hit = entry + ret;
        // The return probe also fires alone while the links are attached or detached (each
        // takes ms): calls that pay for it without being counted.
        let transition_ns = if self.entry_only {
            0.0
        } else {
            ret_hits.saturating_sub(hits) as f64 * ret
        };
        let dt = now.duration_since(t0);
        let closed_at = self
            .watch
            .as_ref()
            .and_then(|w| w.shared.lock().ok().and_then(|mut w| w.closed_at.take()));
        let on = if !self.open {
            Duration::ZERO
        } else {
            let from = self.opened_at.unwrap_or(t0).max(t0);
            closed_at.unwrap_or(now).saturating_duration_since(from)
        };
        if closed_at.is_some() {
            self.open = false;
        }
        let was_open = self.open || closed_at.is_some();
        let open = self.gate.tick(TickObs {
            dt_ns: dt.as_nanos() as u64,
            on_ns: if was_open { on.as_nanos() as u64 } else { 0 },
            sampled_hits: if was_open { hits } else { 0 },
            cost_per_hit_ns: self.cost_per_hit,
            other_cost_ns: transition_ns
                + if was_open {
                    0.0
                } else {
                    hits as f64 * self.cost_per_hit
                },
        });
        self.opened_at = None;
        if open && !self.open {
            self.reopen(ebpf, c.entry_runs);
        } else if self.open {
            // Still open: the watchdog measures from this tick with the bucket as it is now.
            if let Some(w) = &self.watch {
                if let Ok(mut w) = w.shared.lock() {
                    w.tokens_ns = self.gate.tokens_ns();
                    w.base_runs = c.entry_runs;
                    w.base_at = Some(now);
                    w.cost_per_hit = self.cost_per_hit;
                }
            }
        }
    }

    fn reopen(&mut self, ebpf: &mut Ebpf, runs: u64) {
        let mut entries = Vec::new();
        let mut rets = Vec::new();
        // Return probes first, as at the first attach: a call entered in between would
        // otherwise raise its thread's depth with no return to lower it.
        for prog in [RET_PROG, ENTRY_PROG] {
            for l in self.links.iter().filter(|l| l.prog == prog) {
                if let Some(link) = attach(ebpf, l) {
                    if prog == RET_PROG {
                        rets.push(link);
                    } else {
                        entries.push(link);
                    }
                }
            }
        }
        // The window starts once the entry probes are attached (the return probes, attached
        // first, fired alone meanwhile: transition cost).
        self.opened_at = Some(Instant::now());
        let tokens = self.gate.tokens_ns();
        let cost = self.cost_per_hit;
        if let Some(shared) = self.start_watch(ebpf) {
            if let Ok(mut w) = shared.lock() {
                w.links = entries;
                w.ret_links = rets;
                w.tokens_ns = tokens;
                w.base_runs = runs;
                w.base_at = Some(Instant::now());
                w.cost_per_hit = cost;
                w.closed_at = None;
            }
        }
        self.open = true;
    }

    /// Last partial tick, then the scaled counts and the sampling note in the report.
    pub fn finish(&mut self, ebpf: &mut Ebpf, data: &mut ReportData) {
        self.tick(ebpf);
        self.watch = None;
        let worst = worst_cuda_thread(&data.report, self.cost_per_hit);
        data.report
            .overhead
            .get_or_insert_with(Overhead::default)
            .worst_thread = worst;
        let e = self.gate.estimate();
        if e.scale == 1.0 || e.windows == 0 {
            return;
        }
        let launch_names: Vec<&str> = FUNCS
            .iter()
            .filter(|f| f.is_launch())
            .map(|f| f.name)
            .collect();
        let mut seen = 0u64;
        for p in data.report.processes.iter_mut() {
            let Some(c) = p.cuda.as_mut() else { continue };
            for a in c.api.iter_mut() {
                if launch_names.contains(&a.function.as_str()) {
                    seen += a.count;
                }
            }
            scale_cuda(c, &launch_names, e.scale);
            if let Some(t) = p.time.as_mut() {
                scale_launch_time(t, e.scale);
            }
            for t in p.threads.iter_mut() {
                if let Some(t) = t.time.as_mut() {
                    scale_launch_time(t, e.scale);
                }
            }
        }
        let o = data.report.overhead.get_or_insert_with(Overhead::default);
        o.sampled = Some(ProbeSampling {
            probes: "CUDA launch probes".into(),
            scaled: "launch call counts, their times, kernel launch counts, and the time \
                     breakdown's cuda_launch time (moved from cpu: off the windows, launches \
                     run on CPU unseen)"
                .into(),
            duty: e.duty,
            scale: e.scale,
            rel_error: e.rel_error,
            windows: e.windows as u64,
            seen_hits: seen,
        });
    }
}

fn attach(ebpf: &mut Ebpf, l: &GateLink) -> Option<UProbeLink> {
    let p = ebpf
        .program_mut(l.prog)
        .and_then(|p| <&mut UProbe>::try_from(p).ok())?;
    let id = p
        .attach(
            UProbeAttachPoint {
                location: UProbeAttachLocation::AbsoluteOffset(l.offset),
                cookie: Some(l.cookie),
            },
            &l.path,
            UProbeScope::AllProcesses,
        )
        .ok()?;
    p.take_link(id).ok()
}

fn scale(v: u64, by: f64) -> u64 {
    (v as f64 * by).round() as u64
}

fn scale_api(a: &mut crate::report::model::cuda::ApiStat, by: f64) {
    a.count = scale(a.count, by);
    a.total_ns = scale(a.total_ns, by);
    for h in a.hist_log2_ns.iter_mut() {
        *h = scale(*h, by);
    }
    for e in a.errors.iter_mut() {
        e.count = scale(e.count, by);
    }
}

fn scale_cuda(c: &mut crate::report::model::cuda::ProcessCuda, launches: &[&str], by: f64) {
    for a in c.api.iter_mut() {
        if launches.contains(&a.function.as_str()) {
            scale_api(a, by);
        }
    }
    for t in c.threads.iter_mut() {
        for a in t.api.iter_mut() {
            if launches.contains(&a.function.as_str()) {
                let before = a.total_ns;
                scale_api(a, by);
                t.total_ns = (t.total_ns + a.total_ns).saturating_sub(before);
            }
        }
    }
    for k in c.kernels.iter_mut() {
        k.launches = scale(k.launches, by);
    }
}

/// Off the windows a launch's time is counted as plain on-CPU time: move the estimated part
/// from `cpu` to `cuda_launch` (never more than `cpu` holds), keeping the sum.
fn scale_launch_time(t: &mut crate::report::model::time::TimeBreakdown, by: f64) {
    let get = |t: &crate::report::model::time::TimeBreakdown, c: &str| {
        t.categories
            .iter()
            .find(|x| x.category == c)
            .map_or(0, |x| x.ns)
    };
    let (launch, cpu) = (get(t, "cuda_launch"), get(t, "cpu"));
    let moved = ((launch as f64 * (by - 1.0)).max(0.0) as u64).min(cpu);
    if moved == 0 {
        return;
    }
    for c in t.categories.iter_mut() {
        if c.category == "cpu" {
            c.ns -= moved;
        } else if c.category == "cuda_launch" {
            c.ns += moved;
        }
    }
    let alive = t.alive_ns.max(1) as f64;
    for c in t.categories.iter_mut() {
        c.percent = 100.0 * c.ns as f64 / alive;
    }
    t.categories.retain(|c| c.ns > 0);
    t.categories.sort_by_key(|c| std::cmp::Reverse(c.ns));
}

/// The thread whose CUDA calls cost it the largest share of its time (calls seen, unscaled:
/// the cost was paid only in the probed windows).
fn worst_cuda_thread(r: &Report, cost_per_hit: f64) -> Option<ThreadOverhead> {
    let mut best: Option<ThreadOverhead> = None;
    for p in &r.processes {
        let Some(c) = &p.cuda else { continue };
        let alive: HashMap<u32, u64> = p
            .threads
            .iter()
            .filter_map(|t| t.time.as_ref().map(|tb| (t.tid, tb.alive_ns)))
            .collect();
        for t in &c.threads {
            let Some(&a) = alive.get(&t.tid).filter(|a| **a > 0) else {
                continue;
            };
            let calls: u64 = t.api.iter().map(|s| s.count).sum();
            let share = calls as f64 * cost_per_hit / a as f64;
            if best.as_ref().is_none_or(|b| share > b.estimated) {
                best = Some(ThreadOverhead {
                    pid: p.pid,
                    tid: t.tid,
                    estimated: share,
                });
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::model::cuda::{ApiStat, KernelStat, ProcessCuda, ThreadCuda};

    #[test]
    fn launch_time_moves_from_cpu() {
        use crate::report::model::time::{CategoryTime, TimeBreakdown};
        let cat = |c: &str, ns| CategoryTime {
            category: c.into(),
            ns,
            percent: 0.0,
        };
        let mut t = TimeBreakdown {
            alive_ns: 1000,
            accounted_ns: 1000,
            categories: vec![cat("cpu", 900), cat("cuda_launch", 20), cat("sleep", 80)],
            ..Default::default()
        };
        scale_launch_time(&mut t, 11.0);
        assert_eq!(t.categories[0].category, "cpu");
        assert_eq!(t.categories[0].ns, 700);
        assert_eq!(t.categories[1].ns, 220);
        assert_eq!(t.categories.iter().map(|c| c.ns).sum::<u64>(), 1000);
        assert!((t.categories[1].percent - 22.0).abs() < 1e-9);
        // Never more than cpu holds.
        scale_launch_time(&mut t, 100.0);
        assert_eq!(t.categories[0].category, "cuda_launch");
        assert_eq!(t.categories[0].ns, 920);
        assert!(t.categories.iter().all(|c| c.category != "cpu"));
    }

    #[test]
    fn only_launches_are_scaled() {
        let api = |f: &str, n| ApiStat {
            function: f.into(),
            count: n,
            total_ns: n * 10,
            hist_log2_ns: vec![n],
            ..Default::default()
        };
        let mut c = ProcessCuda {
            api: vec![api("cudaLaunchKernel", 10), api("cudaMemcpy", 7)],
            kernels: vec![KernelStat {
                name: "k".into(),
                launches: 10,
                ..Default::default()
            }],
            threads: vec![ThreadCuda {
                tid: 1,
                total_ns: 170,
                api: vec![api("cudaLaunchKernel", 10), api("cudaMemcpy", 7)],
            }],
            ..Default::default()
        };
        let launches: Vec<&str> = FUNCS
            .iter()
            .filter(|f| f.is_launch())
            .map(|f| f.name)
            .collect();
        scale_cuda(&mut c, &launches, 2.5);
        assert_eq!(c.api[0].count, 25);
        assert_eq!(c.api[0].total_ns, 250);
        assert_eq!(c.api[0].hist_log2_ns, vec![25]);
        assert_eq!(c.api[1].count, 7);
        assert_eq!(c.kernels[0].launches, 25);
        assert_eq!(c.threads[0].total_ns, 320);
        assert_eq!(c.threads[0].api[1].count, 7);
    }
}
