//! The gate that switches the CUDA copy and sync probes on and off under `--max-overhead`,
//! once their cost alone passes the budget: a copy storm (a loop that reads a scalar back after
//! every tiny step makes one) paid ~60% of its thread's time for probes that no launch window
//! could take off, and the report could only warn about it.
//!
//! While the copy and sync probes cost less than the budget they stay on: their counts are
//! exact, and the launch windows fill in the launches between them from the copies and syncs
//! (`budget`). The gate is a token bucket of its own (`budget::Gate`): its first window is the
//! probes attached as the libraries load, closed at the tick (100 ms) that finds its share of
//! the bucket spent; each later window opens at a tick once the bucket is full again and is
//! closed by a thread of its own when it has spent that share at the last window's cost per
//! ns (a few ms in a storm), or at the tick that finds it spent first. What the windows saw is
//! counted exactly; the stretches between them are filled in at the windows' call rates in
//! the workload's own time, and the copies' and syncs' counts, times and bytes are scaled and
//! marked as estimated. The launch windows' estimate stops going by launches per copy or sync
//! for the ticks these probes were off.
//!
//! A window's return probes go [`RETURN_LAG`] after its entry programs stopped counting, and
//! the threads' outermost copies and syncs from before are then not trusted
//! (`CALL_GEN_SLOT`): a call whose return went unseen would otherwise give its entry time to
//! the next window's first return at its stack level.

use std::{
    path::PathBuf,
    sync::{
        atomic::{AtomicU64, Ordering},
        mpsc, Arc,
    },
    time::Duration,
};

use aya::{
    maps::{Array, Map, MapData, PerCpuArray},
    Ebpf,
};
use tracer_common::{
    cuda::{
        CALL_GEN_SLOT, CALL_RUNS_SLOT, ENTRY_PROG, LAUNCH_RUNS_MAP, OTHER_ENTRY_SLOT,
        OTHER_RET_SLOT, RET_GEN_MAP,
    },
    time::Category,
};

use super::stats::own_map;
use crate::{
    budget::{Gate, TickObs},
    cuda::table::FUNCS,
    probes::ktime_now,
    report::{
        model::overhead::{Overhead, ProbeSampling},
        ReportData,
    },
    uprobes::{close_all, Link, Uprobes},
};

/// Whether the gate may switch function `fid`'s probes: the copies and syncs, the calls a job
/// can make at launch rates (`.item()` in a loop) that no launch window covers.
pub fn is_call(fid: usize) -> bool {
    FUNCS
        .get(fid)
        .is_some_and(|f| matches!(f.category, Category::CudaMemcpy | Category::CudaSync))
}

/// The names of the functions [`is_call`] takes.
pub fn call_names() -> Vec<&'static str> {
    (0..FUNCS.len())
        .filter(|&i| is_call(i))
        .map(|i| FUNCS[i].name)
        .collect()
}

/// What a link was attached with, to attach it again at the next window.
struct Spec {
    prog: &'static str,
    path: PathBuf,
    points: Vec<(u64, u64)>,
}

/// The entry and return programs' runs: at every function but the launches in traced threads
/// (what the probes cost), and the entries at copies and syncs (what the windows saw).
#[derive(Debug, Clone, Copy, Default)]
struct Runs {
    entry: u64,
    ret: u64,
    calls: u64,
}

pub struct CallGate {
    gate: Gate,
    specs: Vec<Spec>,
    /// Links held here, by program: those attached before the first window closed, and those
    /// of libraries attached while a window was open.
    entries: Vec<Link>,
    rets: Vec<Link>,
    /// Whether the probes are on, since when (CLOCK_MONOTONIC ns; None: since they were
    /// attached), and the thread that holds the open window's links and closes them.
    on: bool,
    opened_at: Option<u64>,
    closer: Option<Closer>,
    /// Whether the probes were on for the whole of the last tick.
    whole_tick: bool,
    /// What the probes cost per ns of the last window: how long the next may stay open.
    rate: Option<f64>,
    uprobes: Option<Uprobes>,
    runs: Option<PerCpuArray<MapData, u64>>,
    /// The previous tick: CLOCK_MONOTONIC ns and the runs then.
    last: Option<(u64, Runs)>,
    /// Libraries a window could not attach again (unmapped, removed).
    lost: Vec<PathBuf>,
    finishing: bool,
}

/// How long a closed window's return probes stay once its entry programs stopped counting: a
/// call in flight at the close returns to its probe (the calls that storm are short; a sync
/// that waits longer leaves its thread's time charged to it until its next probed call). Not
/// longer: every call meanwhile traps on the return probe (10 ms of it cost a copy storm as
/// much as the 2-3 ms window before it).
const RETURN_LAG: Duration = Duration::from_millis(1);

