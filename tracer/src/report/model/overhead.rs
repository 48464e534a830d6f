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
    /// The thread (alive 100 ms or more) that paid the largest share of its time for all
    /// probes: syscall and scheduler tracepoints, the CPU sampler, CUDA probes. What the budget
    /// is a ceiling on; the CUDA launch probes are windowed and the syscall tracepoints taken
    /// off a syscall storm to keep it there, the other probes stay on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub costliest_thread: Option<ThreadCost>,
    /// The threads too short-lived to be the costliest (alive under 100 ms), together: in a
    /// loop of short processes (a shell loop, a job that shells out per item) what the job is
    /// made of, and shorter than the budget's gates take to act.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub short_lived: Option<ShortLived>,
    /// All probe hits in the window and their estimated cost, machine-wide (tracepoints run
    /// for every thread, traced or not, and return early for the others).
    pub probe_hits: u64,
    pub probe_cost_ns: u64,
    /// The part of that cost paid by the traced threads: per program, the hits it counted as
    /// theirs (`ProgramCost::traced_hits`: every syscall of theirs, those whose rows were not
    /// kept included) or, for programs that do not count them, the hits the report counts for
    /// them (CUDA calls seen, CPU samples), at the program's cost per hit; the low-rate
    /// process programs are charged in full (an upper bound).
    #[serde(default)]
    pub traced_cost_ns: u64,
    /// Every traced thread's time alive in the window, summed: what `estimated` is a share
    /// of. Under process churn it counts the threads the report neither lists nor names (their
    /// time folded into their processes', or of processes not remembered). None where the
    /// per-thread time was not kept; `estimated` is then a share of the listed threads' time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traced_alive_ns: Option<u64>,
    /// Per program, costliest first.
    pub programs: Vec<ProgramCost>,
    /// Whether the uprobe trap costs were measured at startup on this machine (false: the
    /// built-in constants).
    #[serde(default)]
    pub trap_measured: bool,
    /// Whether the syscall tracepoints' cost outside their programs (the kernel's slow path
    /// and the dispatch) was measured at startup (false: a built-in constant).
    #[serde(default)]
    pub syscall_trap_measured: bool,
    /// What the kernel's BPF statistics (on for a tenth of the trace or less, to time the
    /// programs) cost a program run while on: the part inside the run time they report (in
    /// each program's `bpf_ns_per_hit`), and the part outside it (charged to the hits they
    /// timed, `stats_ns_per_hit`). Measured at startup on an empty program; 0: not measured.
    #[serde(default)]
    pub stats_inside_ns: f64,
    #[serde(default)]
    pub stats_outside_ns: f64,
    /// Set when the budget switched the high-rate probes on and off: their counts are scaled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampled: Option<ProbeSampling>,
    /// Set when the budget switched the CUDA copy and sync probes on and off too (their cost
    /// alone passed it): their counts, times and bytes are scaled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampled_calls: Option<ProbeSampling>,
    /// Set when the budget took the syscall tracepoints off a syscall storm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syscalls_off: Option<SyscallsOff>,
    /// Set when block requests came fast enough to be sampled (`accounting::block_sample`):
    /// the block I/O rows are then estimates (each row's `sampled` says from how many).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_sampled: Option<BlockSampling>,
    /// Set when some syscalls went untimed (a thread's fast run of one syscall): their
    /// latency figures are then estimates (`SyscallStat::timed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syscalls_timed: Option<SyscallTiming>,
    /// gputrace's own process: its CPU time and memory. Not in `estimated` (its threads are
    /// not the traced ones) and not capped by the budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub own: Option<OwnCost>,
    /// The estimate checked against what the CPU sampler saw.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seen_by_sampler: Option<SamplerCheck>,
}

/// The probes as the CPU sampler caught them running on the traced threads: a measurement,
/// where `estimated` is a model (hits times costs per hit). Low by the scheduler's programs,
/// which run with interrupts off and are never caught.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SamplerCheck {
    /// The traced threads' CPU samples, and those that caught a probe running.
    pub samples: u64,
    pub in_probes: u64,
    /// `in_probes / samples`, and its standard error (binomial).
    pub share: f64,
    pub error: f64,
    /// What the estimate puts the probes at, over the CPU time the samples stand for (one
    /// sampling period each): the figure `share` measures.
    pub estimated: f64,
}

/// Probe samples below which the sampler's share is too coarse to question the estimate by.
pub const SAMPLER_MIN_IN_PROBES: u64 = 20;

impl SamplerCheck {
    /// From the sampler's counts and the estimate's probe time (ns) at `frequency_hz`.
    pub fn new(samples: u64, in_probes: u64, frequency_hz: u64, probe_ns: u64) -> Option<Self> {
        if samples == 0 || frequency_hz == 0 {
            return None;
        }
        let n = samples as f64;
        let share = in_probes as f64 / n;
        let on_cpu_ns = n * 1e9 / frequency_hz as f64;
        Some(SamplerCheck {
            samples,
            in_probes,
            share,
            error: (share * (1.0 - share) / n).sqrt(),
            estimated: probe_ns as f64 / on_cpu_ns,
        })
    }

