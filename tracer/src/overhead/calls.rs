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
        mpsc, Arc, Mutex,
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
    cuda::table::{Func, FUNCS},
    probes::ktime_now,
    report::{
        model::overhead::{Overhead, ProbeSampling},
        ReportData,
    },
    uprobes::{close_all, Link, Uprobes},
};

/// Whether the gate may switch `f`'s probes: the copies and syncs, the calls a job can make at
/// launch rates (`.item()` in a loop) that no launch window covers.
pub fn is_call(f: &Func) -> bool {
    matches!(f.category, Category::CudaMemcpy | Category::CudaSync)
}

/// The names of the functions [`is_call`] takes.
pub fn call_names() -> Vec<&'static str> {
    FUNCS
        .iter()
        .filter(|f| is_call(f))
        .map(|f| f.name)
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
    /// Whether the probes are on, since when (CLOCK_MONOTONIC ns; None: since they were
    /// attached), and the thread that holds the open window's links and closes them.
    on: bool,
    opened_at: Option<u64>,
    closer: Option<Closer>,
    /// Whether the probes were on for the whole of the last tick.
    whole_tick: bool,
    /// What the probes cost per ns of the last window (a window planned without the counts to
    /// watch lasts what the bucket leaves at it), and what a copy or sync costs (an entry and
    /// a return hit).
    rate: Option<f64>,
    per_call_ns: f64,
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

/// How often a window's closer looks at what its calls cost: soon enough for the share to be
/// spent by then at the pace of the last look, within these.
const LOOK_MIN: Duration = Duration::from_millis(2);
const LOOK_MAX: Duration = Duration::from_millis(50);

/// What a window's closer reads and writes: the programs' counts (what its calls cost, and when
/// the entry programs stopped counting) and the generations (`CALL_GEN_SLOT`, raised once the
/// return probes are gone).
type CloserMaps = (
    Option<PerCpuArray<MapData, u64>>,
    Option<Array<MapData, u64>>,
);

/// When a window must close: once its calls (each `per_call_ns`) have spent what it may, a
/// bucket that starts at `tokens_ns` (its share when it opened) and refills at `budget` up to
/// that share (a job whose copies turned into a storm after a quiet minute gets no minute's
/// worth); or, without the counts to watch, after `planned`.
#[derive(Debug, Clone, Copy)]
struct Watch {
    budget: f64,
    tokens_ns: f64,
    per_call_ns: f64,
    planned: Option<Duration>,
}

/// A window's links and whether they went.
#[derive(Default)]
struct Links {
    entries: Vec<Link>,
    rets: Vec<Link>,
    closed: bool,
}

impl Links {
    /// Keeps `prog`'s links with the entry or the return links.
    fn add(&mut self, prog: &str, links: Vec<Link>) {
        if prog == ENTRY_PROG {
            self.entries.extend(links);
        } else {
            self.rets.extend(links);
        }
    }
}

/// A window's links on a thread of their own, which watches what its calls cost and drops them
/// once its share of the bucket is spent (or when told, or when the gate is dropped): entry
/// links first, return links [`RETURN_LAG`] later. Each drop waits out the kernel's grace
/// period (~40-100 ms here), which the event loop must not. The first window closes within
/// milliseconds of a storm's start too: closed at the first tick, it cost a 4 s copy storm
/// ~2% of its time on its own.
struct Closer {
    stop: mpsc::Sender<()>,
    /// When the window ended: its entry programs' last counted call once their links began to
    /// go (CLOCK_MONOTONIC ns; 0: not yet).
    closed_at: Arc<AtomicU64>,
    links: Arc<Mutex<Links>>,
}

