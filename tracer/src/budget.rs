//! The overhead budget (issue 6): pure control logic, no BPF.
//!
//! Overhead here is the share of a traced thread's time spent in gputrace's probes: the BPF
//! programs' own run time (measured by the kernel, `kernel.bpf_stats_enabled`) plus the trap
//! that takes a uprobe into the kernel and back (a calibrated constant: the kernel's statistics
//! do not see it). A budget of 2% keeps that share under 2% by switching the high-rate probes
//! (CUDA launches) on and off in windows; the syscall tracepoints have their own control
//! (`accounting::syscall_gate`). What the windows saw is counted exactly; each stretch
//! with the probes off is filled in from the windows on either side of it: from its copies and
//! syncs (counted exactly) at those windows' launches per copy or sync, where each saw enough
//! of them (a training loop), else at their launch rates in the workload's own time (the
//! probes' cost taken out of a window). The error bound comes from how much the two windows
//! disagree, and from the uncertainty of the cost or where the windows cut the job's steps.
//! A rate that changes (an import phase, then a launch storm) is followed window by window,
//! not averaged over the whole trace.
//!
//! The control is a token bucket of probe time: it fills at `budget` per unit of wall time up
//! to one second's worth ([`BURST_S`]); a window opens at a tick when the bucket is full
//! and a watchdog closes it as soon as it has spent its share of the bucket ([`must_close`]),
//! so a storm that starts while the probes are on costs at most one bucket. Hits are summed
//! over all threads and charged to one thread, so the control is conservative when several
//! threads launch.
//!
//! The budget is a ceiling, not a target. Once three windows in a row see the same launch
//! rate (within [`AGREE`]), another window a second later adds little to what the estimate
//! knows (its error is then mostly the cost per hit's uncertainty, which no window narrows),
//! so the windows spread out: half of [`MAX_GAP_S`] apart, then `MAX_GAP_S` (shorter at
//! budgets above the default, which buy more windows). A window that disagrees with the one
//! before brings them back to as often as the bucket allows. And a window spends a quarter of
//! the bucket ([`FIRST_SHARE`]) until windows disagree, which makes them longer: three
//! quarter-bucket windows learn a steady rate as well as three whole ones, at a quarter of the
//! traps, and the bucket refills for the next one sooner. A launch-bound job traced for 10 s
//! pays about a third of the budget, for a minute a twentieth.

/// Added time of one uprobe hit outside the BPF program (breakpoint trap, uprobe lookup, return
/// to user space). Calibrated on this VM (2 vCPUs, Linux 6.18, 2026-11-21) with
/// tests/workloads/launch_storm.c (work 0, 500k launches, `push %rbp` prologue): untraced
/// 3.8 ns per launch, entry probe only 1190-1280 ns with the program's own run time 200-210 ns,
/// so ~1000 ns of trap.
pub const UPROBE_TRAP_NS: f64 = 1000.0;
/// The same for a uretprobe (return address hijacked at entry, trap at return): entry + return
/// 3600-3940 ns per launch with 380-440 ns of run time each, so ~2000 ns beyond the entry's.
pub const URETPROBE_TRAP_NS: f64 = 2000.0;
/// A tracepoint or perf-event program's dispatch outside its own run time (a few indirect calls).
pub const TRACEPOINT_NS: f64 = 30.0;
/// The same for the syscall tracepoints, which also send every syscall of every task down the
/// kernel's slow path while attached, where it cannot be measured at startup
/// (`overhead::syscall_trap`, which measured 24-35 ns here on 2026-11-25 and -15 to -27 ns,
/// net of what the statistics put inside the programs' means, on 2026-11-26: the host's
/// costs drift). Measured on this VM (2026-11-21, getppid x500k): traced
/// minus untraced less the two programs' run time left 322-388 ns per call with raw
/// tracepoints (the default) and 226-280 ns with classic ones: ~170 ns per hit. With 30 ns the
/// estimate put a syscall storm's overhead at 37% of its time where the measured share was 72%.
pub const SYSCALL_TRACEPOINT_NS: f64 = 170.0;

/// Budgets at or above this never sample: every probe stays on and every count is exact.
pub const NO_SAMPLING: f64 = 1.0;

/// Parses `2%`, `0.5%`, `100%` or a fraction like `0.02`.
pub fn parse_budget(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let (number, percent) = match t.strip_suffix('%') {
        Some(p) => (p.trim(), true),
        None => (t, false),
    };
    let v = number
        .parse::<f64>()
        .ok()
        .filter(|v| !v.is_nan())
        .map(|v| if percent { v / 100.0 } else { v })
        .ok_or_else(|| format!("`{s}` is not an overhead budget (try 2% or 0.5%)"))?;
    if v <= 0.0 {
        return Err(format!("`{s}`: the overhead budget must be above 0%"));
    }
    // A bare number is a fraction: `2` meant as 2% would have been read as 200% (no sampling).
    if !percent && v > 1.0 {
        return Err(format!(
            "`{s}`: give the budget as a percentage ({s}%) or as a fraction up to 1"
        ));
    }
    // Anything from 100% up (infinity included) samples nothing.
    Ok(v.min(NO_SAMPLING))
}

/// How far the cost per hit may be off. The traps are measured on gputrace's own calls
/// (`overhead::calibrate`), and what the workload pays differs: on this VM (2026-11-21) the
/// launch storm's windows implied trap costs from 0.6x to 1.3x of the measurement taken in
/// the same run. Scaled counts inherit it: their own time inside a window is the window minus
/// the probes' cost, and in a storm the cost is most of the window.
pub const COST_UNCERTAINTY: f64 = 0.5;

/// Seconds of budget a burst may spend at once: the token bucket's capacity. A window of the
/// sampled probes lasts until it has spent its share of the bucket (closed by a watchdog that
/// checks every few ms), and a new one opens when the bucket is full again: at 2% and a storm
/// costing 80% of the thread, whole-bucket windows last ~25 ms and come every ~1 s.
pub const BURST_S: f64 = 1.0;

/// Seconds of budget the bucket may owe at most. Probes the launch windows do not switch (copies
/// and syncs) can cost more than the budget fills: while they do no window opens, and once they
/// stop (the job's phase changes) the launch probes are back within this many seconds,
/// not after as long as the debt took to run up.
pub const DEBT_S: f64 = 10.0;

/// The share of the bucket a window may spend at first. A window's cost is mostly its
/// own traps, plus its attach and close (a fixed ~10 ms of the launching thread's time here);
/// a quarter of the bucket (5 ms of probes at the default budget, ~2,000 launches of a
/// storm) already gives a rate far more precise than the cost per hit it is divided by. A
/// window whose rate disagrees with the one before doubles the share, up to the whole
/// bucket: a job whose rate swings within a quarter-bucket window gets longer ones. From the
/// third in a row that agree, each halves it again, down to this.
pub const FIRST_SHARE: f64 = 0.25;

/// Consecutive windows whose launch rates differ by at most this share of their mean agree:
/// the rate is steady and the windows may spread out.
pub const AGREE: f64 = 0.2;

/// The fewest steps (runs of copies and syncs between two of its launches) a window must see
/// for its ratio of launches to copies and syncs to fill in the stretches beside it: a window
/// cuts the job's steps at both ends, its launches and copies together off by up to a step,
/// so 8 steps leave the ratio within 12.5%, and the bound says how far. With fewer, the time
/// rate is the better guess: the demo's launch mode (2,000 launches and four copies and
/// syncs a step, two to five steps a window) read 0.87-1.07 of its launches from the ratio
/// and 0.97-1.03 from the time, whose probes there cost less than half the work. A short
/// window beside one that tells a ratio, and whose launches fit that ratio, leaves the
/// stretches beside it to that ratio all the same (`Window::fits`).
pub const STEPS_MIN: u64 = 8;

/// The longest wait from one window's opening to the next once windows agree, at the default
/// budget; a budget `k` times the default waits `k` times less.
pub const MAX_GAP_S: f64 = 8.0;

