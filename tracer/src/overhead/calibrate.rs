//! What one uprobe and one uretprobe hit cost on this machine, now: measured at startup by
//! probing a function in gputrace itself (`push %rbp` prologue, as the CUDA libraries' entry
//! points have) with empty programs and timing calls to it.
//!
//! The kernel's BPF statistics time a program's own run, not the breakpoint trap around it, and
//! that trap is most of a hit's cost. It varies by machine and by the host's mood (the same VM
//! measured 2.4 us and 3.0 us per entry+return hit on different days), and the budget's scaled
//! counts are sensitive to it: in a launch storm the probes are ~3/4 of a window's time, so a
//! cost 20% off puts the workload's own time in the window 60% off.

use std::sync::{Arc, Mutex};

use anyhow::{bail, Context, Result};
use aya::Ebpf;
use tracer_common::overhead::{CALIB_ENTRY_PROG, CALIB_RET_PROG};

use crate::{
    budget, procfs,
    uprobes::{Link, Uprobes},
};

/// Trap cost per hit outside the program, and where it came from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrapCost {
    /// With the kernel's BPF statistics on (as they are in the gate's windows, which these
    /// price): the part of the statistics' clock reads outside the timed run is in here.
    pub entry_ns: f64,
    pub ret_ns: f64,
    /// False: the built-in constants (calibration failed or was not possible).
    pub measured: bool,
    /// What the statistics themselves cost a program run (0 where not measured).
    pub stats: StatsCost,
}

/// The kernel's BPF statistics time each run between two `sched_clock` reads, which cost a
/// run on this VM ~60-150 ns while they are on (they are on a tenth of the trace or less:
/// `stats::sampled_tick`). Part of that falls inside the run time they report (an empty
/// program shows ~45 ns a run here), the rest outside it, where it looks like trap. Measured on
/// the empty calibration program.
///
/// A program's reported mean is used as its cost per hit whether or not the statistics were
/// on for the hit: what they put inside a run cannot be told from the call into the program,
/// which every hit pays. An untraced pipe ping-pong beside a trace (its programs' early
/// returns) paid ~30 ns per scheduler hit beyond the reported means (2026-11-25, median of
/// nine runs, -76..+125), the dispatch constant: taking the 45 ns out would under-price.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StatsCost {
    /// Run time the statistics report for an empty program.
    pub inside_ns: f64,
    /// What they cost a run outside the time they report, while on.
    pub outside_ns: f64,
}

/// Above this per run, a measurement of the statistics is noise (the loops it compares drift
/// by more than it on a loaded host).
const STATS_OUTSIDE_MAX_NS: f64 = 1_000.0;

impl StatsCost {
    /// What the statistics cost per hit beyond the reported run time, averaged over hits of
    /// which `timed` of `hits` ran while they were on.
    pub fn per_hit_ns(&self, timed: u64, hits: u64) -> f64 {
        if hits == 0 {
            return 0.0;
        }
        self.outside_ns * (timed.min(hits) as f64 / hits as f64)
    }

    /// The uprobe trap with them off, to add to a program's reported mean: `with_stats`,
    /// timed with them on, less their part outside the run and what the empty program
    /// reported (the calibration's calls with them off paid the call into it already:
    /// `with_stats` - outside is that whole empty hit, reported part included).
    pub fn trap_off_ns(&self, with_stats: f64) -> f64 {
        (with_stats - self.outside_ns - self.inside_ns).max(0.0)
    }
}

impl TrapCost {
    /// The traps one probed call pays: the entry's, and the return's unless only entries are
    /// probed.
    pub fn per_call(&self, entry_only: bool) -> f64 {
        self.entry_ns + if entry_only { 0.0 } else { self.ret_ns }
    }

    pub const DEFAULT: TrapCost = TrapCost {
        entry_ns: budget::UPROBE_TRAP_NS,
        ret_ns: budget::URETPROBE_TRAP_NS,
        measured: false,
        stats: StatsCost {
            inside_ns: 0.0,
            outside_ns: 0.0,
        },
    };
}

/// Kept up to date by the CUDA family's gate (it samples the traps again at each window it
/// opens), read by the report. An error says why the constants are used.
pub type SharedTrapCost = Arc<Mutex<Option<Result<TrapCost, String>>>>;

pub fn current(shared: &SharedTrapCost) -> TrapCost {
    match shared.lock().ok().as_deref() {
        Some(Some(Ok(t))) => *t,
        _ => TrapCost::DEFAULT,
    }
}

