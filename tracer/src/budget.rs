//! The overhead budget (issue 6): pure control logic, no BPF.
//!
//! Overhead here is the share of a traced thread's time spent in gputrace's probes: the BPF
//! programs' own run time (measured by the kernel, `kernel.bpf_stats_enabled`) plus the trap
//! that takes a uprobe into the kernel and back (a calibrated constant: the kernel's statistics
//! do not see it). A budget of 2% keeps that share under 2% by switching the high-rate probes
//! (CUDA launches) on and off in windows; counts seen in the on-windows are scaled up by the
//! workload's own time over its own time inside the windows, with an error bound from how much
//! the windows' rates vary.
//!
//! The control is a token bucket of probe time: it fills at `budget` per unit of wall time up
//! to one second's worth ([`BURST_S`]); a window opens at a tick when the bucket is full
//! and a watchdog closes it as soon as the bucket is empty ([`must_close`]), so a storm that
//! starts while the probes are on costs at most one bucket. Hits are summed over all threads
//! and charged to one thread, so the control is conservative when several threads launch.

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

/// Budgets at or above this never sample: every probe stays on and every count is exact.
pub const NO_SAMPLING: f64 = 1.0;

/// Parses `2%`, `0.5%`, `100%` or a fraction like `0.02`.
pub fn parse_budget(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let v = match t.strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().map(|v| v / 100.0),
        None => t.parse::<f64>(),
    }
    .map_err(|_| format!("`{s}` is not an overhead budget (try 2% or 0.5%)"))?;
    if !(v > 0.0 && v.is_finite()) {
        return Err(format!("`{s}`: the overhead budget must be above 0%"));
    }
    Ok(v.min(NO_SAMPLING))
}

/// How far the cost per hit may be off (the trap constants vary with the machine's state: the
/// calibration runs spread by ~5%, runs under heavy load by more). Scaled counts inherit it:
/// their own time inside a window is the window minus the probes' cost, and in a storm the
/// cost is most of the window.
pub const COST_UNCERTAINTY: f64 = 0.25;

/// Seconds of budget a burst may spend at once: the token bucket's capacity. A window of the
/// sampled probes lasts until the bucket is empty (closed by a watchdog that checks every few
/// ms), and a new one opens when it is full again: at 2% and a storm costing 80% of the
/// thread, windows of ~25 ms every ~1 s.
pub const BURST_S: f64 = 1.0;

/// One tick as the probes saw it.
#[derive(Debug, Clone, Copy, Default)]
pub struct TickObs {
    /// Wall time of the tick (ns).
    pub dt_ns: u64,
    /// How long in the tick the sampled probes were attached (ns).
    pub on_ns: u64,
    /// Hits of the sampled probes in the tick.
    pub sampled_hits: u64,
    /// Cost of one sampled hit (ns): BPF run time per hit plus the trap constants.
    pub cost_per_hit_ns: f64,
    /// Cost of the probes that are never switched off, in the tick (ns).
    pub other_cost_ns: f64,
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
    /// The part of `spent_ns` paid by the sampled probes (only inside on-windows).
    sampled_spent_ns: f64,
    /// (the workload's own time, hits) of each tick with the probes on: the samples of the
    /// rate. The probes' cost is taken out of the window: a probed workload runs slower, and
    /// the rate it would have had unprobed is what the off-time is scaled by.
    windows: Vec<(u64, u64)>,
}