/// The default `--max-overhead`, and as the command line spells it.
pub const DEFAULT_BUDGET: f64 = 0.02;
pub const DEFAULT_BUDGET_ARG: &str = "2%";

/// One tick as the probes saw it.
#[derive(Debug, Clone, Copy, Default)]
pub struct TickObs {
    /// Wall time of the tick (ns).
    pub dt_ns: u64,
    /// How long in the tick the sampled probes were attached (ns).
    pub on_ns: u64,
    /// Hits of the sampled probes in the tick.
    pub sampled_hits: u64,
    /// The launches in the tick as the report counts them (once each, in traced processes
    /// only), which the estimate scales: a hit is a probe's run, which a runtime's launch
    /// makes twice (its own and the driver's inside it) and an untraced process makes too.
    pub launches: u64,
    /// Cost of one sampled hit (ns): BPF run time per hit plus the trap constants.
    pub cost_per_hit_ns: f64,
    /// The traps' part of it (replaced by a better measurement at the end, if one is given).
    pub trap_ns: f64,
    /// Cost of the probes the windows do not switch, in the tick (ns).
    pub other_cost_ns: f64,
    /// The window closed in this tick (the watchdog emptied the bucket).
    pub closed: bool,
    /// The traced processes' copies and syncs (counted exactly while their probes are on) made while
    /// the sampled probes were on in the tick, and while they were off.
    pub steady_on: u64,
    pub steady_off: u64,
    /// The runs of copies and syncs in `steady_on`: the steps the window's ratio spans.
    pub steps_on: u64,
    /// How much wall time a ns of CPU cost the launching threads in the tick ([`stretch`]; 1
    /// or less: none): the bucket fills that much slower.
    pub stretch: f64,
    /// The copy and sync probes were off for some of the tick (their own windows,
    /// `overhead::calls`): `steady_on` and `steady_off` miss calls, and neither the tick's
    /// window nor its time off may go by launches per copy or sync.
    pub steady_unknown: bool,
}

/// One tick as the gate kept it.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    /// Time with the sampled probes on, and what one hit cost then (of which `trap_ns` the
    /// traps).
    on_ns: u64,
    cost_per_hit: f64,
    trap_ns: f64,
    hits: u64,
    launches: u64,
    /// Time with the probes off.
    off_ns: u64,
    /// Copies and syncs counted with the probes on and off (`TickObs`).
    steady_on: u64,
    steady_off: u64,
    steps_on: u64,
    /// The copies and syncs were not all counted (`TickObs::steady_unknown`).
    steady_unknown: bool,
    /// The window stays open into the next tick.
    goes_on: bool,
}

impl Slot {
    /// The probes' cost in the window, with the trap cost `trap` if given, times `k` (to try
    /// the cost's uncertainty).
    fn cost(&self, c: Cost) -> f64 {
        c.k * self.hits as f64 * (self.cost_per_hit - self.trap_ns + c.trap.unwrap_or(self.trap_ns))
    }

    /// The workload's own time in the window: the probes' cost taken out.
    fn own_on(&self, c: Cost) -> f64 {
        self.on_ns as f64 - self.cost(c)
    }

    /// Launches per ns of the workload's own time, when this tick had a window.
    fn rate(&self, c: Cost) -> Option<f64> {
        if self.on_ns == 0 {
            return None;
        }
        // Several launching threads pay the cost in parallel, which the one-thread own time
        // cannot tell: when the cost ate the whole window, fall back to its wall time.
        let own = self.own_on(c);
        let own = if own > 0.0 { own } else { self.on_ns as f64 };
        Some(self.launches as f64 / own)
    }

    /// Launches per copy or sync, when this tick had a window that saw enough steps.
    fn per_call(&self) -> Option<f64> {
        (self.on_ns > 0 && self.steps_on >= STEPS_MIN && self.steady_on > 0)
            .then(|| self.launches as f64 / self.steady_on as f64)
    }
}

/// A token bucket of probe time: filled at `budget` ns per ns of wall time up to
/// `budget x BURST_S`, emptied by what the probes cost.
#[derive(Debug, Clone)]
pub struct Gate {
    budget: f64,
    tokens_ns: f64,
    elapsed_ns: u64,
    on_ns: u64,
    spent_ns: f64,
    slots: Vec<Slot>,
    /// Trap cost per hit measured over the whole trace, used by the estimate in place of what
    /// each tick knew then.
    final_trap: Option<f64>,
    /// Whether a window is open, and when the last one opened (ns of trace).
    open: bool,
    opened_ns: u64,
    /// The open window so far: time, hits and their cost.
    window: Slot,
    /// Launches per ns of own time in the last closed window, and per copy or sync if it saw
    /// enough of them.
    last_rate: Option<f64>,
    last_per_call: Option<f64>,
    /// How long to wait from one window's opening to the next (ns), beyond a full bucket, and
    /// how many windows in a row have agreed with the one before.
    gap_ns: u64,
    agreed: u32,
    /// The share of the bucket a window may spend ([`FIRST_SHARE`] at first).
    share: f64,
    /// Copies and syncs of an open window's ticks with no time off, for its last tick's.
    steady_carried: u64,
}

/// Why a scaled count has no error bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoBound {
    /// Fewer than two windows: nothing to compare.
    OneWindow,
    /// At the higher cost per hit a window has no time of its own left: its rate has no
    /// upper bound (a launch storm whose probes cost more than its work).
    CostExceedsWork,
    /// Launches filled in from one window's launches per copy or sync, with no second
    /// window's to compare it with.
    OneRatio,
}

impl NoBound {
    pub fn says(self) -> &'static str {
        match self {
            NoBound::OneWindow => "one window",
            NoBound::CostExceedsWork => "the probes cost more than the work they sampled",
            NoBound::OneRatio => {
                "one window saw enough copies and syncs to tell launches per copy or sync"
            }
        }
    }
}

/// What the windows add up to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    /// Share of the time the sampled probes were on.
    pub duty: f64,
    /// Multiply counts seen by the sampled probes by this.
    pub scale: f64,
    /// Relative error bound of a scaled count; 0 when exact; None when it cannot be told
    /// (`no_bound` says why).
    pub rel_error: Option<f64>,
    pub no_bound: Option<NoBound>,
    pub windows: usize,
    /// Estimated share of the thread's time spent in probes so far.
    pub overhead: f64,
    /// The share of the launches filled in between windows that was filled in from the
    /// copies and syncs counted there (the rest from the time).
    pub by_calls: f64,
}

impl Gate {
    /// The bucket starts full and the sampled probes on.
    pub fn new(budget: f64) -> Gate {
        Gate {
            budget,
            tokens_ns: budget * BURST_S * 1e9,
            elapsed_ns: 0,
            on_ns: 0,
            spent_ns: 0.0,
            slots: Vec::new(),
            final_trap: None,
            open: true,
            opened_ns: 0,
            window: Slot::default(),
            last_rate: None,
            last_per_call: None,
            gap_ns: 0,
            agreed: 0,
            share: FIRST_SHARE,
            steady_carried: 0,
        }
    }

    pub fn samples(&self) -> bool {
        self.budget < NO_SAMPLING
    }

    pub fn budget(&self) -> f64 {
        self.budget
    }

    fn capacity(&self) -> f64 {
        self.budget * BURST_S * 1e9
    }

    /// What an open window may still spend (ns): the watchdog closes it when the probes'
    /// cost since the last tick exceeds this plus the refill since then. A window smaller than
    /// the bucket leaves the rest of it in reserve.
    pub fn tokens_ns(&self) -> f64 {
        self.tokens_ns - self.capacity() * (1.0 - self.share)
    }

    /// Whether a window is open: from a tick that opened it to the tick that saw it closed.
    pub fn is_open(&self) -> bool {
        self.open
    }

    /// The longest wait between windows that agree (ns).
    fn max_gap_ns(&self) -> u64 {
        (MAX_GAP_S * 1e9 * (DEFAULT_BUDGET / self.budget).min(1.0)) as u64
    }