    /// Whether the sampler caught the probes running clearly more often than the estimate
    /// says they ran: by more than two standard errors and a quarter, over enough samples.
    pub fn estimate_low(&self) -> bool {
        self.in_probes >= SAMPLER_MIN_IN_PROBES
            && self.share - 2.0 * self.error > 1.25 * self.estimated
    }
}

/// The shortest window [`Overhead::own_line`] warns of gputrace's own CPU over.
pub const OWN_MIN_WINDOW_NS: u64 = 10_000_000_000;

/// The part of a thread's cost ([`ThreadCost::parts`]) that the probes of the child processes
/// it waited for added to its waits.
pub const WAITED_PART: &str = "waited-for children's probes";

/// What gputrace's own threads took (`overhead::own`): user and system CPU time, all threads.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct OwnCost {
    /// Before the window opened: loading, verifying and attaching the programs, seeding.
    pub attach_cpu_ns: u64,
    /// In the window: the event loop, the passes over exited processes, the budget's ticks.
    pub window_cpu_ns: u64,
    /// From the window's end until the report was made (reading the maps, symbolising).
    pub report_cpu_ns: u64,
    /// `window_cpu_ns` over the window: the share of one CPU (0.1: a tenth of one).
    pub cpu_share: f64,
    /// The machine's CPUs: `cpu_share / cpus` of all its CPU time.
    pub cpus: u32,
    /// Peak resident memory by the window's end, and by the report's (before its files are
    /// written).
    pub peak_rss_window_bytes: u64,
    pub peak_rss_bytes: u64,
    /// Kernel memory its BPF maps held as the window ended (not in its resident memory).
    #[serde(default)]
    pub kernel_maps_bytes: u64,
    /// Whether the large hash maps took their memory as they filled (Linux 6.1 and later),
    /// not all at the load (`prealloc`).
    #[serde(default)]
    pub maps_as_used: bool,
}

impl OwnCost {
    /// The share of the machine's CPU time.
    pub fn machine_share(&self) -> f64 {
        self.cpu_share / f64::from(self.cpus.max(1))
    }
}

/// A thread's run of one syscall whose calls came within `gap_us` of each other on average
/// over a window of 256 has each call of the next window timed with a chance of 1 in `one_in`, and a timed one counts that
/// many times in the latency sums and histograms: an untimed call reads no clock at its entry
/// and exit. Counts, bytes and errors stay exact.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SyscallTiming {
    pub one_in: u64,
    /// Calls that went untimed.
    pub untimed_calls: u64,
    pub gap_us: u64,
}

/// Block requests counted 1 in `2^k` while traced requests came at over `above_per_s` a
/// second, each counted `2^k` times (the picks are a hash of the request's first sector and
/// of a salt redrawn every 2 s).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct BlockSampling {
    /// The sparsest sampling used: 1 request in this many.
    pub one_in_max: u64,
    /// How long requests were sampled, and from when (s since the window's start).
    pub sampled_s: f64,
    pub first_s: f64,
    /// The rate (traced requests a second) above which they are sampled, and the counted
    /// rate kept at the least.
    pub above_per_s: u64,
    pub keep_per_s: u64,
}

