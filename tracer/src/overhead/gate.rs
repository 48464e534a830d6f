//! The gate that switches the CUDA launch probes on and off under `--max-overhead`: a token
//! bucket (`budget::Gate`) decided at each tick, and a watchdog thread that closes a window
//! within milliseconds when the bucket runs dry.

use std::{
    collections::HashMap,
    os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
    path::PathBuf,
    sync::{Arc, Condvar, Mutex},
    time::{Duration, Instant},
};

use aya::{
    maps::{Array, Map, MapData, PerCpuArray, PerCpuValues},
    Ebpf,
};
use tracer_common::cuda::{
    CLOSING_RUNS_SLOT, ENTRY_PROG, GATE_AT_MAP, GATE_FIRST_MAP, GATE_LAST_MAP, GATE_WAKE_MAP,
    LAUNCHER_SLOT, LAUNCHES_OFF_SLOT, LAUNCH_RUNS_MAP, OTHER_ENTRY_SLOT, OTHER_RET_SLOT,
    OUTER_LAUNCH_SLOT, RET_GEN_MAP, RET_PROG, STEADY_CALLS_SLOT, STEADY_ON_SLOT, STEADY_STEPS_SLOT,
    WINDOW_GEN_SLOT,
};

use super::{
    cap_to_lives, give_filled_time, scale_cuda, scale_launch_time, stats::own_map, stats_on,
    worst_cuda_thread, StatsOn,
};
use crate::{
    budget::{self, Gate, TickObs},
    cuda::table::FUNCS,
    probes::ktime_now,
    procfs,
    report::{
        model::overhead::{Overhead, ProbeSampling},
        ReportData,
    },
    uprobes::{close_all, Link, Uprobes},
};

/// The launch probes' links, switched on and off by the budget's gate: the main thread opens
/// a window at a tick (attaches the links and hands them to the watchdog); the watchdog
/// thread closes it (drops the links) as soon as it has spent its share of the bucket, so a
/// launch storm is cut off within milliseconds, not at the next tick. It sleeps until the
/// entry program wakes it (`GATE_AT_MAP`: a CPU's runs reached where the bucket may run dry,
/// [`arm`]), the gate stops (an eventfd: the stop waited up to `WATCH_SAFETY` for it, 6-25 ms
/// measured, now well under 1 ms), or [`WATCH_SAFETY`] passed; without the wake-up ring, it
/// checks every [`WATCH_EVERY`].
pub struct LaunchGate {
    gate: Gate,
    links: Vec<GateLink>,
    /// The previous tick: CLOCK_MONOTONIC ns (the clock of the BPF timestamps) and counts.
    last: Option<(u64, Counts)>,
    cost_per_hit: f64,
    entry_only: bool,
    trap: super::SharedTrapCost,
    calibrator: Option<super::Calibrator>,
    /// Set by `calibrate`, before the first link is added.
    uprobes: Option<Uprobes>,
    hits: Option<LaunchRuns>,
    /// When the window now open was opened (CLOCK_MONOTONIC ns), if in the current tick.
    opened_at: Option<u64>,
    watch: Option<Watch>,
    /// Launches per ns of wall time in the last window, and the cost of window closes so far.
    last_rate: f64,
    close_cost_ns: f64,
    /// How long the last window's links took to attach (ns), charged at the next tick.
    opening_ns: u64,
    /// Copies and syncs taken as a window's that were counted in an earlier tick (`tick_until`).
    steady_owed: u64,
    /// Probes of libraries left for a window that it could not attach (`take_failures`).
    failures: Vec<AttachFailure>,
    /// Libraries whose launch probes, attached before, a window could not attach again
    /// (`take_lost`).
    lost: Vec<PathBuf>,
    /// The launching threads' pace, read at each tick.
    launchers: Launchers,
    /// In `finish`: its last tick opens no window (attached as the trace ends, its links would
    /// only be dropped, and what it could not attach would miss the report).
    finishing: bool,
    /// The copy and sync probes were off for part of the tick (`CallGate`): the ticks'
    /// copies and syncs are not all counted.
    steady_unknown: bool,
}

const WATCH_EVERY: Duration = Duration::from_millis(2);
/// The latest a closed window is taken to end after the watchdog decided to close it (ns).
const CLOSE_GRACE_NS: u64 = 5_000_000;
/// The longest the watchdog sleeps on the wake-up ring with a window open: a wake-up missed
/// (a CPU already past the count armed) costs at most this. Polling every 2 ms instead, a
/// window open all trace long (a job whose launches stay under the budget: the data, transfer
/// and gpu demos) cost ~480 wake-ups and ~15 ms of CPU a second.
const WATCH_SAFETY: Duration = Duration::from_millis(25);
/// The fewest entry runs a CPU makes before it wakes the watchdog again: a check costs ~30 us.
const WAKE_STEP_MIN: u64 = 256;

/// The entry and return programs' runs at launch functions (`LAUNCH_RUNS_MAP`): what a window
/// costs. Their runs at the other functions are paid whether a window is open or not.
struct LaunchRuns {
    map: PerCpuArray<MapData, u64>,
}

impl LaunchRuns {
    fn open(ebpf: &Ebpf) -> anyhow::Result<LaunchRuns> {
        let data = own_map(ebpf, LAUNCH_RUNS_MAP)?;
        Ok(LaunchRuns {
            map: PerCpuArray::try_from(Map::PerCpuArray(data))?,
        })
    }

    /// `prog`'s (`ENTRY_PROG` or `RET_PROG`) launch runs so far on each possible CPU.
    fn per_cpu(&self, prog: &str) -> Vec<u64> {
        let slot = u32::from(prog == RET_PROG);
        self.map
            .get(&slot, 0)
            .map(|v| v.iter().copied().collect())
            .unwrap_or_default()
    }

    /// `prog`'s launch runs on all CPUs so far.
    fn get(&self, prog: &str) -> u64 {
        self.per_cpu(prog).iter().sum()
    }