    /// Takes one tick's observation; returns whether a window should be open for the next tick
    /// (an open one stays open until the watchdog closes it: `closed`).
    pub fn tick(&mut self, o: TickObs) -> bool {
        self.elapsed_ns += o.dt_ns;
        let sampled_cost = o.sampled_hits as f64 * o.cost_per_hit_ns;
        self.spent_ns += sampled_cost + o.other_cost_ns;
        // The probes take CPU time from the launching thread, and where it waits for a CPU in
        // proportion to what it uses, each ns of it costs the thread `stretch` ns: the budget
        // is of its time, so it fills with the thread's pace, not the clock's.
        let fill = self.budget * o.dt_ns as f64 / o.stretch.max(1.0);
        self.tokens_ns =
            ((self.tokens_ns + fill).min(self.capacity()) - sampled_cost - o.other_cost_ns)
                .max(-self.budget * DEBT_S * 1e9);
        let on_ns = o.on_ns.min(o.dt_ns);
        if on_ns > 0 {
            self.on_ns += on_ns;
        }
        // Copies and syncs not all counted tell no ratio: none are kept.
        let known = !o.steady_unknown;
        let slot = Slot {
            on_ns,
            cost_per_hit: o.cost_per_hit_ns,
            trap_ns: o.trap_ns,
            hits: if on_ns > 0 { o.sampled_hits } else { 0 },
            launches: if on_ns > 0 { o.launches } else { 0 },
            off_ns: o.dt_ns - on_ns,
            steady_on: if on_ns > 0 && known { o.steady_on } else { 0 },
            steps_on: if on_ns > 0 && known { o.steps_on } else { 0 },
            steady_off: if known {
                o.steady_off + if on_ns > 0 { 0 } else { o.steady_on }
            } else {
                0
            },
            steady_unknown: o.steady_unknown,
            goes_on: on_ns > 0 && self.open && !o.closed,
        };
        // The copies and syncs of a window's middle ticks that were not between its launches
        // (a thread that does not launch) go with its last tick's off part, as those of its
        // first and last ticks do.
        let mut slot = slot;
        if slot.on_ns > 0 && slot.off_ns == 0 {
            self.steady_carried += std::mem::take(&mut slot.steady_off);
        } else if slot.off_ns > 0 {
            slot.steady_off += std::mem::take(&mut self.steady_carried);
        }
        // Runs of whole ticks off merge: an hour-long trace keeps its windows, not its ticks.
        match self.slots.last_mut() {
            Some(last) if slot.on_ns == 0 && last.on_ns == 0 => {
                last.off_ns += slot.off_ns;
                last.steady_off += slot.steady_off;
                last.steady_unknown |= slot.steady_unknown;
            }
            _ => self.slots.push(slot),
        }
        if !self.samples() {
            return true;
        }
        if on_ns > 0 {
            self.window.on_ns += on_ns;
            self.window.hits += slot.hits;
            self.window.launches += slot.launches;
            self.window.cost_per_hit = slot.cost_per_hit;
            self.window.trap_ns = slot.trap_ns;
            self.window.steady_on += slot.steady_on;
        }
        if o.closed && self.open {
            self.open = false;
            self.close_window();
        }
        // Full: each window costs its attach and detach (ms with the return probe firing
        // alone), so few long windows beat many short ones.
        let full = self.tokens_ns >= self.capacity() * 0.99;
        let spaced = self.elapsed_ns.saturating_sub(self.opened_ns) >= self.gap_ns;
        if !self.open && full && spaced {
            self.open = true;
            self.opened_ns = self.elapsed_ns;
        }
        self.open
    }

    /// Spaces the windows out while they agree, back to the bucket's pace when one does not.
    fn close_window(&mut self) {
        let w = std::mem::take(&mut self.window);
        let cost = Cost { trap: None, k: 1.0 };
        let Some(rate) = w.rate(cost) else { return };
        let agrees = |a: f64, b: f64| {
            let mean = (a + b) / 2.0;
            mean <= 0.0 || (a - b).abs() <= AGREE * mean
        };
        // Launches per copy or sync when both windows have them: what fills the stretch
        // between them then, where the time rate moves with the probes' cost.
        let per_call = w.per_call();
        let agree = match (self.last_per_call, per_call) {
            (Some(a), Some(b)) => agrees(a, b),
            _ => self.last_rate.is_some_and(|last| agrees(last, rate)),
        };
        // Three windows in a row first: the first often straddles the job's start, and the
        // bound on the stretches filled in between spread windows (and after the last) comes
        // from how much consecutive windows have differed so far.
        self.agreed = if agree { self.agreed + 1 } else { 0 };
        // A window that disagrees doubles the next ones; three that agree halve them again
        // from the third in a row on (the first window, which often straddles the job's
        // start, would otherwise double them for good).
        if !agree && self.last_rate.is_some() {
            self.share = (self.share * 2.0).min(1.0);
        } else if self.agreed >= 2 {
            self.share = (self.share / 2.0).max(FIRST_SHARE);
        }
        self.gap_ns = match self.agreed {
            0 | 1 => 0,
            2 => self.max_gap_ns() / 2,
            _ => self.max_gap_ns(),
        };
        self.last_rate = Some(rate);
        self.last_per_call = per_call;
    }

    /// The trap cost per hit as measured over the whole trace (the ticks worked with what
    /// was known at the time).
    pub fn set_final_trap(&mut self, trap_ns: f64) {
        self.final_trap = Some(trap_ns);
    }

    pub fn estimate(&self) -> Estimate {
        let total = self.elapsed_ns.max(1) as f64;
        let overhead = self.spent_ns / total;
        let windows = windows(&self.slots).len();
        let off: u64 = self.slots.iter().map(|s| s.off_ns).sum();
        if off == 0 {
            return Estimate {
                duty: 1.0,
                scale: 1.0,
                rel_error: Some(0.0),
                no_bound: None,
                windows,
                overhead,
                by_calls: 0.0,
            };
        }
        let duty = self.on_ns as f64 / total;
        let seen: u64 = self.slots.iter().map(|s| s.launches).sum();
        let cost = Cost {
            trap: self.final_trap,
            k: 1.0,
        };
        let f = fill(&self.slots, cost);
        if seen == 0 || f.estimated <= 0.0 {
            // Nothing seen: nothing to scale (a scale of 1 leaves the report's counts exact).
            return Estimate {
                duty,
                scale: 1.0,
                rel_error: (windows >= 2).then_some(0.0),
                no_bound: (windows < 2).then_some(NoBound::OneWindow),
                windows,
                overhead,
                by_calls: 0.0,
            };
        }
        let all = seen as f64 + f.estimated;
        // A cost per hit off by COST_UNCERTAINTY moves every window's own time, and so every
        // stretch filled in from the time: tried both ways. When the higher cost leaves a
        // window no own time (the probes cost more than the work they sampled: a launch
        // storm), the rate has no upper bound and the error cannot be told.
        let filled = |k: f64| {
            let f = fill(&self.slots, Cost { k, ..cost });
            (!f.unbounded).then_some(f.estimated)
        };
        let bias = match (
            filled(1.0 - COST_UNCERTAINTY),
            filled(1.0 + COST_UNCERTAINTY),
        ) {
            (Some(lo), Some(hi)) => Some((f.estimated - lo).max(hi - f.estimated)),
            _ => None,
        };
        let rel_error = f.spread.zip(bias).map(|(spread, bias)| {
            (spread * spread + f.steps_cut * f.steps_cut + bias * bias).sqrt() / all
        });
        let no_bound = if rel_error.is_some() {
            None
        } else if bias.is_none() {
            Some(NoBound::CostExceedsWork)
        } else if f.one_ratio {
            Some(NoBound::OneRatio)
        } else {
            Some(NoBound::OneWindow)
        };
        Estimate {
            duty,
            scale: all / seen as f64,
            rel_error,
            no_bound,
            windows,
            overhead,
            by_calls: f.by_calls / f.estimated,
        }
    }
}