/// The syscall tracepoints taken off threads that paid more than the budget for them, and put
/// back in windows (`accounting::syscall_gate`). What they count covers only the time they
/// were on: the counts are not scaled (rates differ by thread, syscall and phase, and a window
/// of a few ms gives no bound worth the name).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SyscallsOff {
    /// Share of the window the syscall tracepoints were on.
    pub on_share: f64,
    /// How long they were off, and when they first came off (s since the window's start).
    pub off_s: f64,
    pub first_off_s: f64,
    /// Times they were put back on trial.
    pub windows: u32,
    /// The threads that paid more than the budget for them, costliest first.
    pub threads: Vec<StormThread>,
    /// Traced threads' syscalls made while the programs had stopped themselves at a storm
    /// and were not yet detached: each paid the tracepoints' dispatch and two early returns,
    /// charged to the costliest storming thread (`ThreadCost`, "syscall tracepoints,
    /// stopped").
    #[serde(default)]
    pub halted_calls: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct StormThread {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    /// The share of its time a block of its syscalls cost it, at its fastest.
    pub share: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ThreadOverhead {
    pub pid: u32,
    pub tid: u32,
    pub estimated: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ThreadCost {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    /// Share of the thread's alive time: what the probes took of its CPU, times `contention`,
    /// plus what the probes of the children it waited for added to its waits.
    pub estimated: f64,
    /// What the cost came from, largest first.
    pub parts: Vec<ThreadCostPart>,
    /// On a machine with more runnable threads than CPUs, each ns of CPU a thread needs costs
    /// it more than a ns: 1 + its preempted waits for a CPU per ns on one. Absent at under 1.05.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contention: Option<f64>,
}

/// Threads alive under the costliest thread's floor, together (`Overhead::short_lived`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ShortLived {
    /// The floor: threads alive under this many ns (those over it can be the costliest).
    pub under_ns: u64,
    pub threads: u64,
    /// Their alive times summed.
    pub alive_ns: u64,
    /// Share of that time the probes took (each thread's cost times its `contention`).
    pub estimated: f64,
    /// What the cost came from, summed over them, largest first.
    pub parts: Vec<ThreadCostPart>,
    /// Short-lived threads left out: they list no syscalls and their process has no rows to
    /// share out (its rows were not kept past the retired rows' cap), so what they paid is
    /// not known.
    #[serde(default)]
    pub unknown: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ThreadCostPart {
    /// "syscall tracepoints", "syscall tracepoints, stopped" (`SyscallsOff::halted_calls`),
    /// "scheduler tracepoints", "CPU sampler" or "CUDA probes".
    pub what: String,
    pub ns: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ProgramCost {
    pub program: String,
    pub hits: u64,
    /// The hits in the window the kernel timed (its statistics on): `bpf_ns_per_hit` is their
    /// mean, or the mean of the program's runs before the window when none in it were.
    #[serde(default)]
    pub timed: u64,
    /// Measured by the kernel (kernel.bpf_stats_enabled); 0 when the statistics are off.
    pub bpf_ns_per_hit: f64,
    /// The trap outside the program with the kernel's statistics off: for uprobes and
    /// uretprobes (`trap_measured`) and the syscall tracepoints (`syscall_trap_measured`)
    /// measured at startup, else a built-in constant.
    pub trap_ns_per_hit: f64,
    /// What the kernel's statistics cost its hits outside their run, averaged:
    /// `stats_outside_ns` for each hit that ran while they were on.
    #[serde(default)]
    pub stats_ns_per_hit: f64,
    /// For a program that returns early for what is not traced and counts its paths
    /// (`tracer_common::hits::SPLIT`): the hits that did the traced work. The rest were the
    /// machine's other tasks, requests and samples. None for the other programs (the CUDA
    /// probes, whose every hit is a traced call; the classic block tracepoints, which do not
    /// count them: a kernel whose BTF lacks the raw ones' fields, or whose verifier refused a
    /// raw one), and when the counts could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traced_hits: Option<u64>,
    /// `bpf_ns_per_hit` split by path (`paths::split`): a traced hit's and an early return's.
    /// None when the program did not time enough of both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traced_bpf_ns_per_hit: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub early_bpf_ns_per_hit: Option<f64>,
}

impl ProgramCost {
    /// What one hit cost on average, traced or not. Never below 0: a syscall tracepoint's
    /// `trap_ns_per_hit` may be negative (`overhead::syscall_trap`), taking out what the
    /// statistics put inside the mean.
    pub fn ns_per_hit(&self) -> f64 {
        self.priced(self.bpf_ns_per_hit)
    }

    /// A hit whose program ran `bpf_ns`, with what it cost outside the run; never below 0.
    fn priced(&self, bpf_ns: f64) -> f64 {
        (bpf_ns + self.trap_ns_per_hit + self.stats_ns_per_hit).max(0.0)
    }

    /// What one early return cost: the split's price for it where the mean was split, else
    /// the mean.
    pub fn early_ns_per_hit(&self) -> f64 {
        self.priced(self.early_bpf_ns_per_hit.unwrap_or(self.bpf_ns_per_hit))
    }

    /// What one traced hit cost the traced thread that made it (or waited on it): more than
    /// the mean where the machine's other tasks make most of the cheap early returns.
    pub fn traced_ns_per_hit(&self) -> f64 {
        self.priced(self.traced_bpf_ns_per_hit.unwrap_or(self.bpf_ns_per_hit))
    }

    /// The hits that did the traced work.
    pub fn traced_hits(&self) -> u64 {
        self.traced_hits.unwrap_or(self.hits).min(self.hits)
    }

    /// What all the hits cost, each path at its own price where the mean was split (the
    /// statistics' ticks may have seen another mix of paths than the whole trace).
    pub fn cost_ns(&self) -> f64 {
        match self.early_bpf_ns_per_hit {
            Some(early) => {
                let traced = self.traced_hits();
                traced as f64 * self.traced_ns_per_hit()
                    + (self.hits - traced) as f64 * self.priced(early)
            }
            None => self.hits as f64 * self.ns_per_hit(),
        }
    }
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
    /// Relative error bound of a scaled count; None when it cannot be told (`no_bound` says
    /// why).
    pub rel_error: Option<f64>,
    /// How many times the sampled probes went on (a window open over several ticks is one).
    pub windows: u64,
    /// Calls the sampled probes saw before scaling.
    pub seen_hits: u64,
    /// The share of the launches filled in between windows that came from the copies and
    /// syncs counted there (launches per copy or sync in the windows beside them); the rest
    /// came from the time (the windows' launch rates, net of the probes' cost).
    #[serde(default)]
    pub filled_by_calls: f64,
    /// Why `rel_error` is null.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_bound: Option<String>,
}

/// `parts` as shares of a whole `estimated` share, in their order: "syscall tracepoints 1.8%,
/// CPU sampler 0.1%".
/// `estimated` split among `parts` by what each added: a thread's own probes stretched by its
/// `contention`, its waited-for children's already time it waited.
fn shares(parts: &[ThreadCostPart], estimated: f64, contention: f64) -> String {
    let total: f64 = parts
        .iter()
        .map(|p| weight(p, contention))
        .sum::<f64>()
        .max(1.0);
    parts
        .iter()
        .map(|p| {
            format!(
                "{} {:.1}%",
                p.what,
                100.0 * estimated * weight(p, contention) / total
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn weight(p: &ThreadCostPart, contention: f64) -> f64 {
    if p.what == WAITED_PART {
        p.ns as f64
    } else {
        p.ns as f64 * contention
    }
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
        if let Some(c) = &self.costliest_thread {
            s.push_str(&format!(
                "; costliest thread {} ({}) ~{:.2}%",
                c.tid,
                c.comm,
                c.estimated * 100.0
            ));
        }
        if let Some(g) = self.short_lived_shown() {
            s.push_str(&format!(
                "; {} threads alive under {} ms ~{:.2}%",
                g.threads,
                g.under_ns / 1_000_000,
                g.estimated * 100.0
            ));
            if g.unknown > 0 {
                s.push_str(&format!(
                    " ({} more not priced: their syscall rows were not kept)",
                    g.unknown
                ));
            }
        }
        if let Some(c) = self
            .seen_by_sampler
            .as_ref()
            .filter(|c| c.in_probes >= SAMPLER_MIN_IN_PROBES)
        {
            s.push_str(&format!(
                "; the CPU sampler caught probes in {:.1}% of traced samples (estimate {:.1}%)",
                c.share * 100.0,
                c.estimated * 100.0
            ));
        }
        if let Some(o) = &self.own {
            s.push_str(&format!(
                "; gputrace itself ~{:.1}% of one CPU (of {}), peak {}, kernel maps {}",
                o.cpu_share * 100.0,
                o.cpus,
                crate::report::units::bytes(o.peak_rss_bytes),
                crate::report::units::bytes(o.kernel_maps_bytes)
            ));
        }
        if let Some(w) = self.worst_thread.as_ref().filter(|w| {
            self.costliest_thread
                .as_ref()
                .is_none_or(|c| c.tid != w.tid)
        }) {
            s.push_str(&format!(
                "; busiest CUDA thread {} ~{:.2}%",
                w.tid,
                w.estimated * 100.0
            ));
        }
        s
    }

    /// The short-lived threads, when they lived long enough together (the floor one thread
    /// needs to be the costliest) for a share of their time to mean something.
    fn short_lived_shown(&self) -> Option<&ShortLived> {
        self.short_lived
            .as_ref()
            .filter(|s| s.alive_ns >= s.under_ns.max(1))
    }

    /// Said when the short-lived threads together paid more than the budget.
    pub fn short_lived_line(&self) -> Option<String> {
        let s = self
            .short_lived_shown()
            .filter(|s| s.estimated > self.budget)?;
        Some(format!(
            "over budget: {} threads that lived under {} ms each ({:.0} ms in all; short \
             processes, such as a shell loop's) paid ~{:.1}% of their time for probes ({}), over \
             the {}% budget; the budget's gates act over blocks of syscalls and windows longer \
             than such a thread lives, and its startup's syscalls are traced in full",
            s.threads,
            s.under_ns / 1_000_000,
            s.alive_ns as f64 / 1e6,
            s.estimated * 100.0,
            shares(&s.parts, s.estimated, 1.0),
            pct(self.budget)
        ))
    }

    /// Said when a thread pays more than the budget for probes the budget cannot switch off.
    pub fn over_budget_line(&self) -> Option<String> {
        let c = self.costliest_thread.as_ref()?;
        if c.estimated <= self.budget {
            return None;
        }
        let waited = c
            .contention
            .map(|x| format!("; x{x:.1} for the CPU it waited for, preempted"))
            .unwrap_or_default();
        let stretch = c.contention.unwrap_or(1.0);
        let total: f64 = c.parts.iter().map(|p| weight(p, stretch)).sum();
        let children = c
            .parts
            .iter()
            .find(|p| p.what == WAITED_PART)
            .filter(|p| 2.0 * p.ns as f64 >= total)
            .map(|_| {
                "; most of it is what its children paid for their probes while it waited for \
                 them, gated as their own threads are"
            })
            .unwrap_or_default();
        Some(format!(
            "over budget: thread {} ({}) paid ~{:.1}% of its time for probes ({}{waited}), over \
             the {}% budget; the budget switches the CUDA probes and, for a thread whose \
             syscalls alone cost more than the budget, the syscall tracepoints on and off\
             {children}",
            c.tid,
            c.comm,
            c.estimated * 100.0,
            shares(&c.parts, c.estimated, stretch),
            pct(self.budget)
        ))
    }

    /// Said when gputrace's own threads took more of the machine's CPU time than the budget
    /// allows its probes, over a window long enough that its one-off work (the first pass over
    /// exited processes loads the kernel's symbols, ~40 ms) is not most of it: that competes
    /// with a job that keeps every CPU busy.
    pub fn own_line(&self) -> Option<String> {
        let o = self.own.as_ref().filter(|o| {
            o.machine_share() > self.budget
                && o.window_cpu_ns as f64 >= o.cpu_share * OWN_MIN_WINDOW_NS as f64
        })?;
        Some(format!(
            "gputrace's own threads took {:.1} s of CPU in the window, ~{:.1}% of one CPU, \
             {:.1}% of the machine's {} CPUs, more than the {}% budget, which caps what its \
             probes add to the traced threads only; a job that keeps every CPU busy waits for \
             about that share",
            o.window_cpu_ns as f64 / 1e9,
            o.cpu_share * 100.0,
            o.machine_share() * 100.0,
            o.cpus,
            pct(self.budget)
        ))
    }

    /// Said when the CPU sampler caught the probes running clearly more often than the
    /// estimate has them: the estimate (and the budget, which acts on it) reads low.
    pub fn sampler_line(&self) -> Option<String> {
        let c = self.seen_by_sampler.as_ref().filter(|c| c.estimate_low())?;
        Some(format!(
            "the overhead estimate reads low: the CPU sampler caught the probes running in \
             {:.1}% (±{:.1}%) of the traced threads' samples ({} of {}), where the estimate puts \
             them at {:.1}% of the CPU time those samples stand for",
            c.share * 100.0,
            c.error * 100.0,
            c.in_probes,
            c.samples,
            c.estimated * 100.0
        ))
    }

    /// Said when the syscall tracepoints came off: what the syscall figures then cover.
    pub fn syscalls_off_line(&self) -> Option<String> {
        let g = self.syscalls_off.as_ref()?;
        let mut who: Vec<String> = g
            .threads
            .iter()
            .take(3)
            .map(|t| format!("thread {} ({}) ~{:.0}%", t.tid, t.comm, t.share * 100.0))
            .collect();
        if g.threads.len() > 3 {
            who.push(format!("{} more thread(s)", g.threads.len() - 3));
        }
        let whose = if g.threads.len() == 1 { "its" } else { "their" };
        Some(format!(
            "PARTIAL: over the {}% budget, the syscall tracepoints took {} of {whose} time, so \
             they were off for {:.1} s from {:.1} s on (put back on trial {} times). Syscall \
             counts, latencies and per-file I/O cover the {:.0}% of the trace they were on (not \
             scaled); off-CPU time meanwhile is classified from kernel stacks",
            pct(self.budget),
            who.join(", "),
            g.off_s,
            g.first_off_s,
            g.windows,
            g.on_share * 100.0
        ))
    }

    /// What the budget and the samplings did to the figures, a line each, for every report's
    /// footer: the launch windows, the syscall tracepoints taken off, sampled block requests,
    /// untimed syscalls.
    pub fn limit_lines(&self) -> Vec<String> {
        [
            self.sampling_line(),
            self.calls_sampling_line(),
            self.syscalls_off_line(),
            self.block_sampled_line(),
            self.syscalls_timed_line(),
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    /// Said when a fast run's syscalls were timed 1 in N: what the latencies then are.
    pub fn syscalls_timed_line(&self) -> Option<String> {
        let t = self.syscalls_timed.as_ref()?;
        Some(format!(
            "ESTIMATED: {} syscalls of fast runs (a thread making one syscall over and over, \
             each within {} µs on average) went untimed, 1 in {} timed at random: syscall and file \
             times and latency histograms are estimates (each timed call counted {} times), \
             min and max are the timed calls'; counts, bytes and errors are exact \
             (--max-overhead 100% times every call)",
            t.untimed_calls, t.gap_us, t.one_in, t.one_in
        ))
    }

    /// Said when block requests were sampled: what the block I/O rows then are.
    pub fn block_sampled_line(&self) -> Option<String> {
        let b = self.block_sampled.as_ref()?;
        Some(format!(
            "ESTIMATED: traced block requests came at over {} a second, so for {:.1} s from \
             {:.1} s on 1 in up to {} was counted, each for as many (~{} a second counted): \
             block I/O requests, bytes and latencies are estimates, with their error \
             under each table (--max-overhead 100% counts every request)",
            b.above_per_s, b.sampled_s, b.first_s, b.one_in_max, b.keep_per_s,
        ))
    }

    /// What the syscall tables' headings add when the tracepoints were off part of the trace.
    pub fn syscalls_partial(&self) -> Option<String> {
        let g = self.syscalls_off.as_ref()?;
        Some(format!(
            "PARTIAL: tracepoints on {:.0}% of the trace",
            g.on_share * 100.0
        ))
    }

    pub fn sampling_line(&self) -> Option<String> {
        self.sampled.as_ref().map(sampling_line)
    }

    /// [`Overhead::sampling_line`] for the copy and sync probes.
    pub fn calls_sampling_line(&self) -> Option<String> {
        self.sampled_calls.as_ref().map(sampling_line)
    }

    /// The share of `function`'s calls the probes saw: the figures of a sampled function
    /// were scaled up.
    pub fn seen_share(&self, function: &str) -> f64 {
        let s = match crate::cuda::table::by_name(function) {
            Some(f) if f.is_launch() => self.sampled.as_ref(),
            Some(f) if crate::overhead::is_call(f) => self.sampled_calls.as_ref(),
            _ => None,
        };
        s.map_or(1.0, |s| 1.0 / s.scale.max(1.0))
    }
}

/// What a sampling did to its figures, in one line.
fn sampling_line(s: &ProbeSampling) -> String {
    let err = match (s.rel_error, &s.no_bound) {
        (Some(e), _) => format!("+/-{:.0}%", e * 100.0),
        (None, Some(why)) => format!("error unknown: {why}"),
        (None, None) if s.windows < 2 => "error unknown: one window".into(),
        (None, None) => "error unknown: the probes cost more than the work they sampled".into(),
    };
    let by = match s.filled_by_calls {
        b if b >= 0.995 => "; filled in between windows from the copies and syncs counted there".into(),
        b if b > 0.005 => format!(
            "; filled in between windows {:.0}% from the copies and syncs counted there, the rest from the time",
            b * 100.0
        ),
        _ => String::new(),
    };
    format!(
        "ESTIMATED: {} probed {:.1}% of the time to stay in budget; {} are scaled x{:.1} ({err}){by}",
        s.probes,
        s.duty * 100.0,
        s.scaled,
        s.scale
    )
}

fn pct(f: f64) -> String {
    let p = f * 100.0;
    if (p - p.round()).abs() < 1e-9 {
        format!("{p:.0}")
    } else {
        format!("{p}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_split_program_prices_each_path_at_its_own_cost() {
        let mut p = ProgramCost {
            program: "sched_switch_btf".into(),
            hits: 1000,
            bpf_ns_per_hit: 200.0,
            trap_ns_per_hit: 30.0,
            stats_ns_per_hit: 5.0,
            ..Default::default()
        };
        assert_eq!((p.traced_hits(), p.traced_ns_per_hit()), (1000, 235.0));
        assert_eq!(p.cost_ns(), 235_000.0);
        p.traced_hits = Some(100);
        p.traced_bpf_ns_per_hit = Some(1100.0);
        p.early_bpf_ns_per_hit = Some(100.0);
        assert_eq!((p.traced_hits(), p.traced_ns_per_hit()), (100, 1135.0));
        assert_eq!(p.cost_ns(), 100.0 * 1135.0 + 900.0 * 135.0);
        // Counted but not split (too few timed runs of a path): the mean for both.
        p.traced_bpf_ns_per_hit = None;
        p.early_bpf_ns_per_hit = None;
        assert_eq!((p.traced_hits(), p.traced_ns_per_hit()), (100, 235.0));
        assert_eq!(p.cost_ns(), 235_000.0);
    }

    #[test]
    fn a_negative_outside_cost_never_prices_a_hit_below_zero() {
        // A syscall tracepoint's measured outside cost takes out what the statistics put
        // inside its mean (`overhead::syscall_trap`).
        let mut p = ProgramCost {
            program: "sys_exit".into(),
            hits: 1000,
            bpf_ns_per_hit: 120.0,
            trap_ns_per_hit: -25.0,
            ..Default::default()
        };
        assert_eq!(p.ns_per_hit(), 95.0);
        p.traced_hits = Some(100);
        p.traced_bpf_ns_per_hit = Some(400.0);
        p.early_bpf_ns_per_hit = Some(20.0);
        assert_eq!(p.traced_ns_per_hit(), 375.0);
        // The early path at 20 - 25: nothing, not less.
        assert_eq!(p.cost_ns(), 100.0 * 375.0);
        p.bpf_ns_per_hit = 20.0;
        p.traced_bpf_ns_per_hit = None;
        p.early_bpf_ns_per_hit = None;
        assert_eq!(
            (p.ns_per_hit(), p.traced_ns_per_hit(), p.cost_ns()),
            (0.0, 0.0, 0.0)
        );
    }

    fn costly(estimated: f64) -> Overhead {
        Overhead {
            budget: 0.02,
            estimated: 0.01,
            costliest_thread: Some(ThreadCost {
                pid: 7,
                tid: 8,
                comm: "loader".into(),
                estimated,
                parts: vec![
                    ThreadCostPart {
                        what: "syscall tracepoints".into(),
                        ns: 300,
                    },
                    ThreadCostPart {
                        what: "scheduler tracepoints".into(),
                        ns: 100,
                    },
                ],
                contention: None,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_thread_over_the_budget_is_named_with_what_it_paid_for() {
        let o = costly(0.04);
        assert!(o.summary().contains("costliest thread 8 (loader) ~4.00%"));
        assert_eq!(
            o.over_budget_line().unwrap(),
            "over budget: thread 8 (loader) paid ~4.0% of its time for probes (syscall \
             tracepoints 3.0%, scheduler tracepoints 1.0%), over the 2% budget; the budget \
             switches the CUDA probes and, for a thread whose syscalls alone cost \
             more than the budget, the syscall tracepoints on and off"
        );
        assert_eq!(costly(0.019).over_budget_line(), None);
        let mut o = costly(0.045);
        if let Some(c) = o.costliest_thread.as_mut() {
            c.contention = Some(2.5);
        }
        let line = o.over_budget_line().unwrap();
        assert!(
            line.contains(
                "~4.5% of its time for probes (syscall tracepoints 3.4%, scheduler tracepoints \
                 1.1%; x2.5 for the CPU it waited for, preempted), over the 2% budget"
            ),
            "{line}"
        );
        // A shell that paid mostly for the children it waited for is told so.
        let mut o = costly(0.04);
        if let Some(c) = o.costliest_thread.as_mut() {
            c.parts.insert(
                0,
                ThreadCostPart {
                    what: WAITED_PART.into(),
                    ns: 400,
                },
            );
        }
        let line = o.over_budget_line().unwrap();
        assert!(
            line.contains("(waited-for children's probes 2.0%, syscall tracepoints 1.5%")
                && line.ends_with(
                    "on and off; most of it is what its children paid for their probes while \
                     it waited for them, gated as their own threads are"
                ),
            "{line}"
        );
        // Its own probes stretched 3x by its preempted waits: 400 ns of children against
        // (300 + 100) x 3 of its own is not most of it, and the split says so.
        if let Some(c) = o.costliest_thread.as_mut() {
            c.contention = Some(3.0);
        }
        let line = o.over_budget_line().unwrap();
        assert!(
            line.contains(
                "(waited-for children's probes 1.0%, syscall tracepoints 2.2%, scheduler \
                 tracepoints 0.8%; x3.0"
            ) && !line.contains("most of it"),
            "{line}"
        );
    }

    #[test]
    fn the_samplers_count_checks_the_estimate() {
        // 1,000 samples at 100 Hz stand for 10 s of CPU; the estimate's 0.5 s is 5% of it.
        let c = SamplerCheck::new(1_000, 50, 100, 500_000_000).unwrap();
        assert_eq!((c.share, c.estimated), (0.05, 0.05));
        assert!((c.error - (0.05f64 * 0.95 / 1000.0).sqrt()).abs() < 1e-12);
        assert!(!c.estimate_low());
        assert_eq!(SamplerCheck::new(0, 0, 100, 1), None);
        // Caught in 15% where the estimate says 5%: low, and said so.
        let mut o = costly(0.01);
        o.seen_by_sampler = SamplerCheck::new(1_000, 150, 100, 500_000_000);
        assert!(o.seen_by_sampler.as_ref().unwrap().estimate_low());
        assert_eq!(
            o.sampler_line().unwrap(),
            "the overhead estimate reads low: the CPU sampler caught the probes running in \
             15.0% (±1.1%) of the traced threads' samples (150 of 1000), where the estimate \
             puts them at 5.0% of the CPU time those samples stand for"
        );
        assert!(o.summary().contains(
            "; the CPU sampler caught probes in 15.0% of traced samples (estimate 5.0%)"
        ));
        // Too few caught to say: 10 of 40 is 25%, but no warning and no word in the summary.
        o.seen_by_sampler = SamplerCheck::new(40, 10, 100, 1_000_000);
        assert_eq!(o.sampler_line(), None);
        assert!(!o.summary().contains("sampler"));
        // Within the noise of 200 samples: not low.
        o.seen_by_sampler = SamplerCheck::new(200, 24, 100, 200_000_000);
        assert_eq!(o.sampler_line(), None, "{:?}", o.seen_by_sampler);
    }

    #[test]
    fn gputraces_own_cpu_is_in_the_summary_and_warned_of_past_the_budget() {
        let mut o = costly(0.01);
        assert_eq!(o.own_line(), None);
        // A tenth of one of 2 CPUs: 5% of the machine's CPU time, over a 2% budget.
        o.own = Some(OwnCost {
            window_cpu_ns: 4_000_000_000,
            cpu_share: 0.1,
            cpus: 2,
            peak_rss_bytes: 280 << 20,
            kernel_maps_bytes: 156 << 20,
            ..Default::default()
        });
        assert!(
            o.summary().contains(
                "; gputrace itself ~10.0% of one CPU (of 2), peak 293.6 MB, kernel maps 163.6 MB"
            ),
            "{}",
            o.summary()
        );
        let line = o.own_line().unwrap();
        assert!(
            line.contains("took 4.0 s of CPU in the window, ~10.0% of one CPU, 5.0% of the machine's 2 CPUs, more than the 2% budget"),
            "{line}"
        );
        // The same share over a 5 s window (0.5 s of CPU) is mostly one-off work: not warned of.
        o.own.as_mut().unwrap().window_cpu_ns = 500_000_000;
        assert_eq!(o.own_line(), None);
        o.own.as_mut().unwrap().window_cpu_ns = 4_000_000_000;
        // The same on 8 CPUs is 1.25% of the machine's: under the budget, not warned of.
        o.own.as_mut().unwrap().cpus = 8;
        assert_eq!(o.own_line(), None);
        assert!(o.summary().contains("(of 8)"));
    }

    #[test]
    fn sampled_block_requests_say_what_the_rows_are() {
        let o = Overhead {
            block_sampled: Some(BlockSampling {
                one_in_max: 16,
                sampled_s: 3.4,
                first_s: 0.35,
                above_per_s: 4000,
                keep_per_s: 1000,
            }),
            ..Default::default()
        };
        let l = o.block_sampled_line().unwrap();
        assert!(
            l.starts_with("ESTIMATED: traced block requests came at over 4000 a second")
                && l.contains("for 3.4 s from 0.3 s on 1 in up to 16")
                && l.contains("--max-overhead 100% counts every request"),
            "{l}"
        );
    }

    #[test]
    fn sampled_copies_and_syncs_are_said_and_counted_at_what_was_seen() {
        let mut o = Overhead::default();
        assert_eq!(o.calls_sampling_line(), None);
        assert_eq!(o.seen_share("cudaMemcpyAsync"), 1.0);
        let sampling = |probes: &str, scale| ProbeSampling {
            probes: probes.into(),
            scaled: "their counts".into(),
            duty: 0.025,
            scale,
            rel_error: None,
            windows: 5,
            seen_hits: 1000,
            filled_by_calls: 0.0,
            no_bound: Some("the probes cost more than the work they sampled".into()),
        };
        o.sampled = Some(sampling("CUDA launch probes", 10.0));
        o.sampled_calls = Some(sampling("CUDA copy and sync probes", 40.0));
        assert_eq!(
            o.calls_sampling_line().unwrap(),
            "ESTIMATED: CUDA copy and sync probes probed 2.5% of the time to stay in budget; \
             their counts are scaled x40.0 (error unknown: the probes cost more than the work \
             they sampled)"
        );
        assert_eq!(o.limit_lines().len(), 2);
        // Each sampled function's rows were scaled by its own probes' windows.
        assert_eq!(o.seen_share("cudaMemcpyAsync"), 1.0 / 40.0);
        assert_eq!(o.seen_share("cuStreamSynchronize"), 1.0 / 40.0);
        assert_eq!(o.seen_share("cudaLaunchKernel"), 1.0 / 10.0);
        assert_eq!(o.seen_share("cudaMalloc"), 1.0);
    }

    #[test]
    fn untimed_syscalls_say_what_is_estimated() {
        let mut o = Overhead::default();
        assert_eq!(o.syscalls_timed_line(), None);
        o.syscalls_timed = Some(SyscallTiming {
            one_in: 8,
            untimed_calls: 68_000,
            gap_us: 200,
        });
        let l = o.syscalls_timed_line().unwrap();
        assert!(
            l.starts_with("ESTIMATED: 68000 syscalls of fast runs")
                && l.contains("each within 200 µs on average")
                && l.contains("1 in 8 timed"),
            "{l}"
        );
    }

    #[test]
    fn syscalls_taken_off_say_what_the_figures_cover() {
        let mut o = costly(0.01);
        assert_eq!(o.syscalls_off_line(), None);
        assert_eq!(o.block_sampled_line(), None);
        let t = |tid, share| StormThread {
            pid: 7,
            tid,
            comm: "dd".into(),
            share,
        };
        o.syscalls_off = Some(SyscallsOff {
            on_share: 0.031,
            off_s: 9.5,
            first_off_s: 0.2,
            windows: 3,
            threads: vec![t(8, 0.71), t(9, 0.5), t(10, 0.3), t(11, 0.2)],
            halted_calls: 0,
        });
        assert_eq!(
            o.syscalls_off_line().unwrap(),
            "PARTIAL: over the 2% budget, the syscall tracepoints took thread 8 (dd) ~71%, \
             thread 9 (dd) ~50%, thread 10 (dd) ~30%, 1 more thread(s) of their time, so they \
             were off for 9.5 s from 0.2 s on (put back on trial 3 times). Syscall counts, \
             latencies and per-file I/O cover the 3% of the trace they were on (not scaled); \
             off-CPU time meanwhile is classified from kernel stacks"
        );
    }
}