    /// The traced threads that made the last launch on each CPU (pid_tgid), each once.
    fn launchers(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self
            .map
            .get(&LAUNCHER_SLOT, 0)
            .map(|v| v.iter().copied().filter(|&id| id != 0).collect())
            .unwrap_or_default();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// What the entry program counted in `slot` on all CPUs so far (`STEADY_CALLS_SLOT`...).
    fn slot(&self, slot: u32) -> u64 {
        self.map
            .get(&slot, 0)
            .map(|v| v.iter().sum())
            .unwrap_or_default()
    }
}

/// The launching threads' run time and run delay at the last tick, for the bucket's pace.
#[derive(Default)]
struct Launchers {
    last: HashMap<u64, (u64, u64)>,
}

impl Launchers {
    /// What a ns of CPU cost the launching threads `ids` (pid_tgid) since the last tick of
    /// `dt_ns`: the most any of them paid among those that ran a tenth of it or more (one that
    /// hardly ran says nothing of the pace), 1 where none did.
    fn stretch(&mut self, ids: &[u64], dt_ns: u64) -> f64 {
        let mut worst: f64 = 1.0;
        let mut next = HashMap::with_capacity(ids.len());
        for &id in ids {
            let Some(now) = procfs::schedstat((id >> 32) as u32, id as u32) else {
                continue;
            };
            if let Some(&(run0, delay0)) = self.last.get(&id) {
                let run = now.0.saturating_sub(run0);
                if run.saturating_mul(10) >= dt_ns {
                    worst = worst.max(budget::stretch(run, now.1.saturating_sub(delay0)));
                }
            }
            next.insert(id, now);
        }
        self.last = next;
        worst
    }
}

/// What a link was attached with, to attach it again at the next window.
struct GateLink {
    prog: &'static str,
    /// A runtime library's (libcudart): its launches call the driver's launch inside.
    outer: bool,
    path: PathBuf,
    /// File offsets and cookies.
    points: Vec<(u64, u64)>,
    /// Attached at least once. A library left for the next window (`remember`) is not yet.
    attached: bool,
}

/// A launch probe that a window could not attach: the library's file, the point's cookie (its
/// function) and why.
#[derive(Clone)]
pub struct AttachFailure {
    pub path: PathBuf,
    pub cookie: u64,
    pub prog: &'static str,
    pub error: String,
}

/// The links of `prog` to attach at a window's opening, the runtimes' first. A runtime launch
/// made while the driver's launch probe is on and its own is not yet looks like a direct driver
/// launch (the driver's launch inside it finds no runtime call to be nested in): on an H100,
/// with the driver's links first, ~20% of a PyTorch loop's launches (all through
/// cudaLaunchKernel) were counted as cuLaunchKernel calls. The other order leaves such a
/// launch counted once, at the runtime.
fn outer_first(links: &[GateLink], prog: &str) -> Vec<usize> {
    let of = |outer: bool| {
        links
            .iter()
            .enumerate()
            .filter(move |(_, l)| l.prog == prog && l.outer == outer)
            .map(|(i, _)| i)
    };
    of(true).chain(of(false)).collect()
}

/// Takes out of the entry links the points whose return probe this window could not attach, as
/// a library's first attach leaves them out (`cuda::attach_library`): a call entered with no
/// return probe would raise its thread's call depth with nothing to lower it, and hide its
/// later calls. The function is listed as not attached once, for its return probe.
fn skip_entries_without_returns(links: &mut [GateLink], failed: &[AttachFailure]) {
    for l in links.iter_mut().filter(|l| l.prog == ENTRY_PROG) {
        l.points.retain(|p| {
            !failed
                .iter()
                .any(|f| f.prog == RET_PROG && f.path == l.path && f.cookie == p.1)
        });
    }
}

/// Attaches a window's link `l`. A library that was probed before and now fails is taken to be
/// gone (unmapped, its file removed): its counts stay, and the next window tries again. One left
/// for a window and never probed is tried a point at a time, as a library's first attach is
/// (`cuda::attach_library`): a point the kernel refuses is dropped and recorded in `failures`,
/// where a failed group would have left every launch of the library unprobed without a word.
fn attach_link(
    ebpf: &mut Ebpf,
    u: &Uprobes,
    l: &mut GateLink,
    failures: &mut Vec<AttachFailure>,
    lost: &mut Vec<PathBuf>,
) -> Vec<Link> {
    let first = u.attach(ebpf, l.prog, &l.path, &l.points, None);
    let was = std::mem::replace(&mut l.attached, true);
    match first {
        Ok(links) => links,
        Err(_) if was => {
            if !lost.contains(&l.path) {
                lost.push(l.path.clone());
            }
            Vec::new()
        }
        Err(_) => {
            let mut made = Vec::new();
            l.points
                .retain(|&p| match u.attach(ebpf, l.prog, &l.path, &[p], None) {
                    Ok(links) => {
                        made.extend(links);
                        true
                    }
                    Err(e) => {
                        failures.push(AttachFailure {
                            path: l.path.clone(),
                            cookie: p.1,
                            prog: l.prog,
                            error: format!("{e:#}"),
                        });
                        false
                    }
                });
            made
        }
    }
}

/// Orders a window's entry links, attached runtimes first, for its close: a `Vec` drops front
/// to back, the driver's first (see `outer_first`). Each drops on a thread of its own, so the
/// kernel may take them off in another order: no launch is counted from the watchdog's
/// decision on (`LAUNCHES_OFF_SLOT`), which is what keeps a runtime launch from being counted
/// at the driver then. `entries` holds the runtimes' links and then the driver's, each in
/// attach order.
fn outer_last(entries: &mut [Link]) {
    if !close_runtime_first() {
        entries.reverse();
    }
}

/// GPUTRACE_CLOSE_RUNTIME_FIRST=1: windows drop the runtimes' launch links before the
/// driver's, the order the kernel may take them off in anyway, so that a test can show it
/// does not matter (without `LAUNCHES_OFF_SLOT` a storm then counted 18,537 and 56,894 of its
/// runtime launches at the driver in two runs).
fn close_runtime_first() -> bool {
    static SET: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SET.get_or_init(|| std::env::var_os("GPUTRACE_CLOSE_RUNTIME_FIRST").is_some())
}

/// What the main thread and the watchdog share.
#[derive(Default)]
struct Window {
    /// Entry links first: dropped in this order, so a call inside still finds its return probe.
    /// The driver's entry links come before the runtime's (`outer_last`).
    links: Vec<Link>,
    ret_links: Vec<Link>,
    /// The kernel's statistics, on from the window's opening to its first tick that finds the
    /// launch programs timed or no launch (and on again at a tick of launches none of which
    /// were timed; a storm's window closes before its first tick): they time the launch
    /// programs. Not for the rest of a long window (a job that launches under the budget keeps
    /// one open all trace): on, they cost every program run on the machine ~60-150 ns here,
    /// and the overhead family's sampled ticks time the programs then. The window is still
    /// priced at the traps and program means timed with them on: high by what they cost a
    /// hit, ~100 ns of ~1.5-2 us here (the report prices hits without them).
    stats: Option<StatsOn>,
    /// Bucket at the window's last tick, the entry program's run count then, and the time.
    tokens_ns: f64,
    base_runs: u64,
    base_at: Option<Instant>,
    cost_per_hit: f64,
    budget: f64,
    /// Set by the watchdog once the window's entry probes have stopped running
    /// (CLOCK_MONOTONIC ns).
    closed_at: Option<u64>,
    /// Set by the watchdog as it decides to close the window and switches launches off
    /// (`LAUNCHES_OFF_SLOT`), until the next window opens: no launch is counted after it, so
    /// the window's time ends there at the latest, even for a tick that comes before
    /// `closed_at`.
    decided_at: Option<u64>,
    /// Set by the watchdog as it takes the window's links to close them, until the next
    /// window opens: links of a library probed meanwhile are not the window's (`add`).
    closing: bool,
    /// How long the calls trapped during the watchdog's closes (ns) since the main thread last
    /// read it.
    closes_ns: u64,
    stop: bool,
    /// `GATE_AT_MAP`, where the main thread and the watchdog arm the entry program's wake-up,
    /// and the CPUs online (what is left of the bucket is shared among them).
    wake_at: Option<PerCpuArray<MapData, u64>>,
    online: usize,
}

/// Arms the entry program's wake-up where the window's share of the bucket may run dry at the
/// earliest: any CPU could make all the runs, so each CPU wakes the watchdog after its share of
/// what is left, counted from its own runs (a CPU that makes more of them wakes it early, and
/// it arms again). Not while no window is open: the watchdog may have just decided to close.
fn arm(w: &mut Window, hits: &LaunchRuns) {
    if w.links.is_empty() && w.ret_links.is_empty() {
        return;
    }
    let since = w.base_at.map_or(0, |b| b.elapsed().as_nanos() as u64);
    let (base_runs, cost, tokens, budget, online) =
        (w.base_runs, w.cost_per_hit, w.tokens_ns, w.budget, w.online);
    let Some(at) = w.wake_at.as_mut() else {
        return;
    };
    let runs = hits.per_cpu(ENTRY_PROG);
    let spent = runs.iter().sum::<u64>().saturating_sub(base_runs) as f64 * cost;
    let left = (tokens + budget * since as f64 - spent).max(0.0);
    let step = wake_step(left, cost, online);
    let ats: Vec<u64> = runs.iter().map(|n| n + step).collect();
    let set = PerCpuValues::try_from(ats)
        .ok()
        .is_some_and(|v| at.set(0, v, 0).is_ok());
    if !set {
        // The watchdog then checks every WATCH_SAFETY only.
        w.wake_at = None;
    }
}

/// Runs per CPU before a wake-up: `left_ns` of the bucket at `cost_per_hit` a run, shared by
/// `cpus`.
fn wake_step(left_ns: f64, cost_per_hit: f64, cpus: usize) -> u64 {
    let runs = left_ns / cost_per_hit.max(1.0) / cpus.max(1) as f64;
    (runs as u64).max(WAKE_STEP_MIN)
}

fn disarm(w: &mut Window) {
    let Some(at) = w.wake_at.as_mut() else {
        return;
    };
    if let Some(zeros) = per_cpu_zeros() {
        let _ = at.set(0, zeros, 0);
    }
}

/// Waits until the entry program wakes the watchdog, the gate stops (`stop`, an eventfd; -1
/// for none) or `timeout` passes, and empties the ring.
fn wait_wake(ring: &mut aya::maps::RingBuf<MapData>, stop: RawFd, timeout: Duration) {
    let mut fds = [ring.as_raw_fd(), stop].map(|fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    });
    // SAFETY: valid pollfds for the call (poll skips a negative fd).
    unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout.as_millis() as libc::c_int) };
    while ring.next().is_some() {}
}

