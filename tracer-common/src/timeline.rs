//! Records the probe families stream for the timeline (`trace.json`) over one ring buffer,
//! `TIMELINE`. Only intervals worth drawing are sent (at least a threshold long), so the cost
//! of a short event is one comparison.

pub const RING_MAP: &str = "TIMELINE";
/// Per-CPU counters of the timeline: see `STAT_*`.
pub const STATS_MAP: &str = "TL_STATS";
/// Loader globals.
pub const GLOBAL_ENABLED: &str = "TL_ENABLED";
pub const GLOBAL_MIN_NS: &str = "TL_MIN_NS";
pub const GLOBAL_CUDA_MIN_NS: &str = "TL_CUDA_MIN_NS";

/// Default ring buffer size; the loader may override it (`max_entries` of a ring buffer).
pub const RING_BYTES: u32 = 4 * 1024 * 1024;
/// Off-CPU intervals and syscalls at least this long become events (default).
pub const DEFAULT_MIN_NS: u64 = 1_000_000;
/// CUDA calls at least this long become events; syncs, copies and allocations always do.
pub const DEFAULT_CUDA_MIN_NS: u64 = 20_000;

/// Each CPU's block I/O bursts still being built (`TlEvent`s, kind 0 when free): read by
/// user space at the end.
pub const BLOCK_OPEN_MAP: &str = "TL_BLOCK_OPEN";
/// Bursts each CPU builds at once (processes, disks and directions whose requests interleave).
pub const BLOCK_OPEN_SLOTS: u32 = 8;
/// A block burst ends when the next request of its process and disk starts more than the
/// timeline threshold after the burst's end, or would make it longer than this: a loader
/// reading without pause draws a few events a second per disk, not one per request (~15,000
/// a second filled the 200,000-event timeline in ~15 s, cutting everything after it).
pub const BLOCK_BURST_MAX_NS: u64 = 20_000_000;

/// Slot of `TL_STATS`: CUDA calls left out of the timeline because they were short.
pub const STAT_CUDA_SHORT: u32 = 0;
pub const STATS_SLOTS: u32 = 4;

/// `TlEvent::kind`.
pub const TL_OFFCPU: u32 = 1;
pub const TL_SYSCALL: u32 = 2;
pub const TL_CUDA: u32 = 3;
pub const TL_BLOCK: u32 = 4;

/// One timeline record. What `a32` and `args` hold depends on `kind`:
/// - off-CPU: `a32` the task state at switch-out; args `[syscall nr (i64, -1 none), CUDA
///   override category or u32::MAX, wake-up ktime (0 if preempted), kernel stack id in
///   `KSTACKS` walked at switch-out by the accounting (i64, negative: none)]`.
/// - syscall: `a32` the syscall nr; args `[return value (i64), first argument]`.
/// - CUDA: `a32` the function id; args `[cookie, return code (i64), a0..a5, 7th argument]`;
///   for the `Ex` launch shapes a3..a5 are replaced by the grid and block dims read from the
///   config (3 x (lo | hi << 32)), for `Copy3dRt` a3 by the bytes and a4 by the kind.
/// - block: a burst of requests of one process to one device, all reads or all writes, from
///   the first issue to the last completion: `a32` the device (`dev_t` as the kernel
///   encodes it); args `[bytes, 0 read / 1 write / 2 other, first sector, queued ns before
///   issue (summed), requests, issue-to-completion ns (summed), the longest of them]`; tgid
///   is the issuing process, tid 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TlEvent {
    pub kind: u32,
    pub tgid: u32,
    pub tid: u32,
    pub a32: u32,
    /// ktime (CLOCK_MONOTONIC ns).
    pub start_ns: u64,
    pub dur_ns: u64,
    pub args: [u64; 9],
}

impl TlEvent {
    pub const ZERO: TlEvent = TlEvent {
        kind: 0,
        tgid: 0,
        tid: 0,
        a32: 0,
        start_ns: 0,
        dur_ns: 0,
        args: [0; 9],
    };
}

crate::user_pod!(TlEvent);