impl Closer {
    fn spawn(links: Links, watch: Watch, (runs, mut gen): CloserMaps) -> Closer {
        let (stop, rx) = mpsc::channel::<()>();
        let closed_at = Arc::new(AtomicU64::new(0));
        let links = Arc::new(Mutex::new(links));
        let (at, held) = (closed_at.clone(), links.clone());
        let run = move || {
            wait_spent(&rx, watch, runs.as_ref());
            let (entries, rets) = match held.lock() {
                Ok(mut l) => {
                    l.closed = true;
                    (std::mem::take(&mut l.entries), std::mem::take(&mut l.rets))
                }
                Err(_) => (Vec::new(), Vec::new()),
            };
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
        Closer {
            stop,
            closed_at,
            links,
        }
    }

    fn closed_at(&self) -> Option<u64> {
        Some(self.closed_at.load(Ordering::SeqCst)).filter(|&t| t != 0)
    }

    /// Adds links of a library attached while the window is open; gives them back if it
    /// closed.
    fn hold(&self, prog: &'static str, links: Vec<Link>) -> Result<(), Vec<Link>> {
        match self.links.lock() {
            Ok(mut l) if !l.closed => {
                l.add(prog, links);
                Ok(())
            }
            _ => Err(links),
        }
    }
}

/// Returns once the window must close ([`Watch`]), or the gate says so (or is gone).
fn wait_spent(rx: &mpsc::Receiver<()>, w: Watch, runs: Option<&PerCpuArray<MapData, u64>>) {
    let start = std::time::Instant::now();
    let Some(runs) = runs.filter(|_| w.tokens_ns > 0.0) else {
        let _ = match w.planned {
            Some(p) => rx.recv_timeout(p).map_err(|_| ()),
            None => rx.recv().map_err(|_| ()),
        };
        return;
    };
    let (mut last_runs, mut last_ns) = (call_runs(runs), 0u64);
    let mut left = w.tokens_ns;
    let mut look = LOOK_MIN;
    loop {
        if !matches!(rx.recv_timeout(look), Err(mpsc::RecvTimeoutError::Timeout)) {
            return;
        }
        let now_ns = start.elapsed().as_nanos() as u64;
        let dt = now_ns.saturating_sub(last_ns).max(1);
        let n = call_runs(runs);
        let spent = n.saturating_sub(last_runs) as f64 * w.per_call_ns;
        left = (left + w.budget * dt as f64).min(w.tokens_ns) - spent;
        if left <= 0.0 {
            return;
        }
        look = next_look(left, spent / dt as f64, w.budget);
        (last_runs, last_ns) = (n, now_ns);
    }
}

/// When to look again: when the window's headroom (`left_ns`) would be spent at the pace of
/// the last look (`rate`, probe ns per ns, against the budget's refill), within [`LOOK_MIN`]
/// and [`LOOK_MAX`].
fn next_look(left_ns: f64, rate: f64, budget: f64) -> Duration {
    let net = rate - budget;
    if net <= 0.0 {
        return LOOK_MAX;
    }
    Duration::from_nanos((left_ns / net) as u64).clamp(LOOK_MIN, LOOK_MAX)
}

fn call_runs(runs: &PerCpuArray<MapData, u64>) -> u64 {
    runs.get(&CALL_RUNS_SLOT, 0).map_or(0, |v| v.iter().sum())
}

impl CallGate {
    pub fn new(budget: f64) -> CallGate {
        CallGate {
            gate: Gate::new(budget),
            specs: Vec::new(),
            on: true,
            opened_at: None,
            closer: None,
            whole_tick: true,
            rate: None,
            per_call_ns: 0.0,
            uprobes: None,
            runs: None,
            last: None,
            lost: Vec::new(),
            finishing: false,
        }
    }

    /// Whether probes on function `fid` are switched by this gate.
    pub fn gated(&self, fid: usize) -> bool {
        self.gate.samples() && FUNCS.get(fid).is_some_and(is_call)
    }

    /// `(entry, ret)`: what a hit of each program costs, as the launch gate prices them (the
    /// same programs), for the first window's watch.
    pub fn set_uprobes(&mut self, ebpf: &Ebpf, uprobes: &Uprobes, (entry, ret): (f64, f64)) {
        self.uprobes = Some(uprobes.clone());
        self.runs = runs_map(ebpf);
        self.per_call_ns = entry + ret;
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

    /// What the open window may spend: its share of the bucket, watched by its closer.
    fn watch(&self, planned: Option<Duration>) -> Watch {
        Watch {
            budget: self.gate.budget(),
            tokens_ns: self.gate.tokens_ns().max(0.0),
            per_call_ns: self.per_call_ns,
            planned,
        }
    }

    /// Records copy and sync probes just attached: while a window is open its closer holds
    /// them (the first attach opens the first window), while none is they go at once.
    pub fn add(
        &mut self,
        ebpf: &Ebpf,
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
        if !self.on || !self.gate.samples() {
            close_later(prog, links);
            return;
        }
        if self.closer.is_none() {
            self.closer = Some(Closer::spawn(
                Links::default(),
                self.watch(None),
                closer_maps(ebpf),
            ));
        }
        if let Some(Err(links)) = self.closer.as_ref().map(|c| c.hold(prog, links)) {
            close_later(prog, links);
        }
    }

    /// Whether the copies and syncs were all counted over the last tick.
    pub fn exact(&self) -> bool {
        self.whole_tick
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
        // Closed since the last tick (by its closer, or as the last tick decided).
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
        self.per_call_ns = per_hit;
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
        }
        if self.on && self.gate.tokens_ns() <= 0.0 {
            // Spent before its closer saw it: closed now.
            if let Some(c) = &self.closer {
                let _ = c.stop.send(());
            }
        } else if !self.on && open && !self.finishing {
            self.reopen(ebpf);
        }
    }