/// The shortest and longest window planned from the last one's cost.
const MIN_WINDOW: Duration = Duration::from_millis(2);
const MAX_WINDOW: Duration = Duration::from_secs(10);

/// What a window's closer reads and writes: the programs' counts (to tell when the entry
/// programs stopped counting) and the generations (`CALL_GEN_SLOT`, raised once the return
/// probes are gone).
type CloserMaps = (
    Option<PerCpuArray<MapData, u64>>,
    Option<Array<MapData, u64>>,
);

/// A window's links on a thread of their own, dropped at the window's planned end or when told
/// (or when the gate is dropped): entry links first, return links [`RETURN_LAG`] later. Each
/// drop waits out the kernel's grace period (~40-100 ms here), which the event loop must not.
struct Closer {
    stop: mpsc::Sender<()>,
    /// When the window ended: its entry programs' last counted call once their links began to
    /// go (CLOCK_MONOTONIC ns; 0: not yet).
    closed_at: Arc<AtomicU64>,
}

impl Closer {
    /// `runs`: the entry program's counts, to tell when it stopped counting calls.
    fn spawn(
        entries: Vec<Link>,
        rets: Vec<Link>,
        after: Duration,
        (runs, mut gen): CloserMaps,
    ) -> Closer {
        let (stop, rx) = mpsc::channel::<()>();
        let closed_at = Arc::new(AtomicU64::new(0));
        let at = closed_at.clone();
        let run = move || {
            let _ = rx.recv_timeout(after);
            let begun = ktime_now();
            let first = std::thread::Builder::new()
                .name("gputrace-calls".into())
                .spawn(move || close_all(entries))
                .ok();
            // The window ends with its last counted call: the entry programs run on for a few
            // ms while the links go, and a 2 ms window whose end was taken at the decision
            // read its calls over a fraction of their time (10M copies estimated at 25M).
            let end = match (&runs, &first) {
                (Some(m), Some(t)) => last_run(m, t).max(begun),
                _ => begun,
            };
            at.store(end.max(1), Ordering::SeqCst);
            std::thread::sleep(RETURN_LAG);
            close_all(rets);
            // A call whose return went with them left its thread's call state behind.
            if let Some(g) = gen.as_mut() {
                super::gate::raise_gen(g, CALL_GEN_SLOT);
            }
            if let Some(t) = first {
                let _ = t.join();
            }
        };
        if let Err(e) = std::thread::Builder::new()
            .name("gputrace-calls".into())
            .spawn(run)
        {
            // No thread: the links went with the closure, dropped here one by one.
            crate::note!("gputrace: copy and sync window thread: {e}");
            closed_at.store(ktime_now().max(1), Ordering::SeqCst);
        }
        Closer { stop, closed_at }
    }

    fn closed_at(&self) -> Option<u64> {
        Some(self.closed_at.load(Ordering::SeqCst)).filter(|&t| t != 0)
    }
}

impl CallGate {
    pub fn new(budget: f64) -> CallGate {
        CallGate {
            gate: Gate::new(budget),
            specs: Vec::new(),
            entries: Vec::new(),
            rets: Vec::new(),
            on: true,
            opened_at: None,
            closer: None,
            whole_tick: true,
            rate: None,
            uprobes: None,
            runs: None,
            last: None,
            lost: Vec::new(),
            finishing: false,
        }
    }

    /// Whether probes on function `fid` are switched by this gate.
    pub fn gated(&self, fid: usize) -> bool {
        self.gate.samples() && is_call(fid)
    }

    pub fn set_uprobes(&mut self, ebpf: &Ebpf, uprobes: &Uprobes) {
        self.uprobes = Some(uprobes.clone());
        self.runs = runs_map(ebpf);
    }

    fn read(&self) -> Runs {
        let slot = |i: u32| -> u64 {
            self.runs
                .as_ref()
                .and_then(|m| m.get(&i, 0).ok())
                .map_or(0, |v| v.iter().sum())
        };
        Runs {
            entry: slot(OTHER_ENTRY_SLOT),
            ret: slot(OTHER_RET_SLOT),
            calls: slot(CALL_RUNS_SLOT),
        }
    }