/// How the probes' cost is taken out of a window.
#[derive(Debug, Clone, Copy)]
struct Cost {
    /// The trap cost per hit measured over the whole trace (else what each tick knew).
    trap: Option<f64>,
    /// A factor on the cost, to try its uncertainty.
    k: f64,
}

/// What the stretches with the probes off add up to.
struct Fill {
    estimated: f64,
    /// Absolute uncertainty of `estimated` from the rates' disagreement; None with fewer than
    /// two windows (nothing to compare), or `one_ratio`.
    spread: Option<f64>,
    /// The part of `estimated` filled in from the copies and syncs counted off the windows.
    by_calls: f64,
    /// Absolute uncertainty of that part from where the windows cut the job's steps: a
    /// window's copies and syncs may be one step's off its launches' (a step begun before it
    /// opened, one left unfinished at its close), each window's independently of the others'.
    steps_cut: f64,
    /// A stretch was filled in at the rate of a window whose probes, at this cost, took all its
    /// time: that rate has no upper bound, nor has the stretch.
    unbounded: bool,
    /// A stretch was filled in from one window's ratio with no two windows' ratios to compare
    /// (`spread` is then None).
    one_ratio: bool,
}

/// The root mean square of the relative changes between consecutive values; None for fewer
/// than two.
fn typical_change(pairs: impl Iterator<Item = (f64, f64)>) -> Option<f64> {
    let changes: Vec<f64> = pairs
        .filter(|&(a, b)| a + b > 0.0)
        .map(|(a, b)| (a - b).abs() / ((a + b) / 2.0))
        .collect();
    (!changes.is_empty())
        .then(|| (changes.iter().map(|c| c * c).sum::<f64>() / changes.len() as f64).sqrt())
}

/// A window as its ratio of launches to copies and syncs sees it: the slots it spans (one a
/// tick while it stays open) and what they add up to.
struct Window {
    first: usize,
    last: usize,
    launches: u64,
    steady_on: u64,
    steps_on: u64,
}

impl Window {
    /// Launches per copy or sync, when the window saw enough steps.
    fn per_call(&self) -> Option<f64> {
        (self.steps_on >= STEPS_MIN && self.steady_on > 0)
            .then(|| self.launches as f64 / self.steady_on as f64)
    }

    /// Copies and syncs per step: a window's edges cut a step, not a copy.
    fn per_step(&self) -> f64 {
        if self.steps_on == 0 {
            1.0
        } else {
            self.steady_on as f64 / self.steps_on as f64
        }
    }

    /// Whether this window, too short to tell a ratio of its own, agrees with `r`'s: it saw
    /// both launches and copies or syncs, and its launches are what `r`'s ratio makes of its
    /// copies and syncs, give or take a step at each edge and at most half. A window cut short
    /// by the job's end, or closed within a few steps on a slow host, does; one that saw
    /// launches with no copies (a storm between the steps), or copies with no launches (an
    /// evaluation pass), does not.
    fn fits(&self, r: &Window) -> bool {
        let Some(q) = r.per_call() else {
            return false;
        };
        if self.launches == 0 || self.steady_on == 0 {
            return false;
        }
        let expected = q * self.steady_on as f64;
        (self.launches as f64 - expected).abs() <= (2.0 * q * r.per_step()).min(expected / 2.0)
    }

    /// Neither launches nor copies and syncs (open before the job started, or while it
    /// waited): it says nothing of the ratio.
    fn quiet(&self) -> bool {
        self.launches == 0 && self.steady_on == 0
    }
}

/// The windows among `slots`. One open over several ticks is one window: each tick alone may
/// see too few copies and syncs to tell a ratio (its first tick often does, opened as the job
/// starts or a few ms before the tick ends).
fn windows(slots: &[Slot]) -> Vec<Window> {
    let mut out: Vec<Window> = Vec::new();
    let mut goes_on = false;
    for (i, s) in slots.iter().enumerate() {
        if s.on_ns == 0 {
            goes_on = false;
            continue;
        }
        match out.last_mut() {
            Some(w) if goes_on => {
                w.last = i;
                w.launches += s.launches;
                w.steady_on += s.steady_on;
                w.steps_on += s.steps_on;
            }
            _ => out.push(Window {
                first: i,
                last: i,
                launches: s.launches,
                steady_on: s.steady_on,
                steps_on: s.steps_on,
            }),
        }
        goes_on = s.goes_on;
    }
    out
}

/// A stretch's launches from the windows beside it: `x` (the stretch's time, or its copies and
/// syncs) at the mean of their `before` and `after` rates, with half their difference as its
/// uncertainty; with a window on one side only (the trace's start or end), at that window's
/// rate, uncertain by the `typical` relative change between consecutive windows.
fn between(x: f64, before: Option<f64>, after: Option<f64>, typical: f64) -> Option<(f64, f64)> {
    match (before, after) {
        (Some(a), Some(b)) => Some((x * (a + b) / 2.0, x * (a - b).abs() / 2.0)),
        (Some(r), None) | (None, Some(r)) => Some((x * r, x * r * typical)),
        (None, None) => None,
    }
}

/// Fills in each stretch off from the windows just before and just after it. Where those
/// windows saw enough steps ([`STEPS_MIN`]), at their launches per copy or sync
/// times the stretch's own copies and syncs (counted exactly): a training loop launches about
/// as many kernels each step, and the ratio needs no price of a probe hit, where a window's
/// rate in time does (the probes' cost is taken out of it, and in a storm the cost is most of
/// the window: with a runtime whose launches call the driver's, four traps a launch, 2M
/// launches in steps with two copies each read 1.94-2.06M from the ratio, 0.65-1.41 times as many
/// from the time in an earlier build). Elsewhere (a storm with no copy or sync in a window) at
/// the mean launch rate of those windows in the workload's own time. Summed, not added in
/// quadrature: neighbouring stretches share their windows, so their errors go together.
fn fill(slots: &[Slot], cost: Cost) -> Fill {
    let rates: Vec<(usize, f64)> = slots
        .iter()
        .enumerate()
        .filter_map(|(i, s)| s.rate(cost).map(|r| (i, r)))
        .collect();
    let typical = typical_change(rates.windows(2).map(|w| (w[0].1, w[1].1)));
    let mut runs = windows(slots);
    runs.retain(|w| !w.quiet());
    // Between consecutive windows that tell a ratio: a short one between two does not keep
    // them from being compared.
    let told: Vec<usize> = (0..runs.len())
        .filter(|k| runs[*k].per_call().is_some())
        .collect();
    let typical_ratio = typical_change(
        told.windows(2)
            .filter_map(|w| runs[w[0]].per_call().zip(runs[w[1]].per_call())),
    );
    let (mut estimated, mut spread, mut by_calls, mut unbounded) = (0.0, 0.0, 0.0, false);
    // A stretch filled in from one window's ratio with no two windows' ratios to compare.
    let mut one_ratio = false;
    // How many of the filled-in copies and syncs each window's ratio multiplies.
    let mut weight = vec![0.0; runs.len()];
    // The window whose ratio a window's side of a stretch is filled at: its own, or where it
    // saw too few steps to tell one, the nearest window's that does when it fits that ratio.
    // A CI host's run had one window of five under STEPS_MIN (closed within a few steps),
    // and the stretches beside it, a quarter of the launches, were filled from the time.
    let stands_for: Vec<Option<usize>> = (0..runs.len())
        .map(|k| {
            if runs[k].per_call().is_some() {
                return Some(k);
            }
            let near = told.iter().copied().min_by_key(|j| j.abs_diff(k))?;
            runs[k].fits(&runs[near]).then_some(near)
        })
        .collect();
    for (i, s) in slots.iter().enumerate() {
        if s.off_ns == 0 {
            continue;
        }
        // A tick's own window comes before its off part (the watchdog closes it mid-tick), but
        // for the first tick of one that goes on: opened at the tick before, it went on
        // after the attach.
        let (before, after) = match runs.iter().position(|w| w.first == i && w.last > i) {
            Some(k) => (k.checked_sub(1), Some(k)),
            None => (
                runs.iter().rposition(|w| w.last <= i),
                runs.iter().position(|w| w.first > i),
            ),
        };
        // A side stands in by its own ratio, or by the nearest that tells one when it fits it.
        let (b, a) = (before.map(|k| stands_for[k]), after.map(|k| stands_for[k]));
        let ratio_fills =
            !s.steady_unknown && (b.is_some() || a.is_some()) && b != Some(None) && a != Some(None);
        let (b, a) = (b.flatten(), a.flatten());
        // Both sides standing in by the same window: one ratio, as at the trace's ends.
        let a = a.filter(|a| Some(*a) != b);
        let by: Vec<usize> = [b, a].into_iter().flatten().collect();
        let ratio = |k: Option<usize>| k.and_then(|k| runs[k].per_call());
        let by_ratio = ratio_fills.then(|| {
            between(
                s.steady_off as f64,
                ratio(b),
                ratio(a),
                typical_ratio.unwrap_or(0.0),
            )
        });
        if let Some(Some((e, u))) = by_ratio {
            estimated += e;
            spread += u;
            by_calls += e;
            one_ratio |= by.len() == 1 && typical_ratio.is_none();
            for k in &by {
                weight[*k] += s.steady_off as f64 / by.len() as f64;
            }
            continue;
        }
        let before = rates.iter().rev().find(|(j, _)| *j <= i);
        let after = rates.iter().find(|(j, _)| *j > i);
        unbounded |= [before, after]
            .iter()
            .flatten()
            .any(|(j, _)| slots[*j].hits > 0 && slots[*j].own_on(cost) <= 0.0);
        if let Some((e, u)) = between(
            s.off_ns as f64,
            before.map(|r| r.1),
            after.map(|r| r.1),
            typical.unwrap_or(0.0),
        ) {
            estimated += e;
            spread += u;
        }
    }
    let steps_cut = runs
        .iter()
        .zip(&weight)
        .filter_map(|(r, w)| {
            r.per_call()
                .map(|q| w * q * r.per_step() / r.steady_on as f64)
        })
        .map(|e| e * e)
        .sum::<f64>()
        .sqrt();
    Fill {
        estimated,
        spread: typical.filter(|_| !one_ratio).map(|_| spread),
        by_calls,
        steps_cut,
        unbounded,
        one_ratio,
    }
}