    /// Attaches the probes again, the return probes first, and hands the links to a closer.
    fn reopen(&mut self, ebpf: &mut Ebpf) {
        let Some(u) = self.uprobes.clone() else {
            return;
        };
        // The return probes first: a call entered between the two would raise its thread's call
        // depth with no return to lower it.
        let mut order: Vec<usize> = (0..self.specs.len()).collect();
        order.sort_by_key(|&i| self.specs[i].prog == ENTRY_PROG);
        let mut links = Links::default();
        // The window starts as its entry probes go on (midway: each counts from its own
        // attach).
        let mut entries_from = None;
        for i in order {
            let s = &self.specs[i];
            if s.prog == ENTRY_PROG && entries_from.is_none() {
                entries_from = Some(ktime_now());
            }
            match u.attach(ebpf, s.prog, &s.path, &s.points, None) {
                Ok(l) => links.add(s.prog, l),
                Err(_) => {
                    if !self.lost.contains(&s.path) {
                        self.lost.push(s.path.clone());
                    }
                }
            }
        }
        let now = ktime_now();
        self.opened_at = Some(entries_from.map_or(now, |f| f + (now - f) / 2));
        // Without the counts to watch, the window lasts what the bucket leaves at the last
        // window's cost.
        let planned = self
            .runs
            .is_none()
            .then(|| planned(self.gate.tokens_ns(), self.rate));
        self.closer = Some(Closer::spawn(links, self.watch(planned), closer_maps(ebpf)));
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

/// `prog`'s links now (entry links) or [`RETURN_LAG`] later (return links), on a thread of
/// their own.
fn close_later(prog: &'static str, links: Vec<Link>) {
    if links.is_empty() {
        return;
    }
    let mut l = Links::default();
    l.add(prog, links);
    let watch = Watch {
        budget: 0.0,
        tokens_ns: 0.0,
        per_call_ns: 0.0,
        planned: Some(Duration::ZERO),
    };
    let _ = Closer::spawn(l, watch, (None, None));
}

/// When the entry program last counted a call at a copy or sync (CLOCK_MONOTONIC ns) once
/// its links began to drop (`drop`): [`gate::until_quiet`].
fn last_run(runs: &PerCpuArray<MapData, u64>, drop: &std::thread::JoinHandle<()>) -> u64 {
    super::gate::until_quiet(|| call_runs(runs), || drop.is_finished())
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
        let copies: Vec<&str> = FUNCS
            .iter()
            .filter(|f| f.category == Category::CudaMemcpy)
            .map(|f| f.name)
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
            super::give_filled_time(p, &before, &copies, |tb, added| {
                super::move_from_cpu(
                    tb,
                    added,
                    "cuda_memcpy",
                    "copies between the budget's copy and sync windows (estimated)",
                );
            });
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
    fn a_closer_looks_again_before_the_window_can_have_spent_its_share() {
        // 5 ms left, the calls costing half the time against a 2% refill: ~10.4 ms.
        assert_eq!(
            next_look(5e6, 0.5, 0.02).as_micros(),
            (5e6 / 0.48 / 1e3) as u128
        );
        // A storm: as soon as allowed; calls under the refill: as late as allowed.
        assert_eq!(next_look(1e5, 0.9, 0.02), LOOK_MIN);
        assert_eq!(next_look(5e6, 0.01, 0.02), LOOK_MAX);
        assert_eq!(next_look(5e6, 0.0, 0.02), LOOK_MAX);
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