    /// Records copy and sync probes just attached, and keeps their links while a window is
    /// open (drops them while none is).
    pub fn add(
        &mut self,
        prog: &'static str,
        path: PathBuf,
        points: Vec<(u64, u64)>,
        links: Vec<Link>,
    ) {
        // The clock starts with the first probe.
        if self.last.is_none() {
            self.last = Some((ktime_now(), self.read()));
        }
        self.specs.push(Spec { prog, path, points });
        if !self.on {
            if prog == ENTRY_PROG {
                close_later(links, Vec::new());
            } else {
                close_later(Vec::new(), links);
            }
        } else if prog == ENTRY_PROG {
            self.entries.extend(links);
        } else {
            self.rets.extend(links);
        }
    }

    /// Whether the copies and syncs were all counted over the last tick.
    pub fn exact(&self) -> bool {
        self.whole_tick
    }

    /// The links attached now, to close with the others.
    pub fn take_links(&mut self) -> Vec<Link> {
        // A window's thread closes its own.
        if let Some(c) = self.closer.take() {
            let _ = c.stop.send(());
        }
        let mut l = std::mem::take(&mut self.entries);
        l.append(&mut self.rets);
        l
    }

    /// Libraries whose copy and sync probes a window could not attach again.
    pub fn take_lost(&mut self) -> Vec<PathBuf> {
        std::mem::take(&mut self.lost)
    }

    /// One tick: observe, decide, open or close. `(entry, ret)`: what a hit of each program
    /// costs (the launch gate's measure: the same programs), `trap_ns` a call's traps.
    pub fn tick(&mut self, ebpf: &mut Ebpf, (entry, ret): (f64, f64), trap_ns: f64) {
        self.tick_until(ebpf, ktime_now(), (entry, ret), trap_ns);
    }

    fn tick_until(&mut self, ebpf: &mut Ebpf, now: u64, (entry, ret): (f64, f64), trap_ns: f64) {
        if !self.gate.samples() || self.specs.is_empty() {
            return;
        }
        let r = self.read();
        let Some((t0, r0)) = self.last.replace((now, r)) else {
            return;
        };
        let now = now.max(t0);
        let dt = now - t0;
        // Closed since the last tick (at its planned end, or as the last tick decided).
        let closed_at = self.closer.as_ref().and_then(Closer::closed_at);
        let on_ns = if self.on {
            let from = self.opened_at.unwrap_or(t0).clamp(t0, now);
            closed_at.unwrap_or(now).clamp(from, now) - from
        } else {
            0
        };
        let calls = r.calls.saturating_sub(r0.calls);
        let cost = r.entry.saturating_sub(r0.entry) as f64 * entry
            + r.ret.saturating_sub(r0.ret) as f64 * ret;
        // On: the copies and syncs are the window's hits, an entry and a return each; the rest
        // (a closing window's return probes, allocations, names) is paid outside any window.
        // Charged to the calls, the closing returns took a third of a 2 ms window's own time
        // and read its rate high.
        let per_hit = entry + ret;
        let (hits, other) = if on_ns > 0 && calls > 0 {
            (calls, (cost - calls as f64 * per_hit).max(0.0))
        } else {
            (0, cost)
        };
        let closed = self.on && closed_at.is_some();
        let open = self.gate.tick(TickObs {
            dt_ns: dt,
            on_ns,
            sampled_hits: hits,
            launches: if on_ns > 0 { calls } else { 0 },
            cost_per_hit_ns: per_hit,
            trap_ns: trap_ns.min(per_hit),
            other_cost_ns: other,
            closed,
            stretch: 1.0,
            ..Default::default()
        });
        self.whole_tick = on_ns >= dt;
        if closed {
            self.on = false;
            self.closer = None;
            if on_ns > 0 {
                self.rate = Some(cost / on_ns as f64);
            }
            // Links of a library attached while the window was open.
            close_later(
                std::mem::take(&mut self.entries),
                std::mem::take(&mut self.rets),
            );
        }
        if self.on && self.gate.tokens_ns() <= 0.0 {
            // Spent before its planned end (or none was planned: the probes were on from the
            // start): closed now.
            match &self.closer {
                Some(c) => {
                    let _ = c.stop.send(());
                }
                None => {
                    self.closer = Some(Closer::spawn(
                        std::mem::take(&mut self.entries),
                        std::mem::take(&mut self.rets),
                        Duration::ZERO,
                        closer_maps(ebpf),
                    ));
                }
            }
        } else if !self.on && open && !self.finishing {
            self.reopen(ebpf);
        }
    }