/// What the windows add up to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    /// Share of the time the sampled probes were on.
    pub duty: f64,
    /// Multiply counts seen by the sampled probes by this.
    pub scale: f64,
    /// Relative error bound (95%) of a scaled count; 0 when exact; None when it cannot be
    /// told (fewer than two windows).
    pub rel_error: Option<f64>,
    pub windows: usize,
    /// Estimated share of the thread's time spent in probes so far.
    pub overhead: f64,
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
            sampled_spent_ns: 0.0,
            windows: Vec::new(),
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
    /// cost since the last tick exceeds this plus the refill since then.
    pub fn tokens_ns(&self) -> f64 {
        self.tokens_ns
    }

    /// Takes one tick's observation; returns whether a closed window should open for the next
    /// tick (an open one stays open until the watchdog closes it).
    pub fn tick(&mut self, o: TickObs) -> bool {
        self.elapsed_ns += o.dt_ns;
        let sampled_cost = o.sampled_hits as f64 * o.cost_per_hit_ns;
        self.spent_ns += sampled_cost + o.other_cost_ns;
        self.tokens_ns = (self.tokens_ns + self.budget * o.dt_ns as f64).min(self.capacity())
            - sampled_cost
            - o.other_cost_ns;
        let on_ns = o.on_ns.min(o.dt_ns);
        if on_ns > 0 {
            self.on_ns += on_ns;
            self.sampled_spent_ns += sampled_cost;
            let own = (on_ns as f64 - sampled_cost).max(0.0) as u64;
            self.windows.push((own, o.sampled_hits));
        }
        if !self.samples() {
            return true;
        }
        // Full: each window costs its attach and detach (ms with the return probe firing
        // alone), so few long windows beat many short ones.
        self.tokens_ns >= self.capacity() * 0.99
    }

    pub fn estimate(&self) -> Estimate {
        let total = self.elapsed_ns.max(1) as f64;
        let overhead = self.spent_ns / total;
        if self.on_ns >= self.elapsed_ns {
            return Estimate {
                duty: 1.0,
                scale: 1.0,
                rel_error: Some(0.0),
                windows: self.windows.len(),
                overhead,
            };
        }
        let duty = self.on_ns as f64 / total;
        // In the workload's own time (probe cost taken out): exact for one launching thread;
        // with several, the cost is charged to one and the scale comes out somewhat high.
        let own_total = (total - self.sampled_spent_ns).max(1.0);
        let own_on = self.on_ns as f64 - self.sampled_spent_ns;
        // Never below the plain time ratio's floor of 1; when the cost ate the whole window
        // (hits counted during an attach or detach), fall back to the time ratio.
        let scale = if own_on <= 0.0 {
            1.0 / duty.max(1e-9)
        } else {
            (own_total / own_on).max(1.0)
        };
        // Spread between windows, and the bias a wrong cost per hit gives the own time.
        let bias = if own_on > 0.0 {
            COST_UNCERTAINTY * self.sampled_spent_ns / own_on
        } else {
            1.0
        };
        Estimate {
            duty,
            scale,
            rel_error: rate_error(&self.windows, 1.0 / scale.max(1.0))
                .map(|spread| (spread * spread + bias * bias).sqrt()),
            windows: self.windows.len(),
            overhead,
        }
    }
}

/// Whether an open window must close now: `tokens_ns` at the last tick, refilled at `budget`
/// for `since_ns`, minus what the sampled probes cost since.
pub fn must_close(tokens_ns: f64, budget: f64, since_ns: u64, spent_since_ns: f64) -> bool {
    tokens_ns + budget * since_ns as f64 - spent_since_ns <= 0.0
}

/// 95% relative error of a total estimated from windows that cover `duty` of the time: the
/// standard error of the mean window rate with the finite-population correction (the windows
/// are a sample of the trace's ticks, drawn without replacement).
pub fn rate_error(windows: &[(u64, u64)], duty: f64) -> Option<f64> {
    let rates: Vec<f64> = windows
        .iter()
        .filter(|(d, _)| *d > 0)
        .map(|&(d, h)| h as f64 / d as f64)
        .collect();
    let n = rates.len();
    if n < 2 {
        return None;
    }
    let mean = rates.iter().sum::<f64>() / n as f64;
    if mean <= 0.0 {
        return Some(0.0);
    }
    let var = rates.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    let fpc = (1.0 - duty).clamp(0.0, 1.0).sqrt();
    Some(1.96 * var.sqrt() / (n as f64).sqrt() * fpc / mean)
}

/// Cost of one hit of a program: its measured BPF run time per run plus the trap constant.
pub fn cost_per_hit(run_time_ns: u64, run_count: u64, trap_ns: f64) -> f64 {
    if run_count == 0 {
        return trap_ns;
    }
    run_time_ns as f64 / run_count as f64 + trap_ns
}

#[cfg(test)]
mod tests {
    use super::*;

