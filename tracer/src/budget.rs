//! The overhead budget (issue 6): pure control logic, no BPF.
//!
//! Overhead here is the share of a traced thread's time spent in gputrace's probes: the BPF
//! programs' own run time (measured by the kernel, `kernel.bpf_stats_enabled`) plus the trap
//! that takes a uprobe into the kernel and back (a calibrated constant: the kernel's statistics
//! do not see it). A budget of 2% keeps that share under 2% by switching the high-rate probes
//! (CUDA launches) on and off in windows of one tick; counts seen in the on-windows are scaled
//! up by total time / on time, with an error bound from how much the windows' rates vary.
//!
//! The decision is a leaky bucket over the whole trace: a window opens only when the cost it is
//! expected to add (the last on-window's cost rate) still fits under `budget x elapsed`. Hits
//! are summed over all threads and charged to one thread, so the control is conservative when
//! several threads launch (each thread's share is at most the total's).

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

/// One tick as the probes saw it.
#[derive(Debug, Clone, Copy, Default)]
pub struct TickObs {
    /// Wall time of the tick (ns).
    pub dt_ns: u64,
    /// Hits of the sampled probes in the tick (0 when they were off).
    pub sampled_hits: u64,
    /// Cost of one sampled hit (ns): BPF run time per hit plus the trap constants.
    pub cost_per_hit_ns: f64,
    /// Cost of the probes that are never switched off, in the tick (ns).
    pub other_cost_ns: f64,
}

#[derive(Debug, Clone)]
pub struct Gate {
    budget: f64,
    /// Whether the sampled probes were on during the tick being observed.
    on: bool,
    elapsed_ns: u64,
    on_ns: u64,
    spent_ns: f64,
    /// The part of `spent_ns` paid by the sampled probes (only inside on-windows).
    sampled_spent_ns: f64,
    /// Cost per ns of wall time while on, from the last on-window.
    on_cost_rate: Option<f64>,
    /// (the workload's own time, hits) of each on-tick: the samples of the rate. The probes'
    /// cost is taken out of the window: a probed workload runs slower, and the rate it would
    /// have had unprobed is what the off-windows are scaled by.
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
    /// The sampled probes start on: the first tick measures their rate.
    pub fn new(budget: f64) -> Gate {
        Gate {
            budget,
            on: true,
            elapsed_ns: 0,
            on_ns: 0,
            spent_ns: 0.0,
            sampled_spent_ns: 0.0,
            on_cost_rate: None,
            windows: Vec::new(),
        }
    }

    pub fn is_on(&self) -> bool {
        self.on
    }

    pub fn samples(&self) -> bool {
        self.budget < NO_SAMPLING
    }

    /// Takes one tick's observation; returns whether the sampled probes should be on for the
    /// next tick.
    pub fn tick(&mut self, o: TickObs) -> bool {
        self.elapsed_ns += o.dt_ns;
        let sampled_cost = o.sampled_hits as f64 * o.cost_per_hit_ns;
        self.spent_ns += sampled_cost + o.other_cost_ns;
        if self.on {
            self.on_ns += o.dt_ns;
            self.sampled_spent_ns += sampled_cost;
            let own = (o.dt_ns as f64 - sampled_cost).max(0.0) as u64;
            self.windows.push((own, o.sampled_hits));
            if o.dt_ns > 0 {
                self.on_cost_rate = Some(sampled_cost / o.dt_ns as f64);
            }
        }
        if !self.samples() {
            self.on = true;
            return true;
        }
        let next = o.dt_ns.max(1) as f64;
        let rate = self.on_cost_rate.unwrap_or(0.0);
        // Open the next window only if its expected cost still fits: the budget is a ceiling
        // over every prefix of the trace, not just an average at the end.
        let allowed = self.budget * (self.elapsed_ns as f64 + next);
        self.on = self.spent_ns + rate * next <= allowed;
        self.on
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
        let scale = if own_on <= 0.0 {
            0.0
        } else {
            own_total / own_on
        };
        Estimate {
            duty,
            scale,
            rel_error: rate_error(&self.windows, 1.0 / scale.max(1.0)),
            windows: self.windows.len(),
            overhead,
        }
    }
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