pub fn calibration_error(shared: &SharedTrapCost) -> Option<String> {
    match shared.lock().ok().as_deref() {
        Some(Some(Err(e))) => Some(e.clone()),
        _ => None,
    }
}

/// Three copies of the same `push %rbp` frame: one left alone (the loop's own cost), one with
/// an entry probe, one with an entry and a return probe.
#[cfg(target_arch = "x86_64")]
macro_rules! calib_fn {
    ($name:literal) => {
        concat!(
            ".globl ",
            $name,
            "\n",
            ".type ",
            $name,
            ",@function\n",
            ".p2align 4\n",
            $name,
            ":\n",
            "push rbp\n",
            "mov rbp, rsp\n",
            "pop rbp\n",
            "ret\n",
            ".size ",
            $name,
            ", .-",
            $name,
            "\n",
        )
    };
}

#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    calib_fn!("gputrace_calib_bare"),
    calib_fn!("gputrace_calib_entry"),
    calib_fn!("gputrace_calib_both"),
);

#[cfg(target_arch = "x86_64")]
extern "C" {
    fn gputrace_calib_bare();
    fn gputrace_calib_entry();
    fn gputrace_calib_both();
}

type CalibFn = unsafe extern "C" fn();

#[cfg(target_arch = "x86_64")]
fn targets() -> Option<[CalibFn; 3]> {
    Some([
        gputrace_calib_bare,
        gputrace_calib_entry,
        gputrace_calib_both,
    ])
}

#[cfg(not(target_arch = "x86_64"))]
fn targets() -> Option<[CalibFn; 3]> {
    None
}

/// Calls per timed round. At startup the median of [`ROUNDS`] rounds; later one round per
/// window, and the median of the last [`RECENT`] samples: the traps cost what the host lets
/// them cost at the time, which drifts by tens of percent on a shared VM.
const CALLS: u32 = 1000;
const ROUNDS: usize = 7;
const RECENT: usize = 9;
/// Outside this range a measurement is noise, not a trap.
const SANE_NS: std::ops::RangeInclusive<f64> = 20.0..=100_000.0;

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec for the call to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// CPU time per call of `f` over `calls` calls (thread CPU time: a trap or a syscall's slow
/// path is spent in the calling thread, and time away from the CPU is not).
pub(super) fn per_call_ns(calls: u32, mut f: impl FnMut()) -> f64 {
    let t0 = thread_cpu_ns();
    for _ in 0..calls {
        f();
    }
    (thread_cpu_ns() - t0) as f64 / calls as f64
}