    /// Attaches the probes again, the return probes first, and hands the links to a thread that
    /// closes them once the window has spent what it may at the last window's cost.
    fn reopen(&mut self, ebpf: &mut Ebpf) {
        let Some(u) = self.uprobes.clone() else {
            return;
        };
        // The return probes first: a call entered between the two would raise its thread's call
        // depth with no return to lower it.
        let mut order: Vec<usize> = (0..self.specs.len()).collect();
        order.sort_by_key(|&i| self.specs[i].prog == ENTRY_PROG);
        let (mut entries, mut rets) = (Vec::new(), Vec::new());
        // The window starts as its entry probes go on (midway: each counts from its own
        // attach).
        let mut entries_from = None;
        for i in order {
            let s = &self.specs[i];
            if s.prog == ENTRY_PROG && entries_from.is_none() {
                entries_from = Some(ktime_now());
            }
            match u.attach(ebpf, s.prog, &s.path, &s.points, None) {
                Ok(l) if s.prog == ENTRY_PROG => entries.extend(l),
                Ok(l) => rets.extend(l),
                Err(_) => {
                    if !self.lost.contains(&s.path) {
                        self.lost.push(s.path.clone());
                    }
                }
            }
        }
        let planned = planned(self.gate.tokens_ns(), self.rate);
        let now = ktime_now();
        self.opened_at = Some(entries_from.map_or(now, |f| f + (now - f) / 2));
        self.closer = Some(Closer::spawn(entries, rets, planned, closer_maps(ebpf)));
        self.on = true;
    }
}

/// How long a window may stay open: what it may spend (`left_ns`) at what the last one cost per
/// ns (`rate`), within [`MIN_WINDOW`] and [`MAX_WINDOW`]; with no last one, until a tick finds
/// the bucket spent.
fn planned(left_ns: f64, rate: Option<f64>) -> Duration {
    match rate.filter(|r| *r > 0.0) {
        Some(r) => {
            Duration::from_nanos((left_ns.max(0.0) / r) as u64).clamp(MIN_WINDOW, MAX_WINDOW)
        }
        None => MAX_WINDOW,
    }
}

/// Entry links now and return links [`RETURN_LAG`] later, on a thread of their own.
fn close_later(entries: Vec<Link>, rets: Vec<Link>) {
    if entries.is_empty() && rets.is_empty() {
        return;
    }
    let _ = Closer::spawn(entries, rets, Duration::ZERO, (None, None));
}

/// When the entry program last counted a call at a copy or sync (CLOCK_MONOTONIC ns) once
/// its links began to drop (`drop`): no new count in 300 us (polled every 100 us), or the
/// drop returned, or 20 ms passed.
fn last_run(runs: &PerCpuArray<MapData, u64>, drop: &std::thread::JoinHandle<()>) -> u64 {
    const QUIET: Duration = Duration::from_micros(300);
    const QUIET_MAX: Duration = Duration::from_millis(20);
    let read = || -> u64 { runs.get(&CALL_RUNS_SLOT, 0).map_or(0, |v| v.iter().sum()) };
    let start = std::time::Instant::now();
    let mut last = read();
    let mut last_at = ktime_now();
    let mut still = std::time::Instant::now();
    while start.elapsed() < QUIET_MAX && !drop.is_finished() {
        std::thread::sleep(Duration::from_micros(100));
        let now = read();
        if now != last {
            last = now;
            last_at = ktime_now();
            still = std::time::Instant::now();
        } else if still.elapsed() >= QUIET {
            break;
        }
    }
    last_at
}

/// A handle of its own on the programs' counts, for the gate and a window's closer.
fn runs_map(ebpf: &Ebpf) -> Option<PerCpuArray<MapData, u64>> {
    own_map(ebpf, LAUNCH_RUNS_MAP)
        .ok()
        .and_then(|d| PerCpuArray::try_from(Map::PerCpuArray(d)).ok())
}

/// What a window's closer needs of the maps: the counts, and the generations to raise.
fn closer_maps(ebpf: &Ebpf) -> CloserMaps {
    let gen = own_map(ebpf, RET_GEN_MAP)
        .ok()
        .and_then(|d| Array::try_from(Map::Array(d)).ok());
    (runs_map(ebpf), gen)
}

impl CallGate {
    /// The last partial tick, once, as the trace's window ends: no window opens after it.
    /// `ended`: when the last traced process exited, if all did.
    pub fn last_tick(
        &mut self,
        ebpf: &mut Ebpf,
        ended: Option<u64>,
        costs: (f64, f64),
        trap_ns: f64,
    ) {
        if self.finishing {
            return;
        }
        self.finishing = true;
        let now = ktime_now();
        self.tick_until(ebpf, ended.map_or(now, |e| e.min(now)), costs, trap_ns);
    }

