//! gputrace's own cost while tracing (issue 6): the programs' run time from the kernel's BPF
//! statistics plus calibrated trap costs (`budget`), shown in every report; and the gates that
//! switch the CUDA launch probes (`gate`), and the copy and sync probes once their own cost
//! passes the budget (`calls`), on and off to stay under `--max-overhead`.
//!
//! The gates detach and re-attach the probes' links: an attached uprobe or uretprobe
//! costs its trap on every call even when the program returns at once, so a BPF-side flag would
//! not save the cost that matters.

mod calibrate;
mod calls;
mod gate;
pub mod own;
mod paths;
mod stats;
pub mod syscall_trap;
mod threads;

use std::collections::HashMap;

pub use calibrate::{Calibrator, SharedTrapCost, TrapCost};
pub use calls::{call_names, is_call, CallGate};
pub use gate::LaunchGate;
pub use stats::{stats_on, Hits, StatsOn};
pub use syscall_trap::SharedSyscallTrap;

use anyhow::Result;
use aya::{programs::Program, Ebpf};
use tracer_common::{
    cuda::{ENTRY_PROG, RET_PROG},
    hits::{splits, Paths, Prog, PROGRAMS},
    overhead::{CALIB_ENTRY_PROG, CALIB_RET_PROG},
};

use crate::{
    budget,
    probes::{AttachCtx, FinishCtx, ProbeFamily},
    report::{
        model::overhead::{Overhead, ProgramCost, SamplerCheck, ThreadOverhead},
        model::Report,
        ReportData,
    },
};

/// Turns the kernel's BPF run-time statistics on now and then (`stats`) and reads every
/// program's cost at the end (before any family unloads its programs: this family finishes
/// first).
pub struct OverheadFamily {
    budget: f64,
    /// Held while the statistics are to be on.
    stats: Option<StatsOn>,
    /// Whether they could be turned on at all.
    stats_ok: bool,
    ticks: u64,
    hits: Option<Hits>,
    uprobes: Option<crate::uprobes::Uprobes>,
    trap: SharedTrapCost,
    /// Measured by the accounting family as it attaches the syscall programs.
    sys_trap: SharedSyscallTrap,
    /// Each program's counts when the window started.
    base: HashMap<String, Runs>,
    /// And when it ended (`window_ended`): the accounting unloads its programs then, and the
    /// hits after it are not the window's.
    at_end: Option<Vec<Runs>>,
}

/// A program's hits (its own count) and what the kernel timed of them.
#[derive(Debug, Clone, Default, PartialEq)]
struct Runs {
    name: String,
    uprobe: bool,
    hits: u64,
    timed: u64,
    ns: u64,
    /// None when `PROG_PATHS` could not be read: every hit is then priced at the mean.
    paths: Option<Paths>,
}

impl Runs {
    /// What ran since `base`.
    fn since(&self, base: Option<&Runs>) -> Runs {
        let Some(b) = base else {
            return self.clone();
        };
        Runs {
            hits: self.hits.saturating_sub(b.hits),
            timed: self.timed.saturating_sub(b.timed),
            ns: self.ns.saturating_sub(b.ns),
            paths: match (&self.paths, &b.paths) {
                (Some(p), Some(b)) => Some(p.since(b)),
                (p, _) => *p,
            },
            ..self.clone()
        }
    }
}

impl OverheadFamily {
    pub fn new(budget: f64, trap: SharedTrapCost, sys_trap: SharedSyscallTrap) -> OverheadFamily {
        OverheadFamily {
            budget,
            stats: None,
            stats_ok: false,
            ticks: 0,
            hits: None,
            uprobes: None,
            trap,
            sys_trap,
            base: HashMap::new(),
            at_end: None,
        }
    }

    /// Every program's counts so far: those aya loaded, and the uprobe programs loaded for
    /// uprobe_multi links.
    fn runs<'a>(&'a self, ebpf: &'a Ebpf) -> impl Iterator<Item = Runs> + 'a {
        let own = self
            .uprobes
            .as_ref()
            .map(|u| u.own_programs())
            .unwrap_or_default()
            .into_iter()
            .map(|(name, _, n, t)| (name, true, n, t));
        ebpf.programs()
            .filter_map(|(name, prog)| {
                let info = prog.info().ok()?;
                let uprobe = matches!(prog, Program::UProbe(_));
                Some((
                    name,
                    uprobe,
                    info.run_count(),
                    info.run_time().as_nanos() as u64,
                ))
            })
            .chain(own)
            .map(move |(name, uprobe, timed, ns)| Runs {
                name: name.to_string(),
                uprobe,
                // Its own count (the kernel counts only while its statistics are on).
                hits: self.hits.as_ref().map_or(timed, |h| h.get(name)),
                timed,
                ns,
                paths: self.hits.as_ref().and_then(|h| h.paths(name)),
            })
    }
}

/// Trap cost outside the program for one hit of `name` with the kernel's statistics off (what
/// they cost outside the run is charged on its own: `calibrate::StatsCost`); `sys_ns` that of
/// a syscall tracepoint hit.
fn trap_ns(name: &str, uprobe: bool, trap: TrapCost, sys_ns: f64) -> f64 {
    match uprobe {
        true if name == RET_PROG => trap.stats.trap_off_ns(trap.ret_ns),
        true => trap.stats.trap_off_ns(trap.entry_ns),
        false if is_syscall_tracepoint(name) => sys_ns,
        false => budget::TRACEPOINT_NS,
    }
}

