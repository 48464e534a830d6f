//! Every threshold a rule uses, in one place; docs/verdicts.md quotes these values.

/// Severity by share of wall time at stake (percent).
pub const SEVERITY_CRITICAL: f64 = 40.0;
pub const SEVERITY_HIGH: f64 = 20.0;
pub const SEVERITY_MEDIUM: f64 = 10.0;

/// A thread (or worker process) alive for less than this share of the window is not judged:
/// a 30 ms shell that waited for its child is no bottleneck. Impacts are also scaled by the
/// share of the window a thread was alive.
pub const MIN_ALIVE_SHARE: f64 = 10.0;

/// data-loading-bound: a thread waits on lock/ipc/poll at least this share of its time...
pub const DATA_WAIT_MIN: f64 = 20.0;
/// ...while its worker processes (or sibling threads) are busy (cpu + io + runqueue) at least
/// this share of theirs.
pub const WORKER_BUSY_MIN: f64 = 30.0;
/// A descendant process counts as a worker when one of its threads is busy at least this much
/// (idle helpers such as a forkserver do not).
pub const WORKER_MIN_BUSY: f64 = 20.0;
/// Threads of the same process count as loader workers when they spend this much in io.
pub const WORKER_THREAD_IO_MIN: f64 = 20.0;

/// io-bound: a thread spends at least this share of its time in disk/file I/O.
pub const IO_MIN: f64 = 25.0;

/// waiting: a process whose threads were on CPU, runnable or in disk I/O under this share of
/// their time, and whose main thread spent at least `WAITING_ONE_MIN` in one wait.
pub const WAITING_BUSY_MAX: f64 = 2.0;
pub const WAITING_ONE_MIN: f64 = 80.0;

/// cpu-bound: a thread is on CPU at least this share of its time.
pub const CPU_MIN: f64 = 70.0;
/// cpu-bound, for a thread of a CUDA process while the GPU was mostly idle (below
/// `GPU_IDLE_UTIL`): on CPU this much of its time.
pub const CPU_MIN_GPU_IDLE: f64 = 50.0;
/// cpu-bound names Python lines first when the hottest holds this share of the samples.
pub const PYTHON_LINE_MIN: f64 = 10.0;
/// gil-contention: share of a thread's life spent waiting for the GIL.
pub const GIL_WAIT_MIN: f64 = 20.0;

/// cpu-contention: a thread waits runnable for a CPU at least this share of its time.
pub const RUNQUEUE_MIN: f64 = 10.0;

/// gpu-bound: a thread waits in CUDA synchronisation at least this share of its time...
pub const GPU_SYNC_MIN: f64 = 30.0;
/// ...while NVML reports at least this mean GPU utilisation (when NVML is available).
pub const GPU_UTIL_BUSY: f64 = 80.0;
/// Without NVML, syncs this frequent and this short mean sync-heavy rather than GPU-bound.
pub const SYNC_RATE_MIN: f64 = 100.0;
pub const SYNC_SHORT_NS: u64 = 1_000_000;

/// launch-bound: a thread spends this share of its time inside kernel launches, or launches
/// at least LAUNCH_RATE_MIN per second while launch calls take LAUNCH_SHARE_MIN of the window.
pub const LAUNCH_MIN: f64 = 15.0;
pub const LAUNCH_RATE_MIN: f64 = 5_000.0;
pub const LAUNCH_SHARE_MIN: f64 = 10.0;
/// A launch of at most this many blocks counts as tiny.
pub const TINY_KERNEL_BLOCKS: u64 = 8;

/// transfer-bound: a thread spends this share of its time in cudaMemcpy-style calls.
pub const MEMCPY_MIN: f64 = 15.0;
/// Synchronous host-to-device copies averaging at least this many bytes but moving under
/// PAGEABLE_GBPS suggest pageable (not pinned) host memory.
pub const PAGEABLE_MIN_BYTES: u64 = 64 * 1024;
pub const PAGEABLE_GBPS: f64 = 6.0;
/// What a PCIe 4.0 x16 link moves in practice with pinned memory (GB/s), for comparison.
pub const PCIE4_X16_GBPS: f64 = 25.0;

/// sync-heavy: at least this many sync points per second (sync calls and tiny synchronous
/// device-to-host copies) taking at least SYNC_SHARE_MIN of a thread's time.
pub const SYNC_HEAVY_RATE: f64 = 100.0;
pub const SYNC_SHARE_MIN: f64 = 5.0;
/// A synchronous device-to-host copy averaging at most this many bytes is a `.item()`-style
/// read of a scalar.
pub const TINY_COPY_BYTES: u64 = 4096;

/// allocation-churn: cudaMalloc+cudaFree calls per second, or share of time in them.
pub const ALLOC_RATE_MIN: f64 = 50.0;
pub const ALLOC_SHARE_MIN: f64 = 5.0;

/// gpu-memory-not-freed: allocations made during the trace and never freed add up to this.
pub const NOT_FREED_MIN_BYTES: u64 = 256 * 1024 * 1024;

/// gpu-idle: mean NVML utilisation below this while the process makes CUDA calls.
pub const GPU_IDLE_UTIL: f64 = 30.0;
/// NVML samples needed after the job's first GPU allocation to judge utilisation on them
/// alone (at the default 10 Hz, a second).
pub const GPU_UTIL_MIN_SAMPLES: usize = 10;