    const TICK: u64 = 100_000_000;

    /// A workload doing `work` ns of its own per launch, probed at `cost` ns per launch while
    /// a window is open; the watchdog closes the window when the bucket is empty. Returns
    /// (launches seen, all launches, wall ns).
    fn simulate(g: &mut Gate, ticks: usize, work: f64, cost: f64) -> (u64, u64, f64) {
        let (mut seen, mut truth, mut wall) = (0u64, 0u64, 0.0);
        let mut open = true;
        for _ in 0..ticks {
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
                cost_per_hit_ns: cost,
                other_cost_ns: 0.0,
            });
            // A window the watchdog did not close stays open; a closed one reopens when the
            // gate says so.
            open = !closed || reopen;
        }
        (seen, truth, wall)
    }

    #[test]
    fn budgets_parse() {
        assert_eq!(parse_budget("2%").unwrap(), 0.02);
        assert_eq!(parse_budget("0.5%").unwrap(), 0.005);
        assert_eq!(parse_budget("0.1").unwrap(), 0.1);
        assert_eq!(parse_budget("100%").unwrap(), 1.0);
        assert_eq!(parse_budget("250%").unwrap(), 1.0);
        assert!(parse_budget("0%").is_err());
        assert!(parse_budget("-1%").is_err());
        assert!(parse_budget("two").is_err());
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
        let (seen, truth, wall) = simulate(&mut g, 600, 1000.0, 3800.0);
        let e = g.estimate();
        // Over the trace: the budget plus at most one burst (the bucket's capacity).
        assert!(e.overhead <= 0.02 + 0.02 * BURST_S * 1e9 / wall, "{e:?}");
        assert!(
            e.overhead > 0.015,
            "the budget should be used, not wasted: {e:?}"
        );
        // Probed, the storm spends 79% of its time in probes: 2% / 79% = 2.5% of the time on.
        assert!(e.duty < 0.03, "{e:?}");
        let estimated = seen as f64 * e.scale;
        assert!(
            (estimated - truth as f64).abs() / (truth as f64) < 0.01,
            "{estimated} vs {truth} ({e:?})"
        );
        // No spread between windows; the bound is the cost uncertainty: 3.8 us of probe per
        // 1 us of own work in a window, 25% of which is 0.95 of the own time.
        let err = e.rel_error.unwrap();
        assert!((err - 0.95).abs() < 0.05, "{e:?}");
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
            open = g.tick(TickObs {
                dt_ns: TICK,
                on_ns: if open { TICK } else { 0 },
                sampled_hits: if open { 10 } else { 0 },
                cost_per_hit_ns: 1000.0,
                other_cost_ns: 0.05 * TICK as f64,
            });
        }
        assert!(!open);
    }

    #[test]
    fn the_watchdog_closes_an_empty_bucket() {
        assert!(!must_close(1e6, 0.02, 0, 0.5e6));
        assert!(must_close(1e6, 0.02, 0, 1.5e6));
        // 10 ms later the bucket has 0.2 ms more.
        assert!(!must_close(1e6, 0.02, 10_000_000, 1.1e6));
    }

    #[test]
    fn rate_error_reflects_spread_and_coverage() {
        assert_eq!(rate_error(&[(TICK, 100)], 0.1), None);
        let even = [(TICK, 100), (TICK, 100), (TICK, 100)];
        assert_eq!(rate_error(&even, 0.1), Some(0.0));
        let uneven = [(TICK, 50), (TICK, 150), (TICK, 100), (TICK, 100)];
        let e = rate_error(&uneven, 0.1).unwrap();
        // sd = 40.8, mean 100, n = 4: 1.96 * 40.8 / 2 * sqrt(0.9) = 0.379
        assert!((e - 0.3795).abs() < 0.001, "{e}");
        // Windows that covered everything leave no sampling error.
        assert_eq!(rate_error(&uneven, 1.0), Some(0.0));
    }

    #[test]
    fn cost_per_hit_adds_the_trap() {
        assert_eq!(cost_per_hit(3000, 10, 700.0), 1000.0);
        assert_eq!(cost_per_hit(0, 0, 700.0), 700.0);
    }
}
