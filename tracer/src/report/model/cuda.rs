//! CUDA runtime/driver API tracing and NVML (issue 4). Schema: docs/report.md.

use serde::{Deserialize, Serialize};

/// CUDA activity of one process.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ProcessCuda {
    /// CUDA libraries found in the process and what was attached to each.
    pub libraries: Vec<CudaLibrary>,
    /// Per API function (runtime and driver), busiest first.
    pub api: Vec<ApiStat>,
    /// Copies by direction and sync/async.
    pub copies: Vec<CopyStat>,
    /// Kernels by launch count.
    pub kernels: Vec<KernelStat>,
    pub memory: MemoryStat,
    /// The same API statistics per thread (threads that made CUDA calls), busiest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub threads: Vec<ThreadCuda>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ThreadCuda {
    pub tid: u32,
    /// Time inside CUDA calls, all functions.
    pub total_ns: u64,
    pub api: Vec<ApiStat>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CudaLibrary {
    pub path: String,
    /// `runtime` (libcudart) or `driver` (libcuda).
    pub kind: String,
    pub attached: Vec<String>,
    /// Probe points that failed to attach, with why.
    pub failed: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ApiStat {
    pub function: String,
    /// `runtime` or `driver`.
    pub layer: String,
    pub count: u64,
    pub total_ns: u64,
    pub min_ns: u64,
    pub max_ns: u64,
    pub hist_log2_ns: Vec<u64>,
    pub errors: Vec<CudaErrorCount>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CudaErrorCount {
    pub code: i32,
    /// e.g. cudaErrorInsufficientDriver / CUDA_ERROR_NO_DEVICE.
    pub name: String,
    pub count: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CopyStat {
    /// H2D, D2H, D2D, H2H, default.
    pub direction: String,
    /// `sync` or `async`.
    pub mode: String,
    pub count: u64,
    pub bytes: u64,
    pub total_ns: u64,
    /// bytes / time inside the call (GB/s); for async copies this is the enqueue rate.
    pub gbps: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct KernelStat {
    /// Demangled name, `library+0xoffset`, or `handle 0x...` when nothing names it.
    pub name: String,
    pub launches: u64,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// Time spent inside the launch calls (CPU side).
    pub launch_ns: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct MemoryStat {
    pub allocs: u64,
    pub frees: u64,
    pub alloc_bytes: u64,
    pub peak_live_bytes: u64,
    pub live_bytes_at_end: u64,
    /// Allocations never freed during the trace (largest first, bounded).
    pub never_freed: Vec<Allocation>,
    /// (ns since window start, live bytes) after each change, bounded.
    pub live_bytes_series: Vec<(u64, u64)>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Allocation {
    pub function: String,
    pub bytes: u64,
    pub at_ns: u64,
}

/// NVML samples of every GPU.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Nvml {
    pub available: bool,
    /// Why not, when unavailable (no driver, no library).
    pub reason: Option<String>,
    pub interval_ms: u64,
    pub gpus: Vec<GpuSeries>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct GpuSeries {
    pub index: u32,
    pub name: String,
    pub samples: Vec<GpuSample>,
    /// Mean GPU utilisation over the window (%).
    pub mean_util_percent: f64,
    /// Per-process utilisation where the driver offers it: (pid, mean SM %).
    pub process_util: Vec<(u32, f64)>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct GpuSample {
    /// ns since window start.
    pub t_ns: u64,
    pub util_gpu: u32,
    pub util_mem: u32,
    pub mem_used_bytes: u64,
    pub mem_total_bytes: u64,
    /// KB/s as NVML reports them.
    pub pcie_tx_kbps: u32,
    pub pcie_rx_kbps: u32,
    pub sm_clock_mhz: u32,
    pub power_mw: u32,
}