/// An eventfd that the gate's stop writes to, so that the watchdog's wait ends at once.
fn stop_event() -> Option<OwnedFd> {
    // SAFETY: plain syscall; the descriptor, when valid, is owned from here.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Zeros for a per-CPU u64 slot, one per possible CPU.
fn per_cpu_zeros() -> Option<PerCpuValues<u64>> {
    let n = aya::util::nr_cpus().ok()?;
    PerCpuValues::try_from(vec![0u64; n]).ok()
}

/// The window, and what wakes the watchdog when one opens: it sleeps while none is open.
#[derive(Default)]
struct Shared {
    window: Mutex<Window>,
    opened: Condvar,
    /// Written at the stop ([`stop_event`]).
    stop: Option<OwnedFd>,
}

struct Watch {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        let links = match self.shared.window.lock() {
            Ok(mut w) => {
                w.stop = true;
                w.stats = None;
                let mut l = std::mem::take(&mut w.links);
                l.append(&mut std::mem::take(&mut w.ret_links));
                l
            }
            Err(_) => Vec::new(),
        };
        self.shared.opened.notify_all();
        if let Some(fd) = &self.shared.stop {
            let one = 1u64.to_ne_bytes();
            // SAFETY: 8 bytes from a live buffer to an eventfd this struct owns.
            unsafe { libc::write(fd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        close_all(links);
    }
}

#[derive(Clone, Copy, Default)]
struct Counts {
    /// The programs' runs at launch functions (`LaunchRuns`).
    entry_runs: u64,
    ret_runs: u64,
    /// The programs' runs at the other functions in traced threads (`OTHER_ENTRY_SLOT`...).
    other_entry_runs: u64,
    other_ret_runs: u64,
    /// Runs the kernel timed (while its statistics were on) and their time.
    entry_timed: u64,
    entry_ns: u64,
    ret_timed: u64,
    ret_ns: u64,
    /// The entry program's launch runs while launches were off (`CLOSING_RUNS_SLOT`).
    closing_runs: u64,
    /// The traced threads' outermost launches, copies and syncs, and copies and syncs
    /// inside windows (`STEADY_CALLS_SLOT`...).
    launches: u64,
    steady: u64,
    steady_on: u64,
    steps_on: u64,
}

fn counts(ebpf: &Ebpf, uprobes: Option<&Uprobes>, hits: Option<&LaunchRuns>) -> Counts {
    let (Some(u), Some(h)) = (uprobes, hits) else {
        return Counts::default();
    };
    let (entry_timed, entry_ns) = u.runs(ebpf, ENTRY_PROG);
    let (ret_timed, ret_ns) = u.runs(ebpf, RET_PROG);
    Counts {
        entry_runs: h.get(ENTRY_PROG),
        ret_runs: h.get(RET_PROG),
        entry_timed,
        entry_ns,
        ret_timed,
        ret_ns,
        closing_runs: h.slot(CLOSING_RUNS_SLOT),
        launches: h.slot(OUTER_LAUNCH_SLOT),
        steady: h.slot(STEADY_CALLS_SLOT),
        steady_on: h.slot(STEADY_ON_SLOT),
        steps_on: h.slot(STEADY_STEPS_SLOT),
        other_entry_runs: h.slot(OTHER_ENTRY_SLOT),
        other_ret_runs: h.slot(OTHER_RET_SLOT),
    }
}

/// Drops each link on a thread of its own, in order, 100 us apart: a link's drop takes its
/// consumers off first and then waits out a grace period (~40 ms here), and one after another
/// on one thread the last link's programs ran through every earlier link's wait (the runtime's
/// launch entries, through the driver's). Each thread returns how long after `started` its
/// drop returned.
fn drop_each(links: Vec<Link>, started: Instant) -> Vec<std::thread::JoinHandle<Duration>> {
    let mut threads = Vec::new();
    for (i, l) in links.into_iter().enumerate() {
        if i > 0 {
            std::thread::sleep(Duration::from_micros(100));
        }
        match std::thread::Builder::new()
            .name("gputrace-close".into())
            .spawn(move || {
                drop(l);
                started.elapsed()
            }) {
            Ok(t) => threads.push(t),
            // Without a thread, dropped here (the spawn's error gave the link back dropped).
            Err(_) => continue,
        }
    }
    threads
}

/// Waits until `prog` (the entry or the return program) stops running at launch functions
/// after the window's links of it began to drop (`drops`): [`until_quiet`].
fn runs_quiet(hits: &LaunchRuns, prog: &str, drops: &[std::thread::JoinHandle<Duration>]) {
    until_quiet(|| hits.get(prog), || drops.iter().all(|t| t.is_finished()));
}

/// Polls `count` (a program's runs) every 100 us once links of it began to drop, until it has
/// not moved in 300 us, or `dropped` (the drops returned), or 20 ms passed; returns when it
/// last moved (CLOCK_MONOTONIC ns; the start if it never did). A dropping link's program runs
/// on for a few ms: what it counts meanwhile is still the window's.
pub(super) fn until_quiet(mut count: impl FnMut() -> u64, dropped: impl Fn() -> bool) -> u64 {
    const QUIET: Duration = Duration::from_micros(300);
    const QUIET_MAX: Duration = Duration::from_millis(20);
    let start = Instant::now();
    let mut last = count();
    let mut last_at = ktime_now();
    let mut still = Instant::now();
    while start.elapsed() < QUIET_MAX && !dropped() {
        std::thread::sleep(Duration::from_micros(100));
        let now = count();
        if now != last {
            last = now;
            last_at = ktime_now();
            still = Instant::now();
        } else if still.elapsed() >= QUIET {
            break;
        }
    }
    last_at
}

/// Switches the counting of new launches off (a window is being closed) or on (its probes are
/// all on): `LAUNCHES_OFF_SLOT`.
fn set_launches_off(gen: &mut Array<MapData, u64>, off: bool) {
    let _ = gen.set(LAUNCHES_OFF_SLOT, u64::from(off), 0);
}

/// Raises `slot` of `RET_GEN_MAP`: the return probes' generation (0), the window's
/// (`WINDOW_GEN_SLOT`) or the copy and sync windows' (`CALL_GEN_SLOT`).
pub(super) fn raise_gen(gen: &mut Array<MapData, u64>, slot: u32) {
    let n = gen.get(&slot, 0).unwrap_or(0).wrapping_add(1);
    let _ = gen.set(slot, n, 0);
}

/// Raises the return probes' generation once a window's return probes are gone: a launch in
/// flight then lost its return, and the threads' call depths from before are not trusted
/// after it.
fn next_ret_gen(gen: &mut Option<Array<MapData, u64>>) {
    if let Some(g) = gen.as_mut() {
        raise_gen(g, 0);
    }
}

fn watchdog(
    multi: bool,
    hits: LaunchRuns,
    mut ring: Option<aya::maps::RingBuf<MapData>>,
    mut ret_gen: Option<Array<MapData, u64>>,
    shared: Arc<Shared>,
) {
    loop {
        {
            let Ok(w) = shared.window.lock() else { return };
            let Ok(w) = shared.opened.wait_while(w, |w| {
                !w.stop && w.links.is_empty() && w.ret_links.is_empty()
            }) else {
                return;
            };
            if w.stop {
                return;
            }
        }
        match ring.as_mut() {
            Some(r) => wait_wake(
                r,
                shared.stop.as_ref().map_or(-1, |f| f.as_raw_fd()),
                WATCH_SAFETY,
            ),
            None => std::thread::sleep(WATCH_EVERY),
        }
        let (links, rets) = {
            let Ok(mut w) = shared.window.lock() else {
                return;
            };
            if w.stop {
                return;
            }
            let Some(base_at) = w.base_at else { continue };
            if w.links.is_empty() && w.ret_links.is_empty() {
                continue;
            }
            let runs = hits.get(ENTRY_PROG);
            let spent = runs.saturating_sub(w.base_runs) as f64 * w.cost_per_hit;
            let since = base_at.elapsed().as_nanos() as u64;
            if !budget::must_close(w.tokens_ns, w.budget, since, spent) {
                arm(&mut w, &hits);
                continue;
            }
            disarm(&mut w);
            w.stats = None;
            w.closing = true;
            // The window ends here for every library at once: its links come off one by one,
            // in an order the kernel does not promise (`LAUNCHES_OFF_SLOT`).
            if let Some(g) = ret_gen.as_mut() {
                set_launches_off(g, true);
            }
            w.decided_at = Some(ktime_now());
            (
                std::mem::take(&mut w.links),
                std::mem::take(&mut w.ret_links),
            )
        };
        // Dropping a link takes its consumers off and then waits out a grace period (~40-100
        // ms here). A perf-event link leaves its breakpoint in until then, so the calls trap
        // with no program to count them for the whole drop (see `close_cost`). A uprobe_multi
        // link removes its breakpoints before the grace period: its calls trap for a few ms,
        // each running a program that counts it, and what is left is the stall of the
        // breakpoints' removal, unseen from here.
        //
        // The return links go once the entry programs have stopped running (their consumers
        // come off first in the entry links' drop, whose grace period then runs on), and a
        // launch in flight then has returned: a launch whose return probe went before its
        // return lost it, and with it its thread's call state (an H100 PyTorch loop counted 2
        // of 2,339 copies). Waiting for the entry links' whole drop instead kept every launch
        // trapping on the return breakpoint through that grace period (~40 ms a close here).
        // Each return link drops on a thread of its own too: dropped one after another, the
        // driver's return probe ran on every nested launch through the runtime's link's grace
        // period, 20,000-40,000 runs a close (~50 ms of a storm's time lost, against ~2 ms
        // with the drops side by side).
        let started = Instant::now();
        let entries = drop_each(links, started);
        runs_quiet(&hits, ENTRY_PROG, &entries);
        std::thread::sleep(Duration::from_micros(500));
        if let Ok(mut w) = shared.window.lock() {
            w.closed_at = Some(ktime_now());
        }
        let returns = drop_each(rets, started);
        runs_quiet(&hits, RET_PROG, &returns);
        let quiet = started.elapsed();
        let returns_dropped = returns.into_iter().filter_map(|t| t.join().ok()).max();
        // A call that lost its return anyway (a launch longer than the wait, or entry
        // consumers slow to come off) leaves a call state the next entries no longer trust.
        // Not once the next window has opened (the return links' drop can take longer than
        // the bucket's refill): raised then, it would cut a launch in flight there from the
        // driver launch inside it, which would count as a direct one. `reopen` raised it
        // before attaching instead.
        if let Ok(w) = shared.window.lock() {
            if w.closing {
                next_ret_gen(&mut ret_gen);
            }
        }
        let entries_dropped = entries.into_iter().filter_map(|t| t.join().ok()).max();
        // How long the calls may have trapped uncounted: a perf-event link's whole drop; a
        // uprobe_multi link's until its programs stopped running, which stands in for the
        // breakpoints' removal (the programs' runs meanwhile are counted, and charged again
        // here: at ~2-7 ms a close, a margin of the same size as the stall).
        let trapping = if multi {
            quiet
        } else {
            entries_dropped
                .max(returns_dropped)
                .unwrap_or_else(|| started.elapsed())
        };
        if let Ok(mut w) = shared.window.lock() {
            w.closes_ns += trapping.as_nanos() as u64;
        }
    }
}

/// What the CUDA probes at every function but the launches cost the traced threads between
/// counts `c0` and `c`, at `(entry, ret)` ns a hit. Only traced threads' runs: another job's
/// copies through the same library pay their own traps, not this trace's budget.
fn unsampled_cost(c0: &Counts, c: &Counts, (entry, ret): (f64, f64)) -> f64 {
    c.other_entry_runs.saturating_sub(c0.other_entry_runs) as f64 * entry
        + c.other_ret_runs.saturating_sub(c0.other_ret_runs) as f64 * ret
}

/// What the calls made while a window's links were being closed cost, uncounted (for
/// uprobe_multi links, a stand-in: see `watchdog`). Dropping a perf-event link takes its
/// program off at once, but the kernel then waits for a grace period (~100 ms
/// here) before it destroys the probe and removes the breakpoint, and every call meanwhile
/// traps with no program to count it: the entry trap, and the return trap too while the return
/// probe is still registered on the same breakpoint. Measured on a storm that recorded its own
/// call rate every 5 ms (BENCHMARKS.md), when the return links went after the entry links'
/// whole drop: the rate falls to ~20% from the moment the window closes until the entry links'
/// drop returns (~115 ms), and stops for ~5 ms while the breakpoint goes. The return links now
/// drop a millisecond or so after the entry links, so the calls trap until the later of the
/// two drops returns.
///
/// `trapping_ns`: how long the calls kept trapping (perf links: the longer drop; uprobe_multi
/// links: until the return programs stopped running); `rate`: launches
/// per ns of wall time in the window; `cost_per_hit`: what a probed call cost in the window
/// (traps and programs); `trap_ns`: the traps a call pays while the close is under way.
pub fn close_cost(trapping_ns: u64, rate: f64, cost_per_hit: f64, trap_ns: f64) -> f64 {
    if trapping_ns == 0 || rate <= 0.0 {
        return 0.0;
    }
    // The thread's own time per call: the window's time per call less what the probes added
    // (at least a tenth of it, should the probes' cost be overestimated).
    let per_call = 1.0 / rate;
    let own = (per_call - cost_per_hit).max(per_call / 10.0);
    // Each call then takes its own time plus the traps: the share of the close spent trapping.
    trapping_ns as f64 * trap_ns / (own + trap_ns)
}

impl LaunchGate {
    /// Measures the trap costs (again at each window the gate opens). Failure leaves the
    /// built-in constants, and a warning in the report.
    pub fn calibrate(&mut self, ebpf: &mut Ebpf, uprobes: &Uprobes, verbose: bool) {
        self.uprobes = Some(uprobes.clone());
        self.hits = LaunchRuns::open(ebpf).ok();
        if let Ok(c) = super::Calibrator::start(ebpf, uprobes, self.trap.clone()) {
            if verbose {
                let t = c.current();
                crate::note!(
                    "gputrace: uprobe trap {:.0} ns, uretprobe {:.0} ns on this machine",
                    t.entry_ns,
                    t.ret_ns
                );
            }
            self.calibrator = Some(c);
        }
    }

    pub fn new(budget: f64, entry_only: bool, trap: super::SharedTrapCost) -> LaunchGate {
        let t = super::calibrate::current(&trap);
        LaunchGate {
            gate: Gate::new(budget),
            links: Vec::new(),
            last: None,
            cost_per_hit: t.per_call(entry_only),
            entry_only,
            trap,
            calibrator: None,
            uprobes: None,
            hits: None,
            opened_at: None,
            watch: None,
            last_rate: 0.0,
            close_cost_ns: 0.0,
            opening_ns: 0,
            steady_owed: 0,
            failures: Vec::new(),
            lost: Vec::new(),
            finishing: false,
            launchers: Launchers::default(),
            steady_unknown: false,
        }
    }

    /// Whether probes on function `fid` are switched by the gate.
    pub fn gated(&self, fid: usize) -> bool {
        self.gate.samples() && FUNCS.get(fid).is_some_and(|f| f.is_launch())
    }

    fn start_watch(&mut self, ebpf: &Ebpf) -> Option<&Arc<Shared>> {
        if self.watch.is_none() {
            // Measured after this gate was made: the first window works with it.
            let t = super::calibrate::current(&self.trap);
            self.cost_per_hit = t.per_call(self.entry_only);
            let hits = LaunchRuns::open(ebpf).ok()?;
            // Both or neither: without the ring the watchdog polls.
            let ring = own_map(ebpf, GATE_WAKE_MAP)
                .ok()
                .and_then(|d| aya::maps::RingBuf::try_from(Map::RingBuf(d)).ok());
            let wake_at = ring
                .as_ref()
                .and_then(|_| own_map(ebpf, GATE_AT_MAP).ok())
                .and_then(|d| PerCpuArray::try_from(Map::PerCpuArray(d)).ok());
            let ring = ring.filter(|_| wake_at.is_some());
            let ret_gen = gen_map(ebpf);
            let multi = self
                .uprobes
                .as_ref()
                .is_some_and(|u| u.why_perf().is_none());
            let shared = Arc::new(Shared {
                window: Mutex::new(Window {
                    tokens_ns: self.gate.tokens_ns(),
                    base_runs: counts(ebpf, self.uprobes.as_ref(), self.hits.as_ref()).entry_runs,
                    base_at: Some(Instant::now()),
                    cost_per_hit: self.cost_per_hit,
                    budget: self.gate.budget(),
                    wake_at,
                    online: aya::util::online_cpus().map_or(1, |c| c.len()),
                    ..Window::default()
                }),
                opened: Condvar::new(),
                stop: stop_event(),
            });
            let s = shared.clone();
            let thread = std::thread::Builder::new()
                .name("gputrace-budget".into())
                .spawn(move || watchdog(multi, hits, ring, ret_gen, s))
                .ok()?;
            self.watch = Some(Watch {
                shared,
                thread: Some(thread),
            });
        }
        self.watch.as_ref().map(|w| &w.shared)
    }

    /// Whether launch probes attached now would join an open window: not while the gate is
    /// closed or its window is being closed. Attached and dropped at once, they would run alone
    /// until their drop returns (tens of ms): a driver's probes, with the runtime's gone,
    /// count the runtime's launches as the driver's.
    pub fn attaches_now(&self) -> bool {
        if !self.gate.samples() {
            return true;
        }
        if !self.gate.is_open() {
            return false;
        }
        self.watch.as_ref().is_none_or(|w| {
            w.shared
                .window
                .lock()
                .is_ok_and(|w| w.closed_at.is_none() && !w.closing)
        })
    }

    /// Records launch probes left unattached while no window takes them (`attaches_now`): they
    /// go on at the next window.
    pub fn remember(
        &mut self,
        prog: &'static str,
        outer: bool,
        path: PathBuf,
        points: Vec<(u64, u64)>,
    ) {
        self.links.push(GateLink {
            prog,
            outer,
            path,
            points,
            attached: false,
        });
    }

    /// Whether launch probes on `path` were left for the next window and not yet attached.
    pub fn waits_for_window(&self, path: &std::path::Path) -> bool {
        self.links.iter().any(|l| !l.attached && l.path == path)
    }

    /// The probes of libraries left for a window (`remember`) that the window could not attach,
    /// taken out of the gate: the library's report lists them as not attached.
    pub fn take_failures(&mut self) -> Vec<AttachFailure> {
        std::mem::take(&mut self.failures)
    }

    /// The libraries whose launch probes a window could not attach again since the last call
    /// (each once): their launches are not seen in the windows from then on.
    pub fn take_lost(&mut self) -> Vec<PathBuf> {
        std::mem::take(&mut self.lost)
    }

    /// Records launch probes just attached and hands their links to the watchdog (or drops
    /// them at once while the gate is closed).
    /// `outer`: the library is a CUDA runtime (its launches call the driver's inside).
    pub fn add(
        &mut self,
        ebpf: &Ebpf,
        prog: &'static str,
        outer: bool,
        path: PathBuf,
        points: Vec<(u64, u64)>,
        links: Vec<Link>,
    ) {
        self.remember(prog, outer, path, points);
        if let Some(l) = self.links.last_mut() {
            l.attached = true;
        }
        if !self.gate.is_open() {
            close_all(links);
            return;
        }
        // The gate's clock starts with its first probe: counts seen before the first tick
        // belong to a window like any other (they are scaled like any other).
        if self.last.is_none() {
            self.last = Some((
                ktime_now(),
                counts(ebpf, self.uprobes.as_ref(), self.hits.as_ref()),
            ));
        }
        if let Some(shared) = self.start_watch(ebpf).cloned() {
            let mut refused = None;
            if let Ok(mut w) = shared.window.lock() {
                // A window being closed takes no more links: the watchdog has taken the ones it
                // drops, and these would stay on, counted by no window and priced by none (a
                // runtime's launches, its own probes gone, were counted at the driver's: 90%
                // of a window's, when the runtime loaded the driver at its first launch and the
                // window closed before the driver was probed). They go on at the next window.
                if w.closed_at.is_some() || w.closing {
                    refused = Some(links);
                } else {
                    if w.stats.is_none() {
                        w.stats = Some(stats_on());
                    }
                    if prog == RET_PROG {
                        w.ret_links.extend(links);
                    } else if outer {
                        w.links.extend(links);
                    } else {
                        // Dropped before the runtime's (`outer_last`).
                        w.links.splice(0..0, links);
                    }
                    // The first window, opened as the probes attach.
                    if let Some(h) = &self.hits {
                        arm(&mut w, h);
                    }
                }
            }
            shared.opened.notify_one();
            if let Some(links) = refused {
                close_all(links);
            }
        }
    }

    /// One tick: observe, decide, open a window if the bucket allows. `calls_exact`: the copy
    /// and sync probes were on all tick long.
    pub fn tick(&mut self, ebpf: &mut Ebpf, calls_exact: bool) {
        self.steady_unknown = !calls_exact;
        self.tick_until(ebpf, ktime_now());
    }

    /// What a hit of the entry and of the return program costs (the programs' run time and
    /// the traps), and a call's traps: the copy and sync gate's price too.
    pub fn hit_costs(&self, ebpf: &Ebpf) -> ((f64, f64), f64) {
        let c = counts(ebpf, self.uprobes.as_ref(), self.hits.as_ref());
        let trap = super::calibrate::current(&self.trap);
        (self.measured_cost(&c), trap.per_call(self.entry_only))
    }

    /// What an entry and a return hit cost, from the programs' run times over the whole trace
    /// (steady per hit) and the traps as last measured.
    fn measured_cost(&self, c: &Counts) -> (f64, f64) {
        let trap = super::calibrate::current(&self.trap);
        let entry = budget::cost_per_hit(c.entry_ns, c.entry_timed, trap.entry_ns);
        let ret = if self.entry_only {
            0.0
        } else {
            budget::cost_per_hit(c.ret_ns, c.ret_timed, trap.ret_ns)
        };
        (entry, ret)
    }

    /// A tick that ends at `now` (CLOCK_MONOTONIC ns): the last one ends when the target did.
    fn tick_until(&mut self, ebpf: &mut Ebpf, now: u64) {
        if !self.gate.samples() || self.links.is_empty() {
            return;
        }
        let c = counts(ebpf, self.uprobes.as_ref(), self.hits.as_ref());
        let Some((t0, c0)) = self.last.replace((now, c)) else {
            return;
        };
        let hits = c.entry_runs.saturating_sub(c0.entry_runs);
        let ret_hits = c.ret_runs.saturating_sub(c0.ret_runs);
        // The window's runs: those made while launches were off (its close under way, or the
        // next window's probes going on) are paid, but counted no launch.
        let closing = c.closing_runs.saturating_sub(c0.closing_runs).min(hits);
        let win_hits = hits - closing;
        let (entry, ret) = self.measured_cost(&c);
        self.cost_per_hit = entry + ret;
        let trap = super::calibrate::current(&self.trap);
        // The return probe also fires alone while the links are attached or detached (each
        // takes ms): calls that pay for it without being counted.
        let transition_ns = if self.entry_only {
            0.0
        } else {
            ret_hits.saturating_sub(hits) as f64 * ret
        };
        // The probes at the other CUDA functions (copies, syncs, allocations) are not these
        // windows' (the copies and syncs have their own, `CallGate`), and take from the same
        // threads' time: the launch windows get what they leave of the budget. A loop of 100 launches and two copies a step, on a host whose
        // traps cost ~1.3 us, paid ~2.9% of its time for the copies alone, and its windows
        // spent the whole 2% budget besides.
        let unsampled_ns = unsampled_cost(&c0, &c, (entry, ret));
        let now = now.max(t0);
        let dt = now - t0;
        let (closed_at, decided_at, closes_ns) = self
            .watch
            .as_ref()
            .and_then(|w| {
                w.shared.window.lock().ok().map(|mut w| {
                    (
                        w.closed_at.take(),
                        w.decided_at,
                        std::mem::take(&mut w.closes_ns),
                    )
                })
            })
            .unwrap_or((None, None, 0));
        // Open during this tick (the watchdog may have closed it since).
        let was_open = self.gate.is_open();
        let on = if !was_open {
            0
        } else {
            let mut from = self.opened_at.unwrap_or(t0).max(t0);
            // Launches start while the entry probes are still being attached: a window opened
            // at the last tick starts at its first launch if that came first.
            if self.opened_at.is_some() {
                if let (Some(first), Some(last)) = (gate_first(ebpf), gate_last(ebpf)) {
                    if first < from && win_hits > 1 && last > first {
                        from = first
                            .saturating_sub((last - first) / (win_hits - 1))
                            .max(t0);
                    }
                }
            }
            // A closed window ends with its last counted launch (plus one gap between
            // launches), and at the watchdog's decision at the latest: no launch is counted
            // from there on (`LAUNCHES_OFF_SLOT`), though the breakpoints go ms later, so a
            // tick between the decision and the close (`closed_at`) ends the window there too.
            // At most `CLOSE_GRACE_NS` after the close: dropping the links stalls the target
            // (the breakpoints' removal), for ~100 ms here at times, and a window that took the
            // stall in would read a rate a fraction of the true one (a nested runtime's storm
            // of 2M launches was estimated at 0.23-0.34M).
            let end = match closed_at {
                Some(closed) => match gate_last(ebpf) {
                    Some(last) if last > from && win_hits > 0 => (last + (last - from) / win_hits)
                        .min(now)
                        .min(closed + CLOSE_GRACE_NS),
                    _ => closed,
                },
                None => now,
            };
            decided_at.map_or(end, |d| end.min(d)).saturating_sub(from)
        };
        let still_open = was_open && closed_at.is_none();
        // The launches as the report counts them (outermost, traced processes only). With
        // `--cuda-entry-only` the entry program keeps no call depth and counts no steps: every
        // launch entry (an untraced process's too) and no copies, so the time rates alone fill
        // in between windows. Then the copies and syncs inside the window's part of the tick
        // and over the rest.
        let launches = if self.entry_only {
            win_hits
        } else {
            c.launches.saturating_sub(c0.launches)
        };
        // A copy is counted at its entry and taken as the window's at the next launch, which
        // may come in the next tick: that tick then has more of the window's copies than it
        // counted, and the excess is taken from the next ticks' off ones (`steady_owed`), so
        // that the trace's total stays the copies counted.
        let steady = c.steady.saturating_sub(c0.steady);
        let steady_on = c.steady_on.saturating_sub(c0.steady_on);
        let taken = steady_on + self.steady_owed;
        self.steady_owed = taken.saturating_sub(steady);
        let steady_off = steady.saturating_sub(taken);
        if was_open && on > 0 && win_hits > 0 {
            self.last_rate = win_hits as f64 / on as f64;
        }
        // A window's opening is charged whole: the launching thread stalls while the
        // breakpoints go in (a storm made 7 launches in the 6.7 ms its return links took to
        // attach, against ~1,100 a ms around it). The few return-only and off-launch runs in
        // it are charged again (`transition_ns`, `closing`); the first window's opening, at
        // the library's attach, is not charged.
        let close_ns = close_cost(
            closes_ns,
            self.last_rate,
            self.cost_per_hit,
            trap.per_call(self.entry_only),
        ) + std::mem::take(&mut self.opening_ns) as f64;
        self.close_cost_ns += close_ns;
        let stretch = match &self.hits {
            Some(h) => self.launchers.stretch(&h.launchers(), dt),
            None => 1.0,
        };
        let open = self.gate.tick(TickObs {
            dt_ns: dt,
            on_ns: if was_open { on } else { 0 },
            sampled_hits: if was_open { win_hits } else { 0 },
            cost_per_hit_ns: self.cost_per_hit,
            trap_ns: trap.per_call(self.entry_only),
            other_cost_ns: transition_ns
                + unsampled_ns
                + close_ns
                + if was_open {
                    closing as f64 * self.cost_per_hit
                } else {
                    hits as f64 * self.cost_per_hit
                },
            closed: closed_at.is_some(),
            launches,
            steady_on,
            steady_off,
            steps_on: c.steps_on.saturating_sub(c0.steps_on),
            stretch,
            steady_unknown: self.steady_unknown,
        });
        self.opened_at = None;
        if open && !still_open && !self.finishing {
            self.reopen(ebpf, c.entry_runs);
        } else if still_open {
            // Still open: the watchdog measures from this tick with the bucket as it is now.
            if let Some(w) = &self.watch {
                if let Ok(mut w) = w.shared.window.lock() {
                    // Once the launch programs have timed runs to price the window by, or while
                    // no CUDA call comes (a window opened at the attach of a job that has not
                    // started, or never calls); on again for calls while none was ever timed.
                    let timed = c.entry_timed > 0 && (self.entry_only || c.ret_timed > 0);
                    if timed || win_hits == 0 {
                        w.stats = None;
                    } else if w.stats.is_none() {
                        w.stats = Some(stats_on());
                    }
                    w.tokens_ns = self.gate.tokens_ns();
                    w.base_runs = c.entry_runs;
                    w.base_at = Some(Instant::now());
                    w.cost_per_hit = self.cost_per_hit;
                    if let Some(h) = &self.hits {
                        arm(&mut w, h);
                    }
                }
            }
        }
    }

    fn reopen(&mut self, ebpf: &mut Ebpf, runs: u64) {
        // The traps cost what the host lets them cost now: measured again before each window
        // (not in it: the launches' traps on the other CPU would slow ours).
        if let Some(c) = self.calibrator.as_mut() {
            c.sample(ebpf);
        }
        reset_gate_first(ebpf);
        let mut gen = gen_map(ebpf);
        if let Some(g) = gen.as_mut() {
            // The window generation, before the window's launch probes go on; and the call
            // states from before this window are not trusted in it (the last close's watchdog
            // may still be dropping its return links, and then leaves that generation).
            raise_gen(g, WINDOW_GEN_SLOT);
            raise_gen(g, 0);
        }
        let mut entries = Vec::new();
        let mut rets = Vec::new();
        // Return probes first, as at the first attach: a call entered in between would
        // otherwise raise its thread's depth with no return to lower it.
        let failed_before = self.failures.len();
        let opening = Instant::now();
        for prog in [RET_PROG, ENTRY_PROG] {
            let Some(u) = self.uprobes.clone() else { break };
            if prog == ENTRY_PROG {
                skip_entries_without_returns(&mut self.links, &self.failures[failed_before..]);
            }
            for i in outer_first(&self.links, prog) {
                let made = attach_link(
                    ebpf,
                    &u,
                    &mut self.links[i],
                    &mut self.failures,
                    &mut self.lost,
                );
                if prog == RET_PROG {
                    rets.extend(made);
                } else {
                    entries.extend(made);
                }
            }
        }
        self.opening_ns = opening.elapsed().as_nanos() as u64;
        self.links.retain(|l| !l.points.is_empty());
        // The window starts once the entry probes are all attached (the return probes, attached
        // first, fired alone meanwhile: transition cost), and with it the launches' counting
        // (under the window's lock below, where the watchdog decides whether the last close
        // still raises the return generation).
        self.opened_at = Some(ktime_now());
        outer_last(&mut entries);

        let tokens = self.gate.tokens_ns();
        let cost = self.cost_per_hit;
        if let Some(shared) = self.start_watch(ebpf).cloned() {
            if let Ok(mut w) = shared.window.lock() {
                w.links = entries;
                w.ret_links = rets;
                w.stats = Some(stats_on());
                w.tokens_ns = tokens;
                w.base_runs = runs;
                w.base_at = Some(Instant::now());
                w.cost_per_hit = cost;
                w.closed_at = None;
                w.decided_at = None;
                w.closing = false;
                if let Some(g) = gen.as_mut() {
                    set_launches_off(g, false);
                }
                if let Some(h) = &self.hits {
                    arm(&mut w, h);
                }
            }
            shared.opened.notify_one();
        }
    }

    /// The trace has ended: the trap costs get the rounds a trace without windows lacks, before
    /// any family prices its hits. Only while no launch probe is on, or once the traced
    /// processes are all gone (`all_exited`): a round beside launches that trap on the other
    /// CPU reads them slow, which is why a window's round is taken before it opens.
    /// `launch_probed`: some library's launch functions were probed (at all).
    pub fn ended(&mut self, ebpf: &Ebpf, launch_probed: bool, all_exited: bool) {
        let probes_on = launch_probed && (!self.gate.samples() || self.gate.is_open());
        if probes_on && !all_exited {
            return;
        }
        if let Some(c) = self.calibrator.as_mut() {
            c.top_up(ebpf, 3);
        }
    }

    /// The last partial tick, once: as the trace's window ends (from then the probes count
    /// nothing: `account::stopped` in the eBPF crate), or at `finish`. `ended`: when the last
    /// traced process exited, if all did (the time after it launched nothing).
    pub fn last_tick(&mut self, ebpf: &mut Ebpf, ended: Option<u64>) {
        if self.finishing {
            return;
        }
        let now = ktime_now();
        self.finishing = true;
        self.tick_until(ebpf, ended.map_or(now, |e| e.min(now)));
    }

    /// Last partial tick, then the scaled counts and the sampling note in the report. `ended`:
    /// when the last traced process exited, if all did (the time after it launched nothing).
    pub fn finish(&mut self, ebpf: &mut Ebpf, data: &mut ReportData, ended: Option<u64>) {
        self.last_tick(ebpf, ended);
        if let Some(c) = self.calibrator.as_mut() {
            let t = c.in_trace();
            self.gate.set_final_trap(t.per_call(self.entry_only));
            c.close();
        }
        if let Some(mut g) = self.watch.as_ref().and_then(|_| gen_map(ebpf)) {
            set_launches_off(&mut g, true);
        }
        self.watch = None;
        // A gate that never samples (`--max-overhead 100%`) never ticks: its cost per hit was
        // still the built-in constants' (3 us), which put a 1M-launch storm's thread at 117%
        // of its time where the programs' measured costs gave 49%.
        if !self.gate.samples() {
            let c = counts(ebpf, self.uprobes.as_ref(), self.hits.as_ref());
            let (entry, ret) = self.measured_cost(&c);
            self.cost_per_hit = entry + ret;
        }
        // The closes' uncounted traps were paid by the launching thread.
        let worst = worst_cuda_thread(&data.report, self.cost_per_hit, self.close_cost_ns);
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
        // What the probes add inside a timed launch: the return's trap and program (the
        // entry's trap, and its program up to the clock read, come before the call's start).
        let (_, inside_ns) =
            self.measured_cost(&counts(ebpf, self.uprobes.as_ref(), self.hits.as_ref()));
        let mut seen = 0u64;
        for p in data.report.processes.iter_mut() {
            let Some(c) = p.cuda.as_mut() else { continue };
            for a in c.api.iter_mut() {
                if launch_names.contains(&a.function.as_str()) {
                    seen += a.count;
                }
            }
            let before = c.clone();
            scale_cuda(c, &launch_names, e.scale, inside_ns);
            let lives: HashMap<u32, u64> = p
                .threads
                .iter()
                .filter_map(|t| t.time.as_ref().map(|tb| (t.tid, tb.alive_ns)))
                .collect();
            cap_to_lives(c, &launch_names, |tid| lives.get(&tid).copied());
            // The time breakdowns take the time the filled-in launches added, process and
            // thread each by their own launch rows.
            give_filled_time(p, &before, &launch_names, scale_launch_time);
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
            filled_by_calls: e.by_calls,
            no_bound: e.no_bound.map(|n| n.says().to_string()),
        });
    }
}

/// `RET_GEN_MAP` of the loaded object.
fn gen_map(ebpf: &Ebpf) -> Option<Array<MapData, u64>> {
    own_map(ebpf, RET_GEN_MAP)
        .ok()
        .and_then(|d| Array::try_from(Map::Array(d)).ok())
}

/// The per-CPU launch timestamps of `map` that are set (CLOCK_MONOTONIC ns).
fn gate_times(ebpf: &Ebpf, map: &str) -> Vec<u64> {
    ebpf.map(map)
        .and_then(|m| PerCpuArray::<_, u64>::try_from(m).ok())
        .and_then(|m| m.get(&0, 0).ok())
        .map(|v| v.iter().copied().filter(|t| *t > 0).collect())
        .unwrap_or_default()
}

/// The first launch entry on any CPU since [`reset_gate_first`].
fn gate_first(ebpf: &Ebpf) -> Option<u64> {
    gate_times(ebpf, GATE_FIRST_MAP).into_iter().min()
}

fn reset_gate_first(ebpf: &mut Ebpf) {
    let Some(m) = ebpf.map_mut(GATE_FIRST_MAP) else {
        return;
    };
    let Ok(mut map) = PerCpuArray::<_, u64>::try_from(m) else {
        return;
    };
    if let Some(zeros) = per_cpu_zeros() {
        let _ = map.set(0, zeros, 0);
    }
}

/// The latest launch entry on any CPU.
fn gate_last(ebpf: &Ebpf) -> Option<u64> {
    gate_times(ebpf, GATE_LAST_MAP).into_iter().max()
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::{
        close_cost, outer_first, skip_entries_without_returns, unsampled_cost, wake_step,
        AttachFailure, Counts, GateLink, WAKE_STEP_MIN,
    };
    use tracer_common::cuda::{ENTRY_PROG, RET_PROG};

    #[test]
    fn the_other_functions_probes_are_priced_apart_from_the_launches() {
        let c0 = Counts {
            entry_runs: 100,
            ret_runs: 150,
            other_entry_runs: 1_000,
            other_ret_runs: 1_000,
            ..Counts::default()
        };
        // 500 launch entries and 600 launch returns, beside 400 copies' entries and 300 of
        // their returns (copies still in flight): the launches are the windows' own cost.
        let c = Counts {
            entry_runs: 600,
            ret_runs: 750,
            other_entry_runs: 1_400,
            other_ret_runs: 1_300,
            ..Counts::default()
        };
        assert_eq!(
            unsampled_cost(&c0, &c, (1_000.0, 2_000.0)),
            400_000.0 + 600_000.0
        );
        // Counters read out of step never make a negative cost.
        assert_eq!(unsampled_cost(&c, &c0, (1_000.0, 2_000.0)), 0.0);
    }

    fn link(prog: &'static str, outer: bool, path: &str, cookies: &[u64]) -> GateLink {
        GateLink {
            prog,
            outer,
            path: PathBuf::from(path),
            points: cookies.iter().map(|&c| (c * 16, c)).collect(),
            attached: false,
        }
    }

    #[test]
    fn an_entry_whose_return_failed_is_left_out_of_the_window() {
        let mut links = vec![
            link(RET_PROG, false, "/lib/libcuda.so.1", &[1, 2]),
            link(ENTRY_PROG, false, "/lib/libcuda.so.1", &[1, 2]),
            link(ENTRY_PROG, true, "/lib/libcudart.so.12", &[2]),
        ];
        let failed = [AttachFailure {
            path: PathBuf::from("/lib/libcuda.so.1"),
            cookie: 2,
            prog: RET_PROG,
            error: "refused".into(),
        }];
        skip_entries_without_returns(&mut links, &failed);
        assert_eq!(
            links[0].points,
            vec![(16, 1), (32, 2)],
            "return links untouched"
        );
        assert_eq!(links[1].points, vec![(16, 1)]);
        assert_eq!(links[2].points, vec![(32, 2)], "another library's point");
        // An entry's own failure takes nothing out.
        let entry_failed = [AttachFailure {
            prog: ENTRY_PROG,
            cookie: 1,
            ..failed[0].clone()
        }];
        skip_entries_without_returns(&mut links, &entry_failed);
        assert_eq!(links[1].points, vec![(16, 1)]);
    }

    #[test]
    fn windows_attach_the_runtimes_first() {
        let links = vec![
            link(ENTRY_PROG, false, "/lib/libcuda.so.1", &[1]),
            link(RET_PROG, true, "/lib/libcudart.so.12", &[2]),
            link(ENTRY_PROG, true, "/lib/libcudart.so.12", &[2]),
        ];
        assert_eq!(outer_first(&links, ENTRY_PROG), vec![2, 0]);
        assert_eq!(outer_first(&links, RET_PROG), vec![1]);
    }

    #[test]
    fn each_cpu_wakes_the_watchdog_after_its_share_of_the_bucket() {
        // 20 ms left at 1.5 us a launch is 13,333 launches; on 2 CPUs each wakes it after
        // half of them, so the bucket cannot run dry before one of them has.
        assert_eq!(wake_step(20e6, 1500.0, 2), 6666);
        assert_eq!(wake_step(20e6, 1500.0, 1), 13333);
        // Nearly dry, or nothing known: a few hundred runs, not a wake-up per launch.
        assert_eq!(wake_step(0.0, 1500.0, 64), WAKE_STEP_MIN);
        assert_eq!(wake_step(20e6, 0.0, 0), 20_000_000);
    }

    #[test]
    fn a_close_costs_the_traps_of_the_calls_made_meanwhile() {
        // In the window a call took 2 us, 1 of it the probes': 1 us of own time, and a 1 us
        // trap during the close: half of the 100 ms the calls trapped.
        let c = close_cost(100_000_000, 0.5e-3, 1000.0, 1000.0);
        assert!((c - 50_000_000.0).abs() < 1.0, "{c}");
        // The storm measured in BENCHMARKS.md: 270k calls/s in the window at 2.66 us of probes
        // each, entry and return traps 1.95 us, calls trapping for 117 ms: ~76 ms (its own
        // rate record showed ~90 ms lost, ~7 ms of it the breakpoint's removal).
        let c = close_cost(117_000_000, 270e-6, 2660.0, 1950.0);
        assert!((c - 76e6).abs() < 2e6, "{c}");
        // Rare launches: next to nothing.
        assert!(close_cost(200_000_000, 1e-9, 1000.0, 1000.0) < 300_000.0);
        assert_eq!(close_cost(0, 1e-3, 1000.0, 1000.0), 0.0);
        assert_eq!(close_cost(200_000_000, 0.0, 1000.0, 1000.0), 0.0);
        // Probe costs above the window's time per call leave a tenth of it as own time.
        let c = close_cost(100_000_000, 1e-3, 5000.0, 1000.0);
        assert!((c - 100e6 * 1000.0 / 1100.0).abs() < 1.0, "{c}");
    }
}