/// Whether an open window must close now: `tokens_ns` at the last tick, refilled at `budget`
/// for `since_ns`, minus what the sampled probes cost since.
pub fn must_close(tokens_ns: f64, budget: f64, since_ns: u64, spent_since_ns: f64) -> bool {
    tokens_ns + budget * since_ns as f64 - spent_since_ns <= 0.0
}

/// Timed runs a program's mean run time is taken from; fewer price a hit at its trap alone. A
/// program's first runs are slow (a thread's first call makes its state; on a VM a run may
/// lose its CPU to the host), and priced by the first launch alone, a job's first burst of
/// launches (153, with the driver launches inside them 349 hits) looked like 22 us a hit to the
/// watchdog, which closed the window mid-burst; the stretch after it, where the job launched no
/// more, was filled in at the burst's rate: 22,000-37,000 launches reported for 153, in half
/// the runs of a test on this VM (2026-12-07).
pub const MIN_TIMED_RUNS: u64 = 32;

/// Cost of one hit of a program: its measured BPF run time per run plus the trap constant.
/// Past this a thread's CPU time is too small a base to multiply.
pub const STRETCH_MAX: f64 = 10.0;

/// What a ns of CPU cost a thread in wall time over an interval in which it ran `exec_ns` and
/// waited `delay_ns` runnable for a CPU (the kernel's schedstat): 1 on a machine with a CPU to
/// spare. Waits after wake-ups are in the delay too, which errs towards a smaller budget.
pub fn stretch(exec_ns: u64, delay_ns: u64) -> f64 {
    if exec_ns == 0 {
        return 1.0;
    }
    (1.0 + delay_ns as f64 / exec_ns as f64).min(STRETCH_MAX)
}

pub fn cost_per_hit(run_time_ns: u64, run_count: u64, trap_ns: f64) -> f64 {
    if run_count < MIN_TIMED_RUNS {
        return trap_ns;
    }
    run_time_ns as f64 / run_count as f64 + trap_ns
}

#[cfg(test)]
mod tests {
    use super::*;

    const TICK: u64 = 100_000_000;

    /// A workload doing `work` ns of its own per launch, probed at `cost` ns per launch while
    /// a window is open; the watchdog closes the window when it has spent its share. Returns
    /// (launches seen, all launches, wall ns).
    fn simulate(g: &mut Gate, ticks: usize, work: f64, cost: f64) -> (u64, u64, f64) {
        simulate_with(g, ticks, |_| work, cost)
    }

    /// The same with the work per launch given for each tick.
    fn simulate_with(
        g: &mut Gate,
        ticks: usize,
        work_at: impl Fn(usize) -> f64,
        cost: f64,
    ) -> (u64, u64, f64) {
        let (mut seen, mut truth, mut wall) = (0u64, 0u64, 0.0);
        let mut open = true;
        for tick in 0..ticks {
            let work = work_at(tick);
            let dt = TICK as f64;
            let (mut on_ns, mut hits) = (0.0, 0u64);
            let mut closed = !open;
            if open {
                // Tokens left at the window's start, refilled while it runs.
                let rate = cost / (work + cost);
                let t_close = if rate <= g.budget() {
                    dt
                } else {
                    (g.tokens_ns().max(0.0) / (rate - g.budget())).min(dt)
                };
                on_ns = t_close;
                hits = (t_close / (work + cost)) as u64;
                closed = t_close < dt;
            }
            let off = dt - on_ns;
            let all = hits + (off / work) as u64;
            seen += hits;
            truth += all;
            wall += dt;
            let reopen = g.tick(TickObs {
                dt_ns: TICK,
                on_ns: on_ns as u64,
                sampled_hits: hits,
                launches: hits,
                cost_per_hit_ns: cost,
                trap_ns: 0.0,
                other_cost_ns: 0.0,
                closed: open && closed,
                ..TickObs::default()
            });
            open = reopen;
        }
        (seen, truth, wall)
    }

    #[test]
    fn budgets_parse() {
        assert_eq!(parse_budget("2%").unwrap(), 0.02);
        assert_eq!(parse_budget(DEFAULT_BUDGET_ARG).unwrap(), DEFAULT_BUDGET);
        assert_eq!(parse_budget("0.5%").unwrap(), 0.005);
        assert_eq!(parse_budget("0.1").unwrap(), 0.1);
        assert_eq!(parse_budget("100%").unwrap(), 1.0);
        assert_eq!(parse_budget("250%").unwrap(), 1.0);
        assert!(parse_budget("0%").is_err());
        assert!(parse_budget("-1%").is_err());
        assert!(parse_budget("two").is_err());
        // A bare number above 1 is not taken as a percentage, nor as more than 100%.
        assert!(parse_budget("2").unwrap_err().contains("2%"));
        assert_eq!(parse_budget("1").unwrap(), 1.0);
        assert!(parse_budget("NaN%").is_err());
        assert!(parse_budget("nan").is_err());
        assert_eq!(parse_budget("1e400%").unwrap(), 1.0);
        assert!(parse_budget("1e400").is_err());
    }

    #[test]
    fn cheap_probes_stay_on_and_counts_are_exact() {
        let mut g = Gate::new(0.02);
        // 1 launch per 100 us of work at 1.5 us: 1.5% < 2%.
        let (seen, truth, _) = simulate(&mut g, 50, 100_000.0, 1500.0);
        let e = g.estimate();
        assert_eq!(seen, truth);
        assert_eq!(e.duty, 1.0);
        assert_eq!(e.scale, 1.0);
        assert_eq!(e.rel_error, Some(0.0));
        assert!(e.overhead > 0.01 && e.overhead < 0.02, "{e:?}");
    }