    /// The copies' and syncs' counts, times and bytes scaled to what the windows estimate, and
    /// the sampling said in the report. `probe_ns`: what the probes add inside a timed call.
    pub fn finish(&self, data: &mut ReportData, probe_ns: f64) {
        let e = self.gate.estimate();
        if e.scale == 1.0 || e.windows == 0 {
            return;
        }
        let names = call_names();
        let copies: Vec<&str> = names
            .iter()
            .copied()
            .filter(|n| {
                FUNCS
                    .iter()
                    .any(|f| f.name == *n && f.category == Category::CudaMemcpy)
            })
            .collect();
        let mut seen = 0u64;
        for p in data.report.processes.iter_mut() {
            let Some(c) = p.cuda.as_mut() else { continue };
            seen += c
                .api
                .iter()
                .filter(|a| names.contains(&a.function.as_str()))
                .map(|a| a.count)
                .sum::<u64>();
            let before = c.clone();
            super::scale_calls(c, &names, e.scale, probe_ns);
            let lives: std::collections::HashMap<u32, u64> = p
                .threads
                .iter()
                .filter_map(|t| t.time.as_ref().map(|tb| (t.tid, tb.alive_ns)))
                .collect();
            super::cap_to_lives(c, &names, |tid| lives.get(&tid).copied());
            // The copies filled in ran on CPU unseen, as the launches did; a sync filled in
            // waited where the thread waited (on CPU or in the driver's syscalls), which the
            // breakdown cannot tell apart: its time stays where it was charged.
            let moved = |tb: &mut crate::report::model::time::TimeBreakdown,
                         before: &[crate::report::model::cuda::ApiStat],
                         after: &[crate::report::model::cuda::ApiStat]| {
                let added = super::launch_time_added(before, after, &copies);
                super::move_from_cpu(
                    tb,
                    added,
                    "cuda_memcpy",
                    "copies between the budget's copy and sync windows (estimated)",
                );
            };
            if let Some(t) = p.time.as_mut() {
                moved(t, &before.api, &c.api);
            }
            for t in p.threads.iter_mut() {
                let rows = |c: &crate::report::model::cuda::ProcessCuda| {
                    c.threads
                        .iter()
                        .find(|x| x.tid == t.tid)
                        .map(|x| x.api.clone())
                        .unwrap_or_default()
                };
                let (b, a) = (rows(&before), rows(c));
                if let Some(tb) = t.time.as_mut() {
                    moved(tb, &b, &a);
                }
            }
        }
        let o = data.report.overhead.get_or_insert_with(Overhead::default);
        o.sampled_calls = Some(ProbeSampling {
            probes: "CUDA copy and sync probes".into(),
            scaled: "copy and sync call counts, their times, the copies' bytes by direction, \
                     and the time breakdown's cuda_memcpy time (moved from cpu; a sync's time \
                     off the windows stays where it was spent)"
                .into(),
            duty: e.duty,
            scale: e.scale,
            rel_error: e.rel_error,
            windows: e.windows as u64,
            seen_hits: seen,
            filled_by_calls: 0.0,
            no_bound: e.no_bound.map(|n| n.says().to_string()),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_and_syncs_are_switched_and_nothing_else() {
        let names = call_names();
        for f in [
            "cudaMemcpy",
            "cudaMemcpyAsync",
            "cuMemcpyHtoDAsync_v2",
            "cudaStreamSynchronize",
        ] {
            assert!(names.contains(&f), "{f}");
        }
        // Launches have their own gate; allocations and the calls that name kernels are rare,
        // and what the report needs of them (memory, names) cannot be filled in.
        for f in [
            "cudaLaunchKernel",
            "cudaMalloc",
            "cuModuleGetFunction",
            "__cudaRegisterFunction",
        ] {
            assert!(!names.contains(&f), "{f}");
        }
    }

    #[test]
    fn a_window_lasts_what_the_bucket_leaves_at_the_last_ones_cost() {
        // 5 ms to spend at 0.5 ns of probes a ns: 10 ms.
        assert_eq!(planned(5e6, Some(0.5)), Duration::from_millis(10));
        // Never shorter than a few calls' worth, nor for ever; an overspent bucket gets the
        // shortest; no cost known yet: until a tick finds the bucket spent.
        assert_eq!(planned(1.0, Some(0.5)), MIN_WINDOW);
        assert_eq!(planned(-3e6, Some(0.5)), MIN_WINDOW);
        assert_eq!(planned(5e6, Some(1e-9)), MAX_WINDOW);
        assert_eq!(planned(5e6, None), MAX_WINDOW);
        assert_eq!(planned(5e6, Some(0.0)), MAX_WINDOW);
    }
}
