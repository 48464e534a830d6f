//! gputrace's own cost while tracing (issue 6): the programs' run time from the kernel's BPF
//! statistics plus calibrated trap costs (`budget`), shown in every report; and the gate that
//! switches the CUDA launch probes on and off to stay under `--max-overhead`.
//!
//! The gate detaches and re-attaches the launch probes' links: an attached uprobe or uretprobe
//! costs its trap on every call even when the program returns at once, so a BPF-side flag would
//! not save the cost that matters.

use std::{collections::HashMap, os::fd::OwnedFd, path::PathBuf, time::Instant};

use anyhow::Result;
use aya::{
    programs::{
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLinkId, UProbeScope},
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

/// The launch probes' links, switched on and off by the budget's gate.
pub struct LaunchGate {
    gate: Gate,
    links: Vec<GateLink>,
    last: Option<(Instant, Counts)>,
    /// The gate's clock starts at the first CUDA hit: idle time before the job's first call
    /// would otherwise count as a zero-rate window.
    started: bool,
    cost_per_hit: f64,
    entry_only: bool,
}

struct GateLink {
    prog: &'static str,
    path: PathBuf,
    offset: u64,
    cookie: u64,
    id: Option<UProbeLinkId>,
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

impl LaunchGate {
    pub fn new(budget: f64, entry_only: bool) -> LaunchGate {
        LaunchGate {
            gate: Gate::new(budget),
            links: Vec::new(),
            last: None,
            started: false,
            cost_per_hit: budget::UPROBE_TRAP_NS
                + if entry_only {
                    0.0
                } else {
                    budget::URETPROBE_TRAP_NS
                },
            entry_only,
        }
    }

    /// Whether probes on function `fid` are switched by the gate.
    pub fn gated(&self, fid: usize) -> bool {
        self.gate.samples() && FUNCS.get(fid).is_some_and(|f| f.is_launch())
    }

    /// Records a launch probe just attached; detaches it at once while the gate is off.
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
            id: Some(id),
        });
        if !self.gate.is_on() {
            let i = self.links.len() - 1;
            detach(ebpf, &mut self.links[i]);
        }
    }

    /// One tick: observe, decide, switch.
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
        if c.entry_runs > 0 {
            // Per program over the whole trace (run times per hit are steady)...
            let entry = budget::cost_per_hit(c.entry_ns, c.entry_runs, budget::UPROBE_TRAP_NS);
            let ret = if self.entry_only || c.ret_runs == 0 {
                0.0
            } else {
                budget::cost_per_hit(c.ret_ns, c.ret_runs, budget::URETPROBE_TRAP_NS)
            };
            // ...but hits per tick: the return probe also fires alone while the links are
            // being attached or detached (each takes tens of ms), and those calls pay for it.
            self.cost_per_hit = if hits > 0 {
                entry + ret * ret_hits as f64 / hits as f64
            } else {
                entry + ret
            };
        }
        if !self.started {
            if hits == 0 {
                return;
            }
            self.started = true;
        }
        let was_on = self.gate.is_on();
        let on = self.gate.tick(TickObs {
            dt_ns: now.duration_since(t0).as_nanos() as u64,
            sampled_hits: if was_on { hits } else { 0 },
            cost_per_hit_ns: self.cost_per_hit,
            other_cost_ns: if was_on {
                0.0
            } else {
                hits as f64 * self.cost_per_hit
            },
        });
        if on != was_on {
            self.switch(ebpf, on);
        }
    }

    fn switch(&mut self, ebpf: &mut Ebpf, on: bool) {
        if on {
            // Return probes first, as at the first attach: a call entered in between would
            // otherwise raise its thread's depth with no return to lower it.
            for prog in [RET_PROG, ENTRY_PROG] {
                for l in self.links.iter_mut().filter(|l| l.prog == prog) {
                    attach(ebpf, l);
                }
            }
        } else {
            // Entry probes first: a call already inside still finds its return probe.
            for prog in [ENTRY_PROG, RET_PROG] {
                for l in self.links.iter_mut().filter(|l| l.prog == prog) {
                    detach(ebpf, l);
                }
            }
        }
    }

    /// Last partial tick, then the scaled counts and the sampling note in the report.
    pub fn finish(&mut self, ebpf: &mut Ebpf, data: &mut ReportData) {
        self.tick(ebpf);
        let worst = worst_cuda_thread(&data.report, self.cost_per_hit);
        data.report
            .overhead
            .get_or_insert_with(Overhead::default)
            .worst_thread = worst;
        let e = self.gate.estimate();
        if !self.started || e.scale == 1.0 {
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
        }
        let o = data.report.overhead.get_or_insert_with(Overhead::default);
        o.sampled = Some(ProbeSampling {
            probes: "CUDA launch probes".into(),
            scaled: "launch call counts, their times and kernel launch counts (the time \
                     breakdown's CUDA-launch time covers the probed windows only)"
                .into(),
            duty: e.duty,
            scale: e.scale,
            rel_error: e.rel_error,
            windows: e.windows as u64,
            seen_hits: seen,
        });
    }
}

fn attach(ebpf: &mut Ebpf, l: &mut GateLink) {
    if l.id.is_some() {
        return;
    }
    let Some(p) = ebpf
        .program_mut(l.prog)
        .and_then(|p| <&mut UProbe>::try_from(p).ok())
    else {
        return;
    };
    l.id = p
        .attach(
            UProbeAttachPoint {
                location: UProbeAttachLocation::AbsoluteOffset(l.offset),
                cookie: Some(l.cookie),
            },
            &l.path,
            UProbeScope::AllProcesses,
        )
        .ok();
}

fn detach(ebpf: &mut Ebpf, l: &mut GateLink) {
    let Some(id) = l.id.take() else { return };
    if let Some(p) = ebpf
        .program_mut(l.prog)
        .and_then(|p| <&mut UProbe>::try_from(p).ok())
    {
        let _ = p.detach(id);
    }
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
                t.total_ns += a.total_ns - before;
            }
        }
    }
    for k in c.kernels.iter_mut() {
        k.launches = scale(k.launches, by);
    }
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