    #[test]
    fn a_launch_storm_is_sampled_under_the_budget() {
        // 1M launches/s (1 us of work each) at 3.8 us per probed launch: 380% if always on.
        let mut g = Gate::new(0.02);
        let (seen, truth, _) = simulate(&mut g, 600, 1000.0, 3800.0);
        let e = g.estimate();
        // A steady storm: three windows a quarter of a second apart agree, then one 4 s later
        // and one every 8 s: 10 windows of a quarter of the bucket (5 ms) each in a minute,
        // 0.08% (whole buckets cost 0.34%).
        assert_eq!(e.windows, 10, "{e:?}");
        assert!(e.overhead > 0.0006 && e.overhead < 0.0011, "{e:?}");
        // Probed, the storm spends 79% of its time in probes: a window lasts ~25 ms.
        assert!(e.duty < 0.005, "{e:?}");
        let estimated = seen as f64 * e.scale;
        assert!(
            (estimated - truth as f64).abs() / (truth as f64) < 0.01,
            "{estimated} vs {truth} ({e:?})"
        );
        // 3.8 us of probe per 1 us of own work in a window: a cost 50% higher than measured
        // leaves no own time, so the rate has no upper bound and the report says so.
        assert_eq!(e.rel_error, None, "{e:?}");
        assert_eq!(e.no_bound, Some(NoBound::CostExceedsWork), "{e:?}");
    }

    #[test]
    fn a_moderate_rate_gets_a_bound_from_the_cost_uncertainty() {
        // 200k launches/s (5 us of work each) at 3 us per probed launch.
        let mut g = Gate::new(0.02);
        let (seen, truth, _) = simulate(&mut g, 600, 5000.0, 3000.0);
        let e = g.estimate();
        let estimated = seen as f64 * e.scale;
        assert!(
            (estimated - truth as f64).abs() / (truth as f64) < 0.01,
            "{estimated} vs {truth} ({e:?})"
        );
        // No spread between windows. A 50% higher cost leaves 3.5 us of the 5 us of own work
        // per launch (+43% on the rate), a 50% lower one 6.5 us (-23%): the bound is the
        // larger, on the ~96% of launches filled in.
        let err = e.rel_error.unwrap();
        assert!(err > 0.39 && err < 0.43, "{e:?}");
    }

    #[test]
    fn a_changing_rate_gets_windows_as_often_as_the_budget_allows() {
        // The same storm, its rate doubling and halving every 1.5 s: windows that disagree
        // come as soon as the bucket is full (two in the same phase agree and wait 4 s): more
        // than three times the windows of the steady storm, within the budget.
        let mut g = Gate::new(0.02);
        let (seen, truth, wall) = simulate_with(
            &mut g,
            600,
            |t| if (t / 15) % 2 == 0 { 1000.0 } else { 2000.0 },
            3800.0,
        );
        let e = g.estimate();
        // Over the trace: the budget plus at most one burst (the bucket's capacity).
        assert!(e.overhead <= 0.02 + 0.02 * BURST_S * 1e9 / wall, "{e:?}");
        assert!(e.overhead > 0.008, "{e:?}");
        assert!(e.windows > 27, "{e:?}");
        let estimated = seen as f64 * e.scale;
        assert!(
            (estimated - truth as f64).abs() / (truth as f64) < 0.1,
            "{estimated} vs {truth} ({e:?})"
        );
    }

    #[test]
    fn windows_start_at_a_quarter_bucket_and_grow_when_rates_disagree() {
        let g = Gate::new(0.02);
        assert_eq!(g.tokens_ns(), 0.02 * BURST_S * 1e9 * FIRST_SHARE);
        // A steady storm: every window agrees, none grows.
        let mut g = Gate::new(0.02);
        simulate(&mut g, 100, 1000.0, 3800.0);
        assert_eq!(g.share, FIRST_SHARE);
        // A rate that halves and doubles every half second: windows see different rates and
        // grow (three that happen to agree halve them again).
        let mut g = Gate::new(0.02);
        simulate_with(
            &mut g,
            100,
            |t| if (t / 5) % 2 == 0 { 1000.0 } else { 3000.0 },
            3800.0,
        );
        assert!(g.share >= 2.0 * FIRST_SHARE, "{}", g.share);
        // The same swings for 10 s, then a steady rate: agreeing windows halve the share back.
        let mut g = Gate::new(0.02);
        simulate_with(
            &mut g,
            700,
            |t| {
                if t < 100 && (t / 5) % 2 == 0 {
                    1000.0
                } else if t < 100 {
                    3000.0
                } else {
                    2000.0
                }
            },
            3800.0,
        );
        assert_eq!(g.share, FIRST_SHARE);
    }

    #[test]
    fn a_larger_budget_buys_closer_windows() {
        // The steady storm at 10%: windows of 25 ms of probes, 0.8 s then 1.6 s apart.
        let mut g = Gate::new(0.1);
        simulate(&mut g, 600, 1000.0, 3800.0);
        let e = g.estimate();
        assert!(e.windows > 30, "{e:?}");
        assert!(e.overhead > 0.012 && e.overhead < 0.025, "{e:?}");
    }

    #[test]
    fn the_first_burst_is_bounded_by_the_bucket() {
        let mut g = Gate::new(0.02);
        let (_, _, wall) = simulate(&mut g, 10, 1000.0, 3800.0);
        let e = g.estimate();
        // One second of trace: the full bucket (20 ms) plus the refill (20 ms).
        assert!(
            e.overhead * wall <= 0.02 * BURST_S * 1e9 + 0.02 * wall + 1.0,
            "{e:?}"
        );
    }

    #[test]
    fn no_sampling_at_full_budget() {
        let mut g = Gate::new(parse_budget("100%").unwrap());
        let (seen, truth, _) = simulate(&mut g, 20, 1000.0, 3800.0);
        assert_eq!(seen, truth);
        let e = g.estimate();
        assert_eq!(e.scale, 1.0);
        assert_eq!(e.rel_error, Some(0.0));
    }

    #[test]
    fn unsampled_probes_over_budget_keep_the_sampled_ones_off() {
        let mut g = Gate::new(0.02);
        let mut open = true;
        for _ in 0..10 {
            // The bucket is empty from the first tick on: the watchdog closes the window.
            open = g.tick(TickObs {
                dt_ns: TICK,
                on_ns: if open { TICK } else { 0 },
                sampled_hits: if open { 10 } else { 0 },
                launches: if open { 10 } else { 0 },
                cost_per_hit_ns: 1000.0,
                trap_ns: 0.0,
                other_cost_ns: 0.05 * TICK as f64,
                closed: open,
                ..TickObs::default()
            });
        }
        assert!(!open);
    }

    #[test]
    fn the_debt_of_unsampled_probes_is_bounded() {
        let mut g = Gate::new(0.02);
        let mut open = true;
        let mut tick = |g: &mut Gate, unsampled: f64| {
            open = g.tick(TickObs {
                dt_ns: TICK,
                on_ns: if open { TICK } else { 0 },
                closed: open,
                other_cost_ns: unsampled * TICK as f64,
                ..TickObs::default()
            });
            open
        };
        // A minute of copies costing 5% of the thread's time, then none.
        for _ in 0..600 {
            assert!(!tick(&mut g, 0.05));
        }
        // The debt is DEBT_S seconds of budget, paid back at the budget's pace, and then
        // the bucket fills: ~11 s, where the minute's whole debt would take ~100 s.
        let reopened = (0..200).position(|_| tick(&mut g, 0.0)).map(|t| t + 1);
        let at = (DEBT_S + BURST_S) * 1e9 / TICK as f64;
        assert!(
            reopened.is_some_and(|t| (t as f64 - at).abs() <= 2.0),
            "{reopened:?} ticks, {at} expected"
        );
    }

    #[test]
    fn a_thread_kept_waiting_for_a_cpu_stretches_each_ns_of_it() {
        assert_eq!(stretch(4_000, 0), 1.0);
        assert_eq!(stretch(4_000, 6_000), 2.5);
        assert_eq!(stretch(1, 1_000_000), STRETCH_MAX);
        assert_eq!(stretch(0, 1_000), 1.0);
    }