    fn storm(gate: &mut Gate, ticks: usize, hits_per_tick_on: u64, cost: f64) -> u64 {
        let mut seen = 0;
        for _ in 0..ticks {
            let hits = if gate.is_on() { hits_per_tick_on } else { 0 };
            seen += hits;
            gate.tick(TickObs {
                dt_ns: TICK,
                sampled_hits: hits,
                cost_per_hit_ns: cost,
                other_cost_ns: 0.0,
            });
        }
        seen
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
        // 1000 hits per 100 ms at 1.5 us: 1.5 ms per 100 ms = 1.5% < 2%.
        let seen = storm(&mut g, 50, 1000, 1500.0);
        let e = g.estimate();
        assert_eq!(seen, 50_000);
        assert_eq!(e.duty, 1.0);
        assert_eq!(e.scale, 1.0);
        assert_eq!(e.rel_error, Some(0.0));
        assert!((e.overhead - 0.015).abs() < 1e-9, "{e:?}");
    }

    #[test]
    fn a_launch_storm_is_sampled_under_the_budget() {
        // 1M launches/s at 1.5 us each: 150% of the thread's time if always on.
        let mut g = Gate::new(0.02);
        let ticks = 600; // one minute
        let seen = storm(&mut g, ticks, 100_000, 1500.0);
        let e = g.estimate();
        assert!(e.overhead <= 0.02 + 1e-9, "{e:?}");
        assert!(
            e.overhead > 0.015,
            "the budget should be used, not wasted: {e:?}"
        );
        assert!(e.duty < 0.05 && e.duty > 0.005, "{e:?}");
        // The workload: 1 us of own work per launch; probed, each launch costs 1.5 us more, so
        // an on-tick sees 40,000 launches, an off-tick 100,000.
        let _ = seen;
        let mut g = Gate::new(0.02);
        let (mut seen, mut truth) = (0u64, 0u64);
        for _ in 0..ticks {
            let n = if g.is_on() { 40_000 } else { 100_000 };
            truth += n;
            let hits = if g.is_on() { n } else { 0 };
            seen += hits;
            g.tick(TickObs {
                dt_ns: TICK,
                sampled_hits: hits,
                cost_per_hit_ns: 1500.0,
                other_cost_ns: 0.0,
            });
        }
        let e = g.estimate();
        let estimated = seen as f64 * e.scale;
        assert!(
            (estimated - truth as f64).abs() / (truth as f64) < 1e-6,
            "{estimated} vs {truth}"
        );
        // A constant rate: no spread between windows.
        assert!(e.rel_error.unwrap() < 1e-9, "{e:?}");
    }

    #[test]
    fn the_budget_holds_for_every_prefix_after_the_first_window() {
        let mut g = Gate::new(0.02);
        for i in 0..300u64 {
            let hits = if g.is_on() { 100_000 } else { 0 };
            g.tick(TickObs {
                dt_ns: TICK,
                sampled_hits: hits,
                cost_per_hit_ns: 1500.0,
                other_cost_ns: 0.0,
            });
            let e = g.estimate();
            // The first window is spent before any rate is known; from then on the expected
            // cost of a window is checked before it opens.
            let first = 100_000.0 * 1500.0;
            let limit = 0.02 * ((i + 1) * TICK) as f64;
            assert!(
                e.overhead * ((i + 1) * TICK) as f64 <= limit.max(first) + 1.0,
                "tick {i}: {e:?}"
            );
        }
    }

    #[test]
    fn no_sampling_at_full_budget() {
        let mut g = Gate::new(parse_budget("100%").unwrap());
        let seen = storm(&mut g, 20, 100_000, 1500.0);
        assert_eq!(seen, 2_000_000);
        let e = g.estimate();
        assert_eq!(e.scale, 1.0);
        assert_eq!(e.rel_error, Some(0.0));
    }

    #[test]
    fn unsampled_probes_over_budget_keep_the_sampled_ones_off() {
        let mut g = Gate::new(0.02);
        g.tick(TickObs {
            dt_ns: TICK,
            sampled_hits: 10,
            cost_per_hit_ns: 1000.0,
            other_cost_ns: 0.05 * TICK as f64,
        });
        assert!(!g.is_on());
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