fn is_syscall_tracepoint(name: &str) -> bool {
    [Prog::SysEnter, Prog::SysEnterBtf, Prog::SysExit]
        .iter()
        .any(|p| PROGRAMS[*p as usize] == name)
}

impl ProbeFamily for OverheadFamily {
    fn name(&self) -> &'static str {
        "overhead"
    }

    fn attach(&mut self, ebpf: &mut Ebpf, ctx: &AttachCtx<'_>) -> Result<()> {
        // Without it the programs never time their paths and every mean stays whole.
        let _ = stats::register_paths_timing(ebpf);
        // Without them only the trap constants count. Not held on from here: the accounting
        // family times syscalls with them off as it attaches (`syscall_trap`), and the first
        // tick turns them on for the programs that have run.
        self.stats_ok = stats_on().is_on();
        self.hits = Hits::open(ebpf).ok();
        self.uprobes = Some(ctx.uprobes.clone());
        Ok(())
    }

    fn attached(&mut self, ebpf: &mut Ebpf, _opened_ns: u64) -> Result<()> {
        // What ran before the window (gputrace's own measurement calls, the families'
        // attaching) is not the trace's: counted from here.
        self.base = self.runs(ebpf).map(|r| (r.name.clone(), r)).collect();
        // Timed from the window's start (the attach left them off for the syscall
        // measurement): a trace that ends within the first tick has its programs timed too.
        if self.stats_ok {
            self.stats = Some(stats_on());
        }
        Ok(())
    }

    fn tick(&mut self, ebpf: &mut Ebpf, _tracker: &crate::tracker::Tracker) -> Result<()> {
        self.ticks += 1;
        let runs = PROGRAMS.iter().map(|name| {
            // A program given up for another version of its set (unloaded at the attach)
            // runs no more, and the hits it had can never be timed: they must not keep the
            // statistics on.
            if ebpf.program(name).is_none_or(|p| p.fd().is_err()) {
                return (0, 0);
            }
            let hits = self.hits.as_ref().map_or(0, |h| h.get(name));
            // Only programs that ran need a look at the kernel's count.
            let timed = match &self.uprobes {
                Some(u) if hits > 0 => u.runs(ebpf, name).0,
                _ => 0,
            };
            (hits, timed)
        });
        if !stats::sampled_tick(self.ticks, runs) {
            self.stats = None;
        } else if self.stats.is_none() {
            self.stats = Some(stats_on());
        }
        Ok(())
    }

    fn window_ended(&mut self, ebpf: &mut Ebpf, _: &crate::tracker::Tracker) -> Result<()> {
        // The window's counts, just after the accounting stopped its programs: their runs
        // while the report is built (early returns, the calls no longer counted) are not the
        // window's.
        self.at_end = Some(self.runs(ebpf).collect());
        Ok(())
    }

    fn finish(
        &mut self,
        ebpf: &mut Ebpf,
        _ctx: &mut FinishCtx<'_>,
        data: &mut ReportData,
    ) -> Result<()> {
        let trap = calibrate::current(&self.trap);
        let (sys_ns, sys_measured) = syscall_trap::current(&self.sys_trap);
        let sys_ns = syscall_trap::bounded(sys_ns, trap.stats.inside_ns);
        let mut programs = Vec::new();
        let runs = match self.at_end.take() {
            Some(r) => r,
            None => self.runs(ebpf).collect(),
        };
        for all in runs {
            // gputrace's own calls, made before the trace started.
            if all.name == CALIB_ENTRY_PROG || all.name == CALIB_RET_PROG {
                continue;
            }
            let w = all.since(self.base.get(&all.name));
            if w.hits == 0 {
                continue;
            }
            // Timed by the kernel's runs in the window; a program none of whose runs there
            // were timed goes by those before it.
            let timed = if w.timed > 0 { &w } else { &all };
            let mean = timed.ns as f64 / timed.timed.max(1) as f64;
            // Counted, and split by the same runs the mean is of.
            let split = splits(&w.name);
            let mean = match timed.paths.filter(|_| split) {
                Some(p) => paths::without_stalls(mean, &p),
                None => mean,
            };
            let counted = w.paths.filter(|_| split);
            let by_path = timed
                .paths
                .filter(|_| split)
                .and_then(|p| paths::split(mean, &p));
            programs.push(ProgramCost {
                program: w.name.clone(),
                hits: w.hits,
                timed: w.timed,
                bpf_ns_per_hit: mean,
                trap_ns_per_hit: trap_ns(&w.name, w.uprobe, trap, sys_ns),
                stats_ns_per_hit: trap.stats.per_hit_ns(w.timed, w.hits),
                traced_hits: counted.map(|p| p.traced),
                traced_bpf_ns_per_hit: by_path.map(|s| s.traced),
                early_bpf_ns_per_hit: by_path.map(|s| s.early),
            });
        }
        self.stats = None;
        let cost = |p: &ProgramCost| p.cost_ns();
        programs.sort_by(|a, b| cost(b).total_cmp(&cost(a)));
        let o = data.report.overhead.get_or_insert_with(Overhead::default);
        o.budget = self.budget;
        o.probe_hits = programs.iter().map(|p| p.hits).sum();
        o.probe_cost_ns = programs.iter().map(cost).sum::<f64>() as u64;
        o.programs = programs;
        o.trap_measured = trap.measured;
        o.syscall_trap_measured = sys_measured;
        o.stats_inside_ns = trap.stats.inside_ns;
        o.stats_outside_ns = trap.stats.outside_ns;
        if let Some(e) = syscall_trap::error(&self.sys_trap) {
            data.report.warnings.push(format!(
                "the syscall tracepoints' cost outside their programs could not be measured on \
                 this machine ({e}): the overhead estimate uses a built-in constant"
            ));
        }
        if let Some(e) = calibrate::calibration_error(&self.trap) {
            data.report.warnings.push(format!(
                "the uprobe trap cost could not be measured on this machine ({e}): the overhead \
                 estimate uses built-in constants"
            ));
        }
        if !self.stats_ok {
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
    let (traced, visible) = traced_cost_ns(report);

    let listed: u64 = report
        .processes
        .iter()
        .flat_map(|p| p.threads.iter())
        .filter_map(|t| t.time.as_ref().map(|t| t.alive_ns))
        .sum();
    let Some(o) = report.overhead.as_mut() else {
        return;
    };
    // The cost counts every traced thread's syscalls: so does the time it is a share of.
    let alive = o.traced_alive_ns.unwrap_or(0).max(listed);
    // Without per-thread times, charge everything to one thread alive for the whole window.
    let denom = if alive > 0 {
        alive
    } else {
        report.window.duration_ns
    };
    o.traced_cost_ns = traced;
    o.estimated = traced as f64 / denom.max(1) as f64;
    let costliest = threads::costliest_thread(report, MIN_ALIVE_NS);
    let short = threads::short_lived(report, MIN_ALIVE_NS);
    let Some(o) = report.overhead.as_mut() else {
        return;
    };
    o.costliest_thread = costliest;
    o.short_lived = short;
    o.seen_by_sampler = SamplerCheck::new(
        report.sampling.samples,
        report.sampling.in_probes,
        report.sampling.frequency_hz,
        visible,
    );
    if let Some(l) = o.over_budget_line() {
        report.warnings.push(l);
    }
    if let Some(l) = o.short_lived_line() {
        report.warnings.push(l);
    }
    if let Some(l) = o.own_line() {
        report.warnings.push(l);
    }
    if let Some(l) = o.sampler_line() {
        report.warnings.push(l);
    }
}

/// Threads alive for less than this are not candidates for the costliest thread: one sample
/// in a millisecond's life is not a share worth a warning.
const MIN_ALIVE_NS: u64 = 100_000_000;

/// Hits of each program that the traced threads caused, from what the report counts for them
/// (the programs that split their paths count them), at what a traced hit costs: all of it,
/// and the part the CPU sampler can catch (what its share measures), from one pass over the
/// report's processes.
fn traced_cost_ns(r: &Report) -> (u64, u64) {
    let (mut all, mut seen) = (0.0, 0.0);
    for (program, ns) in traced_costs(r) {
        all += ns;
        if !unseen_by_sampler(program) {
            seen += ns;
        }
    }
    (all as u64, seen as u64)
}

/// Programs whose time the CPU sampler never catches on a traced thread: its own (it runs in
/// the interrupt that takes the sample), the scheduler's (run with interrupts off: their time
/// lands in the next task) and a request's completion (in an interrupt).
fn unseen_by_sampler(program: &str) -> bool {
    program == "cpu_sample"
        || ["sched_switch", "sched_wakeup", "block_rq_complete"]
            .iter()
            .any(|p| program.starts_with(p))
}

/// Each program's cost to the traced threads (ns), by name.
fn traced_costs(r: &Report) -> Vec<(&str, f64)> {
    let Some(o) = &r.overhead else {
        return Vec::new();
    };
    let syscalls: u64 = r
        .processes
        .iter()
        .flat_map(|p| p.syscalls.iter())
        .map(|s| s.count)
        .sum();
    // From the report's CUDA tables, which hold the processes the tracker remembers: under
    // a churn of CUDA processes past its cap, the forgotten ones' calls are not priced while
    // their lives are in `traced_alive_ns`, and the CUDA part reads low.
    let mut cuda: u64 = 0;
    let mut launches_scaled: u64 = 0;
    for c in r.processes.iter().filter_map(|p| p.cuda.as_ref()) {
        for a in &c.api {
            cuda += a.count;
            if crate::cuda::table::by_name(&a.function).is_some_and(|f| f.is_launch()) {
                launches_scaled += a.count;
            }
        }
    }
    if let Some(s) = &o.sampled {
        // The probes paid for the calls they saw, not for the scaled-up ones.
        cuda = cuda - launches_scaled + s.seen_hits;
    }
    if let Some(s) = &o.sampled_calls {
        let names = call_names();
        let calls_scaled: u64 = r
            .processes
            .iter()
            .filter_map(|p| p.cuda.as_ref())
            .flat_map(|c| c.api.iter())
            .filter(|a| names.contains(&a.function.as_str()))
            .map(|a| a.count)
            .sum();
        cuda = cuda.saturating_sub(calls_scaled) + s.seen_hits;
    }
    o.programs
        .iter()
        .map(|p| {
            let hits = match p.program.as_str() {
                // Every traced call: under process churn the report keeps the rows of the
                // first few thousand short processes only (`accounting::retire`), and a
                // minute of a shell loop was priced at half what the CPU sampler caught.
                "sys_enter" | "sys_enter_btf" | "sys_exit" => p.traced_hits.unwrap_or(syscalls),
                n if n == ENTRY_PROG || n == RET_PROG => cuda,
                "cpu_sample" => r.sampling.samples,
                _ => p.traced_hits(),
            }
            .min(p.hits);
            (p.program.as_str(), hits as f64 * p.traced_ns_per_hit())
        })
        .collect()
}

fn scale(v: u64, by: f64) -> u64 {
    (v as f64 * by).round() as u64
}

/// The launches filled in between windows ran with no probe: each took the mean the windows
/// saw less what the probes added inside it (`probe_ns`: the return's trap and program, as
/// measured). Scaled at the probed mean, the launch demo's 6.0 us launches (~5.2 us of their
/// own, untraced) put its trainer in launches for 111% of its life.
fn unseen_ns(total_ns: u64, seen: u64, scaled: u64, probe_ns: f64) -> u64 {
    let mean = total_ns as f64 / seen.max(1) as f64;
    (scaled.saturating_sub(seen) as f64 * (mean - probe_ns).max(0.0)).round() as u64
}

fn scale_api(a: &mut crate::report::model::cuda::ApiStat, by: f64, probe_ns: f64) {
    let seen = a.count;
    a.count = scale(a.count, by);
    a.total_ns += unseen_ns(a.total_ns, seen, a.count, probe_ns);
    for h in a.hist_log2_ns.iter_mut() {
        *h = scale(*h, by);
    }
    // Rounded bucket by bucket, the histogram may miss its count by a few: the largest
    // bucket takes the difference.
    let sum: u64 = a.hist_log2_ns.iter().sum();
    if let Some(big) = a.hist_log2_ns.iter_mut().max_by_key(|h| **h) {
        *big = (*big + a.count).saturating_sub(sum);
    }
    for e in a.errors.iter_mut() {
        e.count = scale(e.count, by);
    }
}

/// Scales the launch functions' counts by `by`, and their times by what the launches filled
/// in took without probes (`probe_ns` less than each seen one, [`unseen_ns`]).
pub(crate) fn scale_cuda(
    c: &mut crate::report::model::cuda::ProcessCuda,
    launches: &[&str],
    by: f64,
    probe_ns: f64,
) {
    scale_rows(c, launches, by, probe_ns);
    for k in c.kernels.iter_mut() {
        let seen = k.launches;
        k.launches = scale(k.launches, by);
        k.launch_ns += unseen_ns(k.launch_ns, seen, k.launches, probe_ns);
    }
}

/// Scales the copy and sync functions' counts by `by`, their times as [`scale_cuda`] does, and
/// the copies by direction (count, bytes and time: their rate stays the windows'). The probes'
/// part of a seen call is taken as at least the shortest call seen: a storm's copies take a few
/// ns of their own, a seen one ~700 ns (above the return probe's measured cost, which left
/// ~120 ns of probe in each call filled in: a quarter of a copy storm's time in copies).
pub(crate) fn scale_calls(
    c: &mut crate::report::model::cuda::ProcessCuda,
    calls: &[&str],
    by: f64,
    probe_ns: f64,
) {
    let shortest = c
        .api
        .iter()
        .filter(|a| calls.contains(&a.function.as_str()) && a.count > 0)
        .map(|a| a.min_ns)
        .min()
        .unwrap_or(0);
    let probe_ns = probe_ns.max(shortest as f64);
    scale_rows(c, calls, by, probe_ns);
    for x in c.copies.iter_mut() {
        let seen = x.count;
        x.count = scale(x.count, by);
        x.bytes = scale(x.bytes, by);
        x.total_ns += unseen_ns(x.total_ns, seen, x.count, probe_ns);
    }
}

/// The API rows of `functions`, the process's and each thread's, scaled by `by`.
fn scale_rows(
    c: &mut crate::report::model::cuda::ProcessCuda,
    functions: &[&str],
    by: f64,
    probe_ns: f64,
) {
    let launches = functions;
    for a in c.api.iter_mut() {
        if launches.contains(&a.function.as_str()) {
            scale_api(a, by, probe_ns);
        }
    }
    for t in c.threads.iter_mut() {
        for a in t.api.iter_mut() {
            if launches.contains(&a.function.as_str()) {
                let before = a.total_ns;
                scale_api(a, by, probe_ns);
                t.total_ns = (t.total_ns + a.total_ns).saturating_sub(before);
            }
        }
    }
}

/// A thread's CUDA calls cannot have taken longer than it lived: the launches filled in are an
/// estimate (the report gives its bound), and where count and time together come out above
/// the thread's life, its launch time is cut back to the life, and the process's rows and
/// kernels with it. `alive`: a thread's time alive in the window.
pub(crate) fn cap_to_lives(
    c: &mut crate::report::model::cuda::ProcessCuda,
    launches: &[&str],
    alive: impl Fn(u32) -> Option<u64>,
) {
    let mut cut: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
    for t in c.threads.iter_mut() {
        let Some(life) = alive(t.tid) else { continue };
        let mut excess = t.total_ns.saturating_sub(life);
        if excess == 0 {
            continue;
        }
        let mut rows: Vec<&mut crate::report::model::cuda::ApiStat> = t
            .api
            .iter_mut()
            .filter(|a| launches.contains(&a.function.as_str()))
            .collect();
        rows.sort_by_key(|a| std::cmp::Reverse(a.total_ns));
        for a in rows {
            let take = excess.min(a.total_ns);
            a.total_ns -= take;
            t.total_ns -= take;
            excess -= take;
            *cut.entry(a.function.clone()).or_default() += take;
            if excess == 0 {
                break;
            }
        }
    }
    if cut.is_empty() {
        return;
    }
    let before = launch_ns(&c.api, launches);
    for a in c.api.iter_mut() {
        if let Some(n) = cut.get(&a.function) {
            a.total_ns = a.total_ns.saturating_sub(*n);
        }
    }
    let k = launch_ns(&c.api, launches) as f64 / before.max(1) as f64;
    // Capped copies and syncs leave the kernels' launch times alone.
    let of_launches = launches
        .iter()
        .any(|f| crate::cuda::table::by_name(f).is_some_and(|x| x.is_launch()));
    for kern in c.kernels.iter_mut().filter(|_| of_launches) {
        kern.launch_ns = (kern.launch_ns as f64 * k).round() as u64;
    }
}

/// The share of the seen launch time that the launches filled in added, from launch rows
/// before and after [`scale_cuda`]: the factor [`scale_launch_time`] moves time by, less one.
pub(crate) fn launch_time_added(
    before: &[crate::report::model::cuda::ApiStat],
    after: &[crate::report::model::cuda::ApiStat],
    launches: &[&str],
) -> f64 {
    let seen = launch_ns(before, launches);
    if seen == 0 {
        return 0.0;
    }
    launch_ns(after, launches).saturating_sub(seen) as f64 / seen as f64
}

/// Gives the time the calls of `functions` filled in added (their rows in `before`, against
/// the process's CUDA rows now) to the time breakdowns with `give`: the process's by its rows,
/// each thread's by its own.
pub(crate) fn give_filled_time(
    p: &mut crate::report::model::ProcessReport,
    before: &crate::report::model::cuda::ProcessCuda,
    functions: &[&str],
    mut give: impl FnMut(&mut crate::report::model::time::TimeBreakdown, f64),
) {
    let Some(c) = p.cuda.as_ref() else { return };
    let rows = |c: &crate::report::model::cuda::ProcessCuda, tid: u32| {
        c.threads
            .iter()
            .find(|x| x.tid == tid)
            .map(|x| x.api.clone())
            .unwrap_or_default()
    };
    let added = launch_time_added(&before.api, &c.api, functions);
    let per_thread: Vec<f64> = p
        .threads
        .iter()
        .map(|t| launch_time_added(&rows(before, t.tid), &rows(c, t.tid), functions))
        .collect();
    if let Some(t) = p.time.as_mut() {
        give(t, added);
    }
    for (t, added) in p.threads.iter_mut().zip(per_thread) {
        if let Some(tb) = t.time.as_mut() {
            give(tb, added);
        }
    }
}

/// The time inside the launch functions' calls of `rows`.
fn launch_ns(rows: &[crate::report::model::cuda::ApiStat], launches: &[&str]) -> u64 {
    rows.iter()
        .filter(|a| launches.contains(&a.function.as_str()))
        .map(|a| a.total_ns)
        .sum()
}

/// Off the windows a launch's time is counted as plain on-CPU time: move `added` times the
/// seen launch time from `cpu` to `cuda_launch` (never more than `cpu` holds), keeping the
/// sum, in the reasons too (taken from the on-CPU reasons, largest first, and given as their
/// own `cuda_launch` reason), so that each category is still the sum of its reasons.
pub(crate) fn scale_launch_time(t: &mut crate::report::model::time::TimeBreakdown, added: f64) {
    move_from_cpu(
        t,
        added,
        "cuda_launch",
        "launches between the budget's windows (estimated)",
    );
}

/// [`scale_launch_time`] for `category`'s calls filled in off the windows: the time they
/// added (`added` times the seen time) is taken from `cpu` and given as `reason`.
pub(crate) fn move_from_cpu(
    t: &mut crate::report::model::time::TimeBreakdown,
    added: f64,
    category: &str,
    reason: &str,
) {
    use crate::report::model::time::ReasonTime;
    let get = |t: &crate::report::model::time::TimeBreakdown, c: &str| {
        t.categories
            .iter()
            .find(|x| x.category == c)
            .map_or(0, |x| x.ns)
    };
    let (launch, cpu) = (get(t, category), get(t, "cpu"));
    let moved = ((launch as f64 * added).max(0.0) as u64).min(cpu);
    if moved == 0 {
        return;
    }
    for c in t.categories.iter_mut() {
        if c.category == "cpu" {
            c.ns -= moved;
        } else if c.category == category {
            c.ns += moved;
        }
    }
    let alive = t.alive_ns.max(1) as f64;
    for c in t.categories.iter_mut() {
        c.percent = 100.0 * c.ns as f64 / alive;
    }
    t.categories.retain(|c| c.ns > 0);
    t.categories.sort_by_key(|c| std::cmp::Reverse(c.ns));
    let mut left = moved;
    t.reasons.sort_by_key(|r| std::cmp::Reverse(r.ns));
    for r in t.reasons.iter_mut().filter(|r| r.category == "cpu") {
        let take = left.min(r.ns);
        r.ns -= take;
        left -= take;
        if left == 0 {
            break;
        }
    }
    t.reasons.retain(|r| r.ns > 0);
    t.reasons.push(ReasonTime {
        category: category.into(),
        reason: reason.into(),
        ns: moved - left,
        count: 0,
    });
    t.reasons.sort_by_key(|r| std::cmp::Reverse(r.ns));
}

/// The thread whose CUDA calls cost it the largest share of its time (calls seen, unscaled:
/// the cost was paid only in the probed windows), with `extra_ns` of probe cost it paid
/// beyond its counted calls (window closes) added to its share.
pub(crate) fn worst_cuda_thread(
    r: &Report,
    cost_per_hit: f64,
    extra_ns: f64,
) -> Option<ThreadOverhead> {
    let mut best: Option<(ThreadOverhead, u64)> = None;
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
            if best.as_ref().is_none_or(|(b, _)| share > b.estimated) {
                best = Some((
                    ThreadOverhead {
                        pid: p.pid,
                        tid: t.tid,
                        estimated: share,
                    },
                    a,
                ));
            }
        }
    }
    best.map(|(mut w, alive)| {
        w.estimated += extra_ns / alive as f64;
        w
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        cuda::table::FUNCS,
        report::model::cuda::{ApiStat, KernelStat, ProcessCuda, ThreadCuda},
    };

    /// A row of `n` calls of `f`, 10 ns each, the shortest `min_ns`.
    fn api(f: &str, n: u64, min_ns: u64) -> ApiStat {
        ApiStat {
            function: f.into(),
            count: n,
            total_ns: n * 10,
            min_ns,
            hist_log2_ns: vec![n],
            ..Default::default()
        }
    }

    #[test]
    fn syscall_tracepoints_cost_their_measured_slow_path() {
        let t = TrapCost::DEFAULT;
        assert_eq!(trap_ns("sys_enter", false, t, 41.0), 41.0);
        assert_eq!(trap_ns("sys_enter_btf", false, t, 41.0), 41.0);
        assert_eq!(trap_ns("sys_exit", false, t, 41.0), 41.0);
        assert_eq!(
            trap_ns("sched_switch", false, t, 41.0),
            budget::TRACEPOINT_NS
        );
        assert_eq!(trap_ns(RET_PROG, true, t, 41.0), t.ret_ns);
    }

    #[test]
    fn uprobe_traps_are_priced_without_the_statistics_that_timed_them() {
        let t = TrapCost {
            entry_ns: 800.0,
            ret_ns: 900.0,
            measured: true,
            // As measured here: an empty program reports 45 ns a run, and the statistics
            // cost a run 60 ns more outside that while on, which the traps timed then hold;
            // an empty hit with them off cost 800 - 60 ns, its reported 45 included.
            stats: calibrate::StatsCost {
                inside_ns: 45.0,
                outside_ns: 60.0,
            },
        };
        assert_eq!(trap_ns(ENTRY_PROG, true, t, 0.0), 695.0);
        assert_eq!(trap_ns(RET_PROG, true, t, 0.0), 795.0);
        assert_eq!(trap_ns("sys_exit", false, t, 41.0), 41.0);
        assert_eq!(
            trap_ns("sched_switch_btf", false, t, 0.0),
            budget::TRACEPOINT_NS
        );
    }

    /// A report whose only program is `sched_switch_btf`: 1,000 hits, 100 timed, a mean of
    /// 200 ns, 30 ns trap, 6 ns statistics.
    fn switches(with: impl FnOnce(&mut ProgramCost)) -> Report {
        let mut p = ProgramCost {
            program: "sched_switch_btf".into(),
            hits: 1000,
            timed: 100,
            bpf_ns_per_hit: 200.0,
            trap_ns_per_hit: 30.0,
            stats_ns_per_hit: 6.0,
            ..Default::default()
        };
        with(&mut p);
        let mut r = crate::report::fixtures::report();
        r.overhead = Some(Overhead {
            programs: vec![p],
            ..Default::default()
        });
        r
    }

    /// The data-loading job with one program, `sys_exit`: 10,000 hits at 300 ns (no trap, no
    /// statistics), of which `traced` did the traced work.
    fn syscall_exits(traced: Option<u64>) -> Report {
        let mut r = crate::report::fixtures::data_loading_job();
        r.overhead = Some(Overhead {
            programs: vec![ProgramCost {
                program: "sys_exit".into(),
                hits: 10_000,
                timed: 100,
                bpf_ns_per_hit: 300.0,
                traced_hits: traced,
                ..Default::default()
            }],
            ..Default::default()
        });
        r
    }

    #[test]
    fn every_traced_syscall_is_priced_not_only_the_rows_kept() {
        let tables: u64 = crate::report::fixtures::data_loading_job()
            .processes
            .iter()
            .flat_map(|p| &p.syscalls)
            .map(|s| s.count)
            .sum();
        assert!(tables > 0 && tables < 5_000);
        // Under process churn the rows of most short processes are not kept: the program's
        // count of its traced runs says how many calls the traced threads made.
        assert_eq!(traced_cost_ns(&syscall_exits(Some(5_000))).0, 5_000 * 300);
        // A program that did not count them: the calls in the report's tables.
        assert_eq!(traced_cost_ns(&syscall_exits(None)).0, tables * 300);
    }

    #[test]
    fn the_estimate_is_a_share_of_every_traced_threads_time() {
        let estimated = |alive: Option<u64>| {
            let mut r = syscall_exits(Some(5_000));
            r.overhead.as_mut().unwrap().traced_alive_ns = alive;
            complete(&mut r);
            r.overhead.unwrap().estimated
        };
        let listed: u64 = crate::report::fixtures::data_loading_job()
            .processes
            .iter()
            .flat_map(|p| &p.threads)
            .filter_map(|t| t.time.as_ref())
            .map(|t| t.alive_ns)
            .sum();
        let cost = 5_000.0 * 300.0;
        assert_eq!(estimated(None), cost / listed as f64);
        // The threads the report neither lists nor names count too: they made calls the cost
        // counts.
        assert_eq!(estimated(Some(4 * listed)), cost / (4 * listed) as f64);
        // Never below the listed threads' time.
        assert_eq!(estimated(Some(listed / 2)), cost / listed as f64);
    }

    #[test]
    fn what_the_traced_threads_paid_includes_the_statistics() {
        assert_eq!(traced_cost_ns(&switches(|_| {})).0, 236_000);
    }

    #[test]
    fn the_traced_threads_pay_for_their_own_hits_at_a_traced_hits_price() {
        // 100 of the 1,000 switches a traced thread's: the mean split into 740 ns traced and
        // 140 ns early returns.
        let r = switches(|p| {
            p.traced_hits = Some(100);
            p.traced_bpf_ns_per_hit = Some(740.0);
            p.early_bpf_ns_per_hit = Some(140.0);
        });
        assert_eq!(traced_cost_ns(&r).0, 100 * 776);
    }

    #[test]
    fn the_sampler_is_checked_against_the_programs_it_can_catch() {
        // The switches run with interrupts off: none of their 236 us is the sampler's to see.
        let mut r = switches(|_| {});
        assert_eq!(traced_cost_ns(&r).1, 0);
        // An exec program's 1,000 hits at 1,036 ns are.
        let o = r.overhead.as_mut().unwrap();
        o.programs.push(ProgramCost {
            program: "sched_process_exec".into(),
            hits: 1000,
            timed: 100,
            bpf_ns_per_hit: 1000.0,
            trap_ns_per_hit: 30.0,
            stats_ns_per_hit: 6.0,
            ..Default::default()
        });
        assert_eq!(traced_cost_ns(&r), (1_036_000 + 236_000, 1_036_000));
        assert!(unseen_by_sampler("cpu_sample") && unseen_by_sampler("sched_wakeup_new_tp"));
        assert!(!unseen_by_sampler("sys_exit") && !unseen_by_sampler("cuda_entry"));
    }

    #[test]
    fn launch_time_moves_from_cpu() {
        use crate::report::model::time::{CategoryTime, ReasonTime, TimeBreakdown};
        let reason = |c: &str, r: &str, ns| ReasonTime {
            category: c.into(),
            reason: r.into(),
            ns,
            count: 1,
        };
        let cat = |c: &str, ns| CategoryTime {
            category: c.into(),
            ns,
            percent: 0.0,
        };
        let mut t = TimeBreakdown {
            alive_ns: 1000,
            accounted_ns: 1000,
            categories: vec![cat("cpu", 900), cat("cuda_launch", 20), cat("sleep", 80)],
            reasons: vec![
                reason("cpu", "on-CPU", 850),
                reason("cpu", "page faults", 50),
                reason("cuda_launch", "cudaLaunchKernel", 20),
                reason("sleep", "nanosleep", 80),
            ],
            ..Default::default()
        };
        scale_launch_time(&mut t, 10.0);
        assert_eq!(t.categories[0].category, "cpu");
        assert_eq!(t.categories[0].ns, 700);
        assert_eq!(t.categories[1].ns, 220);
        assert_eq!(t.categories.iter().map(|c| c.ns).sum::<u64>(), 1000);
        assert!((t.categories[1].percent - 22.0).abs() < 1e-9);
        // The reasons still sum to their categories: taken from the largest on-CPU reason.
        for c in &t.categories {
            let sum: u64 = t
                .reasons
                .iter()
                .filter(|r| r.category == c.category)
                .map(|r| r.ns)
                .sum();
            assert_eq!(sum, c.ns, "{}: {:?}", c.category, t.reasons);
        }
        assert!(t
            .reasons
            .iter()
            .any(|r| r.reason.contains("between the budget's windows")));
        // Never more than cpu holds.
        scale_launch_time(&mut t, 99.0);
        assert_eq!(t.categories[0].category, "cuda_launch");
        assert_eq!(t.categories[0].ns, 920);
        assert!(t.categories.iter().all(|c| c.category != "cpu"));
    }

    #[test]
    fn only_launches_are_scaled() {
        let api = |f: &str, n| api(f, n, 0);
        let mut c = ProcessCuda {
            api: vec![api("cudaLaunchKernel", 10), api("cudaMemcpy", 7)],
            kernels: vec![KernelStat {
                name: "k".into(),
                launches: 10,
                launch_ns: 100,
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
        // 10 ns a seen launch, 4 of them the probes': the 15 filled in took 6 ns each.
        scale_cuda(&mut c, &launches, 2.5, 4.0);
        assert_eq!(c.api[0].count, 25);
        assert_eq!(c.api[0].total_ns, 100 + 15 * 6);
        assert_eq!(c.api[0].hist_log2_ns, vec![25]);
        assert_eq!(c.api[1].count, 7);
        assert_eq!(c.kernels[0].launches, 25);
        assert_eq!(c.kernels[0].launch_ns, 100 + 15 * 6);
        assert_eq!(c.threads[0].total_ns, 170 + 15 * 6);
        assert_eq!(c.threads[0].api[1].count, 7);
        // Probes that cost more than the seen mean add no time; a histogram rounded bucket by
        // bucket still sums to its count.
        let mut a = ApiStat {
            function: "cudaLaunchKernel".into(),
            count: 3,
            total_ns: 30,
            hist_log2_ns: vec![1, 1, 1],
            ..Default::default()
        };
        scale_api(&mut a, 2.5, 50.0);
        assert_eq!((a.count, a.total_ns), (8, 30));
        assert_eq!(a.hist_log2_ns.iter().sum::<u64>(), 8);
        // Thread 1 lived 200 ns: its launches are cut back by the 60 ns its calls came out
        // above that, and the process's row and kernel with them; its copies stay.
        cap_to_lives(&mut c, &launches, |tid| (tid == 1).then_some(200));
        assert_eq!(c.threads[0].total_ns, 200);
        assert_eq!(c.threads[0].api[0].total_ns, 190 - 60);
        assert_eq!(c.threads[0].api[1].total_ns, 70);
        assert_eq!(c.api[0].total_ns, 190 - 60);
        assert_eq!(c.kernels[0].launch_ns, 130);
    }

    #[test]
    fn copies_and_syncs_are_scaled_with_their_bytes_and_the_launches_are_not() {
        use crate::report::model::cuda::CopyStat;
        let mut c = ProcessCuda {
            api: vec![
                api("cudaLaunchKernel", 10, 5),
                api("cudaMemcpyAsync", 8, 6),
                api("cudaStreamSynchronize", 2, 9),
            ],
            copies: vec![CopyStat {
                direction: "D2H".into(),
                mode: "async".into(),
                count: 8,
                bytes: 64,
                total_ns: 80,
                gbps: 0.8,
            }],
            kernels: vec![KernelStat {
                name: "k".into(),
                launches: 10,
                launch_ns: 100,
                ..Default::default()
            }],
            threads: vec![ThreadCuda {
                tid: 1,
                total_ns: 200,
                api: vec![
                    api("cudaLaunchKernel", 10, 5),
                    api("cudaMemcpyAsync", 8, 6),
                    api("cudaStreamSynchronize", 2, 9),
                ],
            }],
            ..Default::default()
        };
        let calls = call_names();
        assert!(calls.contains(&"cudaMemcpyAsync") && calls.contains(&"cudaStreamSynchronize"));
        assert!(!calls.contains(&"cudaLaunchKernel") && !calls.contains(&"cudaMalloc"));
        // The probes' part of a seen call is at least the shortest seen (6 ns, above the 4
        // measured): the 24 copies filled in took 10 - 6 = 4 ns each.
        scale_calls(&mut c, &calls, 4.0, 4.0);
        assert_eq!(c.api[0].count, 10);
        assert_eq!(c.kernels[0].launches, 10);
        assert_eq!(c.api[1].count, 32);
        assert_eq!(c.api[1].total_ns, 80 + 24 * 4);
        assert_eq!(c.api[2].count, 8);
        assert_eq!(
            (c.copies[0].count, c.copies[0].bytes, c.copies[0].total_ns),
            (32, 256, 80 + 24 * 4)
        );
        assert_eq!(c.threads[0].api[1].count, 32);
        // Capped to its thread's life, the copies give up time and the kernels keep theirs.
        let total = c.threads[0].total_ns;
        cap_to_lives(&mut c, &calls, |_| Some(total - 50));
        assert_eq!(c.threads[0].total_ns, total - 50);
        assert_eq!(c.kernels[0].launch_ns, 100);
    }
}