    #[test]
    fn the_bucket_fills_at_the_launching_threads_pace() {
        // Overdrawn by a probe that cannot be switched off, then a tick with none: what it put
        // back.
        let after = |stretch: f64| {
            let mut g = Gate::new(0.02);
            g.tick(TickObs {
                dt_ns: TICK,
                other_cost_ns: 1e12,
                ..TickObs::default()
            });
            let before = g.tokens_ns();
            g.tick(TickObs {
                dt_ns: TICK,
                stretch,
                ..TickObs::default()
            });
            g.tokens_ns() - before
        };
        let idle = after(1.0);
        assert!((idle - 0.02 * TICK as f64).abs() < 1.0, "{idle}");
        assert_eq!(after(0.0), idle, "no measure: the clock's pace");
        assert!((after(2.5) - idle / 2.5).abs() < 1.0);
    }

    #[test]
    fn the_watchdog_closes_an_empty_bucket() {
        assert!(!must_close(1e6, 0.02, 0, 0.5e6));
        assert!(must_close(1e6, 0.02, 0, 1.5e6));
        // 10 ms later the bucket has 0.2 ms more.
        assert!(!must_close(1e6, 0.02, 10_000_000, 1.1e6));
    }

    const EXACT: Cost = Cost { trap: None, k: 1.0 };

    fn slot(on_ns: u64, hits: u64, off_ns: u64) -> Slot {
        Slot {
            on_ns,
            cost_per_hit: 0.0,
            trap_ns: 0.0,
            hits,
            launches: hits,
            off_ns,
            steady_on: 0,
            steady_off: 0,
            steps_on: 0,
            steady_unknown: false,
            goes_on: false,
        }
    }

    /// A slot whose window saw `steady_on` copies and syncs and whose stretch off `steady_off`.
    /// One copy a step.
    fn steady(on_ns: u64, hits: u64, off_ns: u64, steady_on: u64, steady_off: u64) -> Slot {
        Slot {
            steady_on,
            steady_off,
            steps_on: steady_on,
            ..slot(on_ns, hits, off_ns)
        }
    }

    #[test]
    fn stretches_off_take_the_rate_of_the_windows_around_them() {
        // 1 launch/us before the gap, 3/us after: the gap is filled at 2/us, +/- 1/us.
        let f = fill(
            &[slot(1000, 1000, 0), slot(0, 0, 10_000), slot(1000, 3000, 0)],
            EXACT,
        );
        assert_eq!(f.estimated, 20_000.0);
        assert_eq!(f.spread, Some(10_000.0));
        // Even rates: no spread; the end takes the last window's rate.
        let f = fill(&[slot(1000, 1000, 4000), slot(1000, 1000, 5000)], EXACT);
        assert_eq!(f.estimated, 9000.0);
        assert_eq!(f.spread, Some(0.0));
        // One window: the rate is known, its error is not.
        let f = fill(&[slot(1000, 1000, 4000)], EXACT);
        assert_eq!(f.estimated, 4000.0);
        assert_eq!(f.spread, None);
    }

    #[test]
    fn a_quiet_start_does_not_dilute_a_later_storm() {
        // 2 s of imports with the probes on and nothing launched, then a storm of 1 launch/us
        // sampled 2% of the time: a whole-trace time ratio would put the storm's rate at a
        // third of what it is.
        let mut g = Gate::new(0.02);
        let mut seen = 0;
        let mut truth = 0;
        for _ in 0..20 {
            g.tick(TickObs {
                dt_ns: TICK,
                on_ns: TICK,
                ..TickObs::default()
            });
        }
        for _ in 0..50 {
            let on = TICK / 50;
            g.tick(TickObs {
                dt_ns: TICK,
                on_ns: on,
                sampled_hits: on / 1000,
                launches: on / 1000,
                cost_per_hit_ns: 0.0,
                trap_ns: 0.0,
                other_cost_ns: 0.0,
                closed: true,
                ..TickObs::default()
            });
            seen += on / 1000;
            truth += TICK / 1000;
        }
        let e = g.estimate();
        let est = seen as f64 * e.scale;
        assert!(
            (est - truth as f64).abs() / (truth as f64) < 0.01,
            "{est} vs {truth}: {e:?}"
        );
        assert!(e.rel_error.unwrap() < 0.01, "{e:?}");
    }

    #[test]
    fn a_stretch_whose_copies_were_not_all_counted_takes_the_time() {
        // The windows tell 100 launches per copy; the copy and sync probes were off for part of
        // the stretch between them (their own windows), and the 5 copies it counted say nothing
        // of its launches: 10,000 from the time (the windows' launch a ns), not 500.
        let gap = Slot {
            steady_unknown: true,
            ..steady(0, 0, 10_000, 0, 5)
        };
        let f = fill(
            &[
                steady(1000, 1000, 0, 10, 0),
                gap,
                steady(1000, 1000, 0, 10, 0),
            ],
            EXACT,
        );
        assert_eq!(f.estimated, 10_000.0);
        assert_eq!(f.by_calls, 0.0);
        // Through the gate: such a tick keeps no copies, on or off.
        let mut g = Gate::new(0.02);
        g.tick(TickObs {
            dt_ns: 1_000_000,
            on_ns: 500_000,
            sampled_hits: 100,
            launches: 100,
            steady_on: 10,
            steady_off: 5,
            steps_on: 10,
            stretch: 1.0,
            steady_unknown: true,
            ..Default::default()
        });
        let s = g.slots[0];
        assert_eq!((s.steady_on, s.steady_off, s.steps_on), (0, 0, 0));
        assert!(s.steady_unknown);
    }

    #[test]
    fn stretches_off_take_the_launches_per_copy_of_the_windows_beside_them() {
        // 100 launches per copy before the gap, 300 after, 50 copies in it: 10,000 +/- 5,000
        // whatever the time says.
        let f = fill(
            &[
                steady(1000, 1000, 0, 10, 0),
                steady(0, 0, 1_000_000, 0, 50),
                steady(1000, 3000, 0, 10, 0),
            ],
            EXACT,
        );
        assert_eq!(f.estimated, 10_000.0);
        assert_eq!(f.spread, Some(5_000.0));
        assert_eq!(f.by_calls, 10_000.0);
        // Each window's 10 copies may be one off: 10% of its ratio, on the 25 copies of the
        // stretch each side's ratio multiplies.
        assert!((f.steps_cut - (250.0f64.powi(2) + 750.0f64.powi(2)).sqrt()).abs() < 1e-6);
        // A window with too few copies to tell a ratio: the stretches beside it take the time.
        let f = fill(
            &[
                steady(1000, 1000, 0, 3, 0),
                steady(0, 0, 10_000, 0, 50),
                steady(1000, 1000, 0, 10, 0),
            ],
            EXACT,
        );
        assert_eq!(f.estimated, 10_000.0);
        assert_eq!(f.by_calls, 0.0);
        // A window before the job started (nothing in it) says nothing of the ratio: the
        // stretch takes the later window's. Its time rate would read half the launches there.
        let f = fill(
            &[
                steady(1000, 0, 0, 0, 0),
                steady(0, 0, 10_000, 0, 50),
                steady(1000, 2000, 0, 20, 0),
            ],
            EXACT,
        );
        assert_eq!(f.estimated, 5_000.0);
        assert_eq!(f.by_calls, 5_000.0);
        // A window open over two ticks is one: 1,000 launches per 10 copies, though neither
        // tick alone saw enough of them. Its first tick's time off came before it (the
        // attach), its last's after it. One window: no second ratio to bound it by.
        let first = Slot {
            goes_on: true,
            ..steady(900, 400, 100, 4, 1)
        };
        let f = fill(&[first, steady(1000, 600, 5000, 6, 10)], EXACT);
        assert_eq!(f.estimated, 1_100.0);
        assert_eq!(f.by_calls, 1_100.0);
        assert_eq!(f.spread, None);
        assert!(f.one_ratio);
        // Not going on, the two ticks are two windows with too few copies each: the time.
        let f = fill(
            &[steady(900, 400, 100, 4, 1), steady(1000, 600, 5000, 6, 10)],
            EXACT,
        );
        assert_eq!(f.by_calls, 0.0);
    }

