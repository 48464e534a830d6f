//! gputrace's own cost in this trace (issue 6), and what the overhead budget sampled.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Overhead {
    /// `--max-overhead` as a fraction (0.02 for 2%).
    pub budget: f64,
    /// Estimated share of the traced threads' time spent in gputrace's probes: the programs'
    /// measured run time plus a calibrated trap cost per uprobe hit, over the threads' alive time.
    pub estimated: f64,
    /// The same for the thread that paid most for CUDA probes, when CUDA calls were traced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worst_thread: Option<ThreadOverhead>,
    /// All probe hits in the window and their estimated cost, machine-wide (tracepoints run
    /// for every thread, traced or not, and return early for the others).
    pub probe_hits: u64,
    pub probe_cost_ns: u64,
    /// The part of that cost paid by the traced threads: per program, the hits the report
    /// counts for them (syscalls, CUDA calls seen, CPU samples) at the program's cost per hit;
    /// the low-rate scheduler and process programs are charged in full (an upper bound).
    #[serde(default)]
    pub traced_cost_ns: u64,
    /// Per program, costliest first.
    pub programs: Vec<ProgramCost>,
    /// Whether the uprobe trap costs were measured at startup on this machine (false: the
    /// built-in constants).
    #[serde(default)]
    pub trap_measured: bool,
    /// Set when the budget switched the high-rate probes on and off: their counts are scaled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampled: Option<ProbeSampling>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ThreadOverhead {
    pub pid: u32,
    pub tid: u32,
    pub estimated: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ProgramCost {
    pub program: String,
    pub hits: u64,
    /// Measured by the kernel (kernel.bpf_stats_enabled); 0 when the statistics are off.
    pub bpf_ns_per_hit: f64,
    /// The trap outside the program: for uprobes and uretprobes measured at startup
    /// (`trap_measured`), else a built-in constant.
    pub trap_ns_per_hit: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ProbeSampling {
    /// Which probes were switched on and off, and which figures are scaled.
    pub probes: String,
    pub scaled: String,
    /// Share of the window the sampled probes were attached.
    pub duty: f64,
    /// Scaled figures = seen x this.
    pub scale: f64,
    /// Relative error bound of a scaled count; None when it cannot be told (one window, or
    /// probes that cost more than the work they sampled).
    pub rel_error: Option<f64>,
    pub windows: u64,
    /// Calls the sampled probes saw before scaling.
    pub seen_hits: u64,
}

impl Overhead {
    /// One line for the terminal and HTML reports.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "gputrace overhead: ~{:.2}% of traced threads' time (estimated, {} probe hits, budget {}%)",
            self.estimated * 100.0,
            self.probe_hits,
            pct(self.budget)
        );
        if let Some(w) = &self.worst_thread {
            s.push_str(&format!(
                "; busiest CUDA thread {} ~{:.2}%",
                w.tid,
                w.estimated * 100.0
            ));
        }
        s
    }

    pub fn sampling_line(&self) -> Option<String> {
        let s = self.sampled.as_ref()?;
        let err = match s.rel_error {
            Some(e) => format!("+/-{:.0}%", e * 100.0),
            None if s.windows < 2 => "error unknown (one window)".into(),
            None => "error unknown: the probes cost more than the work they sampled".into(),
        };
        Some(format!(
            "ESTIMATED: {} probed {:.1}% of the time to stay in budget; {} are scaled x{:.1} ({err})",
            s.probes,
            s.duty * 100.0,
            s.scaled,
            s.scale
        ))
    }
}

fn pct(f: f64) -> String {
    let p = f * 100.0;
    if (p - p.round()).abs() < 1e-9 {
        format!("{p:.0}")
    } else {
        format!("{p}")
    }
}
