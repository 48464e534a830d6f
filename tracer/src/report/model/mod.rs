//! The report: what `report.json` holds (schema documented in docs/report.md). Every exporter
//! renders from this one value, so the terminal, JSON and HTML never disagree.

pub mod cuda;
pub mod overhead;
pub mod python;
pub mod time;
pub mod verdict;

use serde::{Deserialize, Serialize};

use crate::aggregate::cpu::FnStat;

/// Bumped on any change that removes or renames a field; new optional fields do not bump it.
pub const SCHEMA_VERSION: u32 = 1;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub schema_version: u32,
    /// `gputrace <version>`.
    pub tool: String,
    /// Ranked findings, most important first (empty when no rule fired).
    #[serde(default)]
    pub findings: Vec<verdict::Finding>,
    pub target: Target,
    pub window: Window,
    pub sampling: Sampling,
    pub processes: Vec<ProcessReport>,
    /// How many processes the trace followed, and how many `processes` leaves out.
    #[serde(default)]
    pub followed: Followed,
    /// NVML samples; `available: false` with a reason when there is no NVIDIA driver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvml: Option<cuda::Nvml>,
    /// Everything the kernel side could not record (non-zero counters only).
    pub drops: Vec<DropCount>,
    /// Things gputrace knows it cannot see, said plainly.
    pub blind_spots: Vec<String>,
    pub warnings: Vec<String>,
    /// How much of the timeline (trace.json) was kept and how much was cut.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<TimelineSummary>,
    /// gputrace's own estimated cost and what the overhead budget sampled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overhead: Option<overhead::Overhead>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct TimelineSummary {
    pub events: u64,
    pub counter_samples: u64,
    /// `--timeline-limit`.
    pub limit: u64,
    /// Events not kept because the limit was reached.
    pub cut_events: u64,
    pub cut_counter_samples: u64,
    /// CUDA calls shorter than the timeline's threshold (launches, mostly), counted but not drawn.
    #[serde(default)]
    pub cuda_calls_below_threshold: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Target {
    /// `-- CMD` that gputrace launched, if any.
    pub command: Option<Vec<String>>,
    /// The pids given with --pid, or the launched command's pid.
    pub pids: Vec<u32>,
    pub follow_children: bool,
    /// Exit status of a launched command, when it exited during the trace.
    pub exit_code: Option<i32>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Window {
    /// Wall-clock start, Unix time in ns.
    pub start_unix_ns: u64,
    pub duration_ns: u64,
    /// `target-exited`, `duration`, `interrupted` (SIGINT/SIGTERM).
    pub ended_by: String,
    /// From gputrace's start to the first probe attached (ms).
    pub attach_ms: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sampling {
    pub frequency_hz: u64,
    pub cpus: usize,
    pub samples: u64,
    /// Of them, those that caught one of the probes running (`CpuProfile::in_probes`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub in_probes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProcessReport {
    pub pid: u32,
    pub ppid: Option<u32>,
    pub comm: String,
    pub cmdline: Vec<String>,
    /// Exited during the trace.
    pub exited: bool,
    pub samples: u64,
    pub top_self: Vec<FnStat>,
    pub top_total: Vec<FnStat>,
    /// Python lines by the CPU samples taken under them (the innermost Python frame of each
    /// sample, whatever native code ran below it: what py-spy calls a line's own time).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub top_python: Vec<FnStat>,
    /// Wall time of all threads summed, by category.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<time::TimeBreakdown>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub syscalls: Vec<time::SyscallStat>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<time::FileIo>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dirs: Vec<time::DirIo>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub block_io: Vec<time::BlockIo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda: Option<cuda::ProcessCuda>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gil: Option<python::GilReport>,
    pub threads: Vec<ThreadReport>,
    /// Threads left out of `threads` (the lightest beyond `report::bound::MAX_LISTED_THREADS`);
    /// `time`, `syscalls` and `samples` include them.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub threads_not_listed: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ThreadReport {
    pub tid: u32,
    pub comm: String,
    pub samples: u64,
    /// Samples taken while the thread ran kernel code.
    pub kernel_samples: u64,
    pub top_self: Vec<FnStat>,
    /// As the process's `top_python`, for this thread.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub top_python: Vec<FnStat>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<time::TimeBreakdown>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub syscalls: Vec<time::SyscallStat>,
    /// Off-CPU and CUDA time by the Python line it was spent under, most first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub python_sites: Vec<python::PySite>,
}

/// Counts behind a bounded process list (a fork storm must not make the report huge).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Followed {
    /// Processes seen during the trace: the targets, their descendants, every fork followed.
    pub processes: u64,
    /// Processes left out of `processes`: idle ones beyond a few, then the lightest beyond
    /// `report::bound::MAX_LISTED_PROCESSES`.
    pub not_listed: u64,
    /// Processes gputrace stopped remembering to bound its memory: not followed by name, or
    /// exited ones forgotten; their samples keep pid and comm only.
    pub forgotten: u64,
    /// Exited processes whose memory maps were evicted: their samples are not symbolised.
    pub maps_evicted: u64,
    /// Processes gone before their memory maps could be read, whose executable, loader and
    /// vDSO were placed from their exec (`crate::image`): their libraries' code is unnamed.
    #[serde(default)]
    pub exec_images_placed: u64,
    /// Libraries' code mappings placed from a young process's `mmap` where its maps did not
    /// have them (its loader mapped libc after the exec): named as other processes' maps
    /// named the same file.
    #[serde(default)]
    pub libraries_placed: u64,
    /// Times the programs were switched to the other young processes' stack map, and the
    /// stacks freed from it first (nothing held them any more: `crate::young`).
    #[serde(default)]
    pub young_stack_switches: u64,
    #[serde(default)]
    pub young_stacks_freed: u64,
    /// Young stacks copied out of their maps with the dead threads' time rows that held them
    /// (one copy per distinct stack), and those rows that went without theirs (past the
    /// copies' room).
    #[serde(default)]
    pub young_stacks_copied: u64,
    #[serde(default)]
    pub young_stacks_not_copied: u64,
    /// Threads left out of the listed processes' `threads` (the lightest beyond
    /// `report::bound::MAX_LISTED_THREADS` each); the processes' totals include them.
    #[serde(default)]
    pub threads_not_listed: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DropCount {
    pub reason: String,
    pub affects: String,
    pub count: u64,
    /// The kernel-side programs that count this reason.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub programs: String,
    /// The count on each CPU (index = CPU).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub per_cpu: Vec<u64>,
}

impl DropCount {
    /// Which programs counted it and on which CPUs, for the terminal and HTML lines.
    pub fn detail(&self) -> String {
        if self.programs.is_empty() {
            return String::new();
        }
        let cpus: Vec<String> = self
            .per_cpu
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(c, n)| format!("cpu{c}: {n}"))
            .collect();
        format!(" (counted by {}; {})", self.programs, cpus.join(", "))
    }
}