    #[test]
    fn a_window_too_short_for_a_ratio_takes_its_neighbours_when_it_fits_it() {
        // Steps of 100 launches and a copy. The last window, cut short after 5 steps, fits the
        // ratio of the window before it: the stretches on both its sides are filled from their
        // copies at that ratio (one ratio: no second to bound it by).
        let f = fill(
            &[
                steady(1000, 1000, 0, 10, 0),
                steady(0, 0, 10_000, 0, 50),
                steady(500, 480, 0, 5, 0),
                steady(0, 0, 10_000, 0, 30),
            ],
            EXACT,
        );
        assert_eq!(f.estimated, 8_000.0);
        assert_eq!(f.by_calls, 8_000.0);
        assert!(f.one_ratio);
        // Between two windows that tell ratios, a short one that fits: each stretch by the
        // nearer of the two (on a tie, the earlier).
        let f = fill(
            &[
                steady(1000, 1000, 0, 10, 0),
                steady(0, 0, 10_000, 0, 10),
                steady(500, 650, 0, 5, 0),
                steady(0, 0, 10_000, 0, 10),
                steady(1000, 2000, 0, 10, 0),
                steady(0, 0, 10_000, 0, 10),
            ],
            EXACT,
        );
        assert_eq!(f.by_calls, f.estimated);
        // Before it: at 100 a copy; after it: 100 and 200 a copy, 1,500 +/- 500; at the end 200.
        assert_eq!(f.estimated, 1_000.0 + 1_500.0 + 2_000.0);
        // The two ratios are compared across it: the bound stands.
        assert!(!f.one_ratio && f.spread.is_some(), "{:?}", f.spread);
        // Launches with no copies (a storm between the steps): it does not fit, and the
        // stretches beside it are filled from the time.
        let f = fill(
            &[
                steady(1000, 1000, 0, 10, 0),
                steady(0, 0, 10_000, 0, 50),
                steady(1000, 5000, 0, 0, 0),
                steady(0, 0, 10_000, 0, 30),
            ],
            EXACT,
        );
        assert_eq!(f.by_calls, 0.0);
        assert_eq!(f.estimated, 30_000.0 + 50_000.0);
        // Nor do these, beside the same window: fewer launches than two steps' worth but still
        // no copies (the ratio would fill the copy-less stretch before it with nothing); two
        // steps' copies and launches a step and a third off what they make (within two steps,
        // but more than half: a window of a few steps cut at both edges says too little);
        // copies with no launches (an evaluation pass).
        for (short, copies_off) in [
            (steady(100, 150, 0, 0, 0), 0),
            (steady(100, 330, 0, 2, 0), 40),
            (steady(1000, 0, 0, 2, 0), 40),
        ] {
            let f = fill(
                &[
                    steady(1000, 1000, 0, 10, 0),
                    steady(0, 0, 10_000, 0, copies_off),
                    short,
                ],
                EXACT,
            );
            assert_eq!(f.by_calls, 0.0, "{short:?}");
        }
    }

    #[test]
    fn a_windows_edges_cut_a_step_not_a_copy() {
        // 16 copies in 8 steps (two a step) on each side: each window may be a step, 2 copies,
        // off; 10 copies between: 5 each side's ratio multiplies, 2 x 1/16 of 100 launches per
        // copy on each (one copy would be half that).
        let two_a_step = || Slot {
            steps_on: 8,
            ..steady(1000, 1600, 0, 16, 0)
        };
        let f = fill(
            &[two_a_step(), steady(0, 0, 10_000, 0, 10), two_a_step()],
            EXACT,
        );
        assert_eq!(f.estimated, 1_000.0);
        let each: f64 = 5.0 * 100.0 * 2.0 / 16.0;
        assert!(
            (f.steps_cut - (2.0 * each * each).sqrt()).abs() < 1e-6,
            "{}",
            f.steps_cut
        );
    }

    #[test]
    fn one_window_over_several_ticks_has_no_second_ratio_to_bound_it() {
        let mut g = Gate::new(0.02);
        let tick =
            |on_ns: u64, launches: u64, steady_on: u64, steady_off: u64, closed: bool| TickObs {
                dt_ns: TICK,
                on_ns,
                sampled_hits: launches,
                launches,
                cost_per_hit_ns: 1000.0,
                closed,
                steady_on,
                steady_off,
                steps_on: steady_on,
                ..TickObs::default()
            };
        g.tick(tick(TICK, 1000, 10, 0, false));
        g.tick(tick(TICK / 2, 500, 5, 5, true));
        g.tick(tick(0, 0, 0, 10, false));
        let e = g.estimate();
        assert_eq!(e.windows, 1, "{e:?}");
        // 15 copies off at 100 launches a copy: 1,500 more than the 1,500 seen.
        assert_eq!(e.scale, 2.0, "{e:?}");
        assert_eq!(e.by_calls, 1.0, "{e:?}");
        assert_eq!(e.rel_error, None, "{e:?}");
        assert_eq!(e.no_bound, Some(NoBound::OneRatio), "{e:?}");
    }

    #[test]
    fn a_storm_with_a_copy_every_step_is_estimated_whatever_its_probes_cost() {
        // Steps of 100 launches of 1 us of work and a copy, probed at 3.8 us a launch, while
        // the gate prices a hit at 2.5 us (a nested runtime's traps priced as one launch's):
        // a window's own time reads 2.3x what it is, and its rate in time less than half.
        let (work, cost, priced) = (1000.0, 3800.0, 2500.0);
        let mut g = Gate::new(0.02);
        let (mut seen, mut truth, mut open) = (0u64, 0u64, true);
        // A copy after every 100th launch of the job: windows cut steps where they fall.
        let copies = |from: u64, n: u64| (from + n) / 100 - from / 100;
        for _ in 0..600 {
            let dt = TICK as f64;
            let (mut on_ns, mut hits) = (0.0, 0u64);
            if open {
                let rate = priced / (work + cost);
                let t_close = (g.tokens_ns().max(0.0) / (rate - g.budget())).min(dt);
                on_ns = t_close;
                hits = (t_close / (work + cost)) as u64;
            }
            let off = ((dt - on_ns) / work) as u64;
            let (steady_on, steady_off) = (copies(truth, hits), copies(truth + hits, off));
            seen += hits;
            truth += hits + off;
            open = g.tick(TickObs {
                dt_ns: TICK,
                on_ns: on_ns as u64,
                sampled_hits: hits,
                launches: hits,
                cost_per_hit_ns: priced,
                trap_ns: 0.0,
                other_cost_ns: 0.0,
                closed: open,
                steady_on,
                steady_off,
                steps_on: steady_on,
                stretch: 1.0,
                steady_unknown: false,
            });
        }
        let e = g.estimate();
        let estimated = seen as f64 * e.scale;
        assert!(
            (estimated - truth as f64).abs() / (truth as f64) < 0.05,
            "{estimated} vs {truth} ({e:?})"
        );
        assert!(e.by_calls > 0.99, "{e:?}");
        // The cost's uncertainty does not enter: the bound is the windows' disagreement.
        let err = e.rel_error.unwrap_or_else(|| panic!("no bound: {e:?}"));
        assert!(err < 0.1, "{e:?}");
        assert!(
            (estimated - truth as f64).abs() / (truth as f64) <= err,
            "{estimated} vs {truth} ({e:?})"
        );
    }

    #[test]
    fn cost_per_hit_adds_the_trap() {
        assert_eq!(cost_per_hit(32_000, 32, 700.0), 1700.0);
        assert_eq!(cost_per_hit(0, 0, 700.0), 700.0);
        // One cold run says nothing of the next ones.
        assert_eq!(cost_per_hit(21_000, 1, 700.0), 700.0);
    }
}
