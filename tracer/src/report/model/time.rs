//! Wall-time accounting, syscalls, files and block I/O (issue 3). Schema: docs/report.md.

use serde::{Deserialize, Serialize};

/// Where a thread's (or a process's, summed over its threads) wall time went. Every
/// nanosecond the thread was alive inside the trace window is in exactly one category.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct TimeBreakdown {
    /// Time alive inside the window (ns); the categories sum to this within 1%.
    pub alive_ns: u64,
    /// Sum of `categories` (ns), shown so the invariant can be checked by anyone.
    pub accounted_ns: u64,
    /// One entry per category with non-zero time, largest first. Category names:
    /// cpu, runqueue, io, net, ipc, lock, gil, sleep, poll, other, and (issue 4) cuda_launch,
    /// cuda_memcpy, cuda_sync, cuda_malloc, cuda_other.
    pub categories: Vec<CategoryTime>,
    /// Share of on-CPU samples taken in user mode (0-100), from the sampler.
    pub cpu_user_percent: Option<f64>,
    /// The reasons behind each category (syscall names, "D state", ...), largest first.
    pub reasons: Vec<ReasonTime>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CategoryTime {
    pub category: String,
    pub ns: u64,
    /// Percent of `alive_ns`.
    pub percent: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ReasonTime {
    pub category: String,
    /// e.g. `read`, `futex`, `nanosleep`, `preempted`, `D state`.
    pub reason: String,
    pub ns: u64,
    /// Number of off-CPU intervals (or calls) behind it.
    pub count: u64,
}

/// One syscall of one thread (or process).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SyscallStat {
    pub name: String,
    pub nr: i64,
    pub count: u64,
    pub errors: u64,
    pub total_ns: u64,
    pub min_ns: u64,
    pub max_ns: u64,
    /// Log2 latency histogram: bucket i counts calls with latency in [2^i, 2^(i+1)) ns.
    pub hist_log2_ns: Vec<u64>,
    /// Bytes moved, for the read/write family (sum of non-negative return values).
    pub bytes: u64,
    /// Errors by errno name (e.g. EAGAIN), largest first.
    pub errnos: Vec<ErrnoCount>,
    /// Set when not every call was timed (a thread's fast run of one syscall, see
    /// `Overhead::syscalls_timed`): the calls timed, each of which counts for as many as it
    /// stands for in `total_ns` and `hist_log2_ns` (estimates then); `min_ns` is theirs,
    /// `max_ns` theirs and the untimed calls' that left the CPU (the time since they first
    /// did): a row may have a max and no timed call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timed: Option<u64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ErrnoCount {
    pub errno: String,
    pub count: u64,
}

/// I/O time per file, resolved from fds in user space.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct FileIo {
    /// Path (from /proc while open, else as the program opened it), `pipe:[ino]`,
    /// `socket:[ino]`, `<pipe>` or `<socket>` (made and closed between two looks at /proc),
    /// or `<closed fd N>` when it could be none of these (never guessed).
    pub file: String,
    pub ns: u64,
    pub bytes: u64,
    pub calls: u64,
    /// Set when not every call was timed (a fast run's, see `SyscallStat::timed`): the calls
    /// timed; `ns` is then an estimate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timed: Option<u64>,
}

/// I/O time per directory, summed over the files in it that `files` names (all of them, not
/// only those listed), for directories with two files or more: a loader reading one file per
/// sample spreads its time over thousands of files, each too small to be listed.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct DirIo {
    /// The files' directory, as their paths spell it (relative when they were opened so).
    pub dir: String,
    /// Distinct files in it that did I/O.
    pub files: u64,
    pub ns: u64,
    pub bytes: u64,
    pub calls: u64,
}

/// Block I/O of one process on one device.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct BlockIo {
    /// `major:minor` and, when known, the device name (`vda`).
    pub device: String,
    pub requests: u64,
    pub reads: u64,
    pub writes: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Issue-to-complete latency, log2 ns buckets.
    pub hist_log2_ns: Vec<u64>,
    pub total_ns: u64,
    /// Time from insert to issue (in the I/O scheduler), when seen.
    pub queue_ns: u64,
    /// Read and written bytes of the requests seen completing: short of `read_bytes` +
    /// `write_bytes` (summed over the disk's partitions) by what was submitted and never seen
    /// completing (the report's blind spots say so past 0.1% and 1 MiB).
    #[serde(default)]
    pub completed_bytes: u64,
    /// Set when some of its requests were sampled (`Overhead::block_sampled`): its figures
    /// are then estimates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampled: Option<BlockSampled>,
}

/// What a sampled block I/O row was estimated from.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct BlockSampled {
    /// The requests counted (`requests` counts each by its weight).
    pub seen: u64,
    /// `requests`' error at 95% (two standard deviations of its estimate), in requests.
    pub requests_error: u64,
}

impl BlockIo {
    /// `requests`' relative error at 95%, 0 for an exact row.
    pub fn requests_rel_error(&self) -> f64 {
        match &self.sampled {
            Some(s) if self.requests > 0 => s.requests_error as f64 / self.requests as f64,
            _ => 0.0,
        }
    }
}