/// The median of `v` (the upper one of an even count); `v` must not be empty.
pub(super) fn median_of(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Calls of a calibration copy.
fn call(f: CalibFn) {
    // SAFETY: the function only pushes and pops the frame pointer.
    unsafe { std::hint::black_box(f)() };
}

/// Per-hit program time since `before`.
fn bpf_ns_per_hit(ebpf: &Ebpf, u: &Uprobes, name: &str, before: (u64, u64)) -> f64 {
    let (n, t) = u.runs(ebpf, name);
    let hits = n.saturating_sub(before.0);
    if hits == 0 {
        return 0.0;
    }
    t.saturating_sub(before.1) as f64 / hits as f64
}

/// Median of each part on its own; the statistics' cost from the rounds that measured it.
fn median(samples: &[TrapCost]) -> TrapCost {
    if samples.is_empty() {
        return TrapCost::DEFAULT;
    }
    let median = |f: fn(&TrapCost) -> f64| median_of(samples.iter().map(f).collect());
    TrapCost {
        entry_ns: median(|t| t.entry_ns),
        ret_ns: median(|t| t.ret_ns),
        measured: true,
        stats: stats_median(samples),
    }
}

/// The statistics' cost: the median of the rounds that measured it (a round run while
/// another holder had them on cannot), each part on its own.
fn stats_median(samples: &[TrapCost]) -> StatsCost {
    let with: Vec<StatsCost> = samples
        .iter()
        .map(|t| t.stats)
        .filter(|s| s.inside_ns > 0.0)
        .collect();
    if with.is_empty() {
        return StatsCost::default();
    }
    StatsCost {
        inside_ns: median_of(with.iter().map(|s| s.inside_ns).collect()),
        outside_ns: median_of(with.iter().map(|s| s.outside_ns).collect()),
    }
}
/// The probed copies and what they have measured.
pub struct Calibrator {
    fns: [CalibFn; 3],
    uprobes: Uprobes,
    links: Vec<Link>,
    samples: Vec<TrapCost>,
    /// How many of `samples` were taken at startup.
    startup: usize,
    shared: SharedTrapCost,
}

impl Calibrator {
    /// Attaches the empty programs and takes a first measurement of several rounds. The
    /// syscall tracepoints must be attached already: on x86-64 a uretprobe returns through a
    /// syscall, and what they cost there is part of the return probe's cost.
    pub fn start(ebpf: &mut Ebpf, uprobes: &Uprobes, shared: SharedTrapCost) -> Result<Calibrator> {
        let result = Self::attach_all(ebpf, uprobes, shared.clone());
        let mut c = match result {
            Ok(c) => c,
            Err(e) => {
                if let Ok(mut s) = shared.lock() {
                    *s = Some(Err(format!("{e:#}")));
                }
                return Err(e);
            }
        };
        for _ in 0..ROUNDS {
            c.sample(ebpf);
        }
        c.startup = c.samples.len();
        if c.samples.is_empty() {
            if let Ok(mut s) = shared.lock() {
                *s = Some(Err("every measurement was implausible".into()));
            }
            bail!("every trap measurement was implausible");
        }
        Ok(c)
    }

    fn attach_all(ebpf: &mut Ebpf, u: &Uprobes, shared: SharedTrapCost) -> Result<Calibrator> {
        let fns = targets().context("no calibration target on this architecture")?;
        let (path, entry_off) = procfs::own_code(fns[1] as *const () as u64)?;
        let (_, both_off) = procfs::own_code(fns[2] as *const () as u64)?;
        let me = Some(std::process::id());
        // The return probe first: a call in between would pay for it alone, none is made.
        let mut links = u.attach(ebpf, CALIB_RET_PROG, &path, &[(both_off, 0)], me)?;
        links.extend(u.attach(
            ebpf,
            CALIB_ENTRY_PROG,
            &path,
            &[(both_off, 0), (entry_off, 0)],
            me,
        )?);
        Ok(Calibrator {
            fns,
            uprobes: u.clone(),
            links,
            samples: Vec::new(),
            startup: 0,
            shared,
        })
    }

    /// One round (~5 ms of this thread's time); implausible rounds are dropped.
    pub fn sample(&mut self, ebpf: &Ebpf) {
        let [bare, entry, both] = self.fns;
        let b = per_call_ns(CALLS, || call(bare));
        let u = &self.uprobes;
        // Without the statistics, unless another holder (the overhead family's sampled
        // ticks, another tool, `-v`) keeps them on: the kernel counts runs only while they
        // are. Before and after the calls timed with them on, against the host's drift.
        let off_calls = || {
            let before = u.runs(ebpf, CALIB_ENTRY_PROG).0;
            let ns = per_call_ns(CALLS / 2, || call(entry));
            (ns, u.runs(ebpf, CALIB_ENTRY_PROG).0 == before)
        };
        let (off_a, clean_a) = off_calls();
        // The programs' run times come from the kernel's statistics.
        let on = super::stats_on();
        let before = u.runs(ebpf, CALIB_ENTRY_PROG);
        let e = per_call_ns(CALLS, || call(entry));
        let e_bpf = bpf_ns_per_hit(ebpf, u, CALIB_ENTRY_PROG, before);
        let before = (u.runs(ebpf, CALIB_ENTRY_PROG), u.runs(ebpf, CALIB_RET_PROG));
        let r = per_call_ns(CALLS, || call(both));
        let r_bpf = bpf_ns_per_hit(ebpf, u, CALIB_ENTRY_PROG, before.0)
            + bpf_ns_per_hit(ebpf, u, CALIB_RET_PROG, before.1);
        let measured_on = on.is_on();
        drop(on);
        let (off_b, clean_b) = off_calls();
        // From the entry-only copy: the return probe's calls would also time the uretprobe
        // syscall's tracepoints, whose early returns the statistics time too.
        let outside = e - (off_a + off_b) / 2.0 - e_bpf;
        let stats = match clean_a && clean_b && measured_on && e_bpf > 0.0 {
            true if outside <= STATS_OUTSIDE_MAX_NS => StatsCost {
                inside_ns: e_bpf,
                // Noise around a small cost.
                outside_ns: outside.max(0.0),
            },
            _ => StatsCost::default(),
        };
        let t = TrapCost {
            entry_ns: e - b - e_bpf,
            ret_ns: r - e - (r_bpf - e_bpf),
            measured: true,
            stats,
        };
        if SANE_NS.contains(&t.entry_ns) && SANE_NS.contains(&t.ret_ns) {
            self.samples.push(t);
            let cur = self.in_trace();
            if let Ok(mut s) = self.shared.lock() {
                *s = Some(Ok(cur));
            }
        }
    }

    /// Median of the recent samples, each part on its own.
    pub fn current(&self) -> TrapCost {
        median(&self.samples[self.samples.len().saturating_sub(RECENT)..])
    }

    /// Median of the samples taken during the trace (once there are a few): the startup
    /// rounds run while the machine is busy with gputrace's own start and the previous
    /// links' release, and came out 10-30% high here.
    pub fn in_trace(&self) -> TrapCost {
        let later = &self.samples[self.startup.min(self.samples.len())..];
        let mut t = if later.len() >= 3 {
            median(later)
        } else {
            self.current()
        };
        // Later rounds all ran while another holder had the statistics on: their cost as
        // measured before.
        if t.stats.inside_ns == 0.0 {
            t.stats = stats_median(&self.samples);
        }
        t
    }

    /// Takes rounds until `n` were taken during the trace (at most `2n` tries): a trace that
    /// opened no launch window (`--max-overhead 100%`, or one whose launches stayed under the
    /// budget) has only the startup's, taken while gputrace's own start kept the machine busy.
    /// A 100% trace of a launch storm priced its hits at those (uretprobe 1,320 ns against
    /// ~1,000 measured at other times) and came out at 101% of the storm's time.
    pub fn top_up(&mut self, ebpf: &Ebpf, n: usize) {
        for _ in 0..2 * n {
            if self.samples.len().saturating_sub(self.startup) >= n {
                return;
            }
            self.sample(ebpf);
        }
    }

    /// Closes the links on a thread of their own: the kernel takes ~100 ms per uprobe to
    /// release one, and the report need not wait for it.
    pub fn close(&mut self) {
        let links = std::mem::take(&mut self.links);
        if links.is_empty() {
            return;
        }
        let _ = std::thread::Builder::new()
            .name("gputrace-calib".into())
            .spawn(move || drop(links));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(entry_ns: f64, inside_ns: f64, outside_ns: f64) -> TrapCost {
        TrapCost {
            entry_ns,
            ret_ns: 2.0 * entry_ns,
            measured: true,
            stats: StatsCost {
                inside_ns,
                outside_ns,
            },
        }
    }

    #[test]
    fn the_statistics_cost_is_the_median_of_the_rounds_that_measured_it() {
        // The second round ran while the statistics were on already (another holder): no
        // measure of them, left out of theirs but not of the traps'.
        let m = median(&[
            sample(700.0, 45.0, 60.0),
            sample(720.0, 0.0, 0.0),
            sample(760.0, 47.0, 40.0),
            sample(740.0, 44.0, 90.0),
        ]);
        assert_eq!(m.entry_ns, 740.0);
        assert_eq!(m.ret_ns, 1480.0);
        assert_eq!(m.stats.inside_ns, 45.0);
        assert_eq!(m.stats.outside_ns, 60.0);
        let none = median(&[sample(700.0, 0.0, 0.0)]);
        assert_eq!(none.stats, StatsCost::default());
        assert_eq!(median(&[]), TrapCost::DEFAULT);
    }

    #[test]
    fn the_statistics_are_charged_to_the_hits_they_timed() {
        let s = StatsCost {
            inside_ns: 45.0,
            outside_ns: 60.0,
        };
        // A tenth of the hits timed: a tenth of their cost per hit.
        assert!((s.per_hit_ns(100, 1000) - 6.0).abs() < 1e-9);
        assert_eq!(s.per_hit_ns(0, 1000), 0.0);
        assert_eq!(s.per_hit_ns(5, 0), 0.0);
        assert_eq!(s.per_hit_ns(2000, 1000), 60.0);
        // A trap timed with them on holds their part outside the run; the empty program's
        // reported run is in the program's mean it is added to.
        assert_eq!(s.trap_off_ns(800.0), 695.0);
        assert_eq!(s.trap_off_ns(30.0), 0.0);
        assert_eq!(StatsCost::default().trap_off_ns(800.0), 800.0);
    }
}
