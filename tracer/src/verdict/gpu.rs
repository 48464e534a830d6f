//! Rules on CUDA and NVML data: GPU-bound, launch-bound, transfer-bound, sync-heavy,
//! allocation churn, memory never freed, failing calls, GPU idle.

use super::{cat_pct, finding, host::capitalize, substantial, thread_label, thresholds::*, weight};
use crate::report::{
    model::{
        cuda::{ApiStat, GpuSample, GpuSeries, ProcessCuda},
        verdict::Finding,
        ProcessReport, Report,
    },
    units,
};

fn is_sync(f: &str) -> bool {
    f.contains("Synchronize")
}
fn is_launch(f: &str) -> bool {
    f.starts_with("cudaLaunch") || f.starts_with("cuLaunch")
}
fn is_alloc(f: &str) -> bool {
    f.contains("Malloc") || f.starts_with("cuMemAlloc")
}
fn is_free(f: &str) -> bool {
    f.starts_with("cudaFree") || f.starts_with("cuMemFree")
}
fn is_memcpy(f: &str) -> bool {
    f.contains("Memcpy") || f.starts_with("cuMemcpy")
}

fn api(c: &ProcessCuda, pred: fn(&str) -> bool) -> impl Iterator<Item = &ApiStat> {
    c.api.iter().filter(move |a| pred(&a.function))
}

/// Where a process spends a CUDA category: the share of its busiest thread (with that thread's
/// label) from time accounting, else the API calls' summed time over the window.
fn share(r: &Report, p: &ProcessReport, category: &str, api_ns: u64) -> (f64, Option<u32>, String) {
    // Shares of the window: a thread alive half the window counts half.
    let best = p
        .threads
        .iter()
        .filter_map(|t| t.time.as_ref().map(|tb| (t, tb)))
        .filter(|(_, tb)| substantial(r, tb))
        .map(|(t, tb)| (t, cat_pct(tb, &[category]) * weight(r, tb.alive_ns)))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    match best {
        Some((t, pct)) if pct > 0.0 => (pct, Some(t.tid), thread_label(p, t)),
        _ => (
            units::pct(api_ns, r.window.duration_ns),
            None,
            format!("{} (pid {})", p.comm, p.pid),
        ),
    }
}

/// When the traced job first took GPU memory (ns since the window start), if it did during the
/// trace and not at its very start: `gputrace -- python train.py` spends seconds importing
/// before the GPU has any work, and an H100 trace of a GPU-bound loop read 30% utilisation
/// over the whole window (a "GPU idle" verdict) where the loop itself kept it ~75% busy.
pub(crate) fn gpu_work_from(r: &Report) -> Option<u64> {
    cuda_procs(r)
        .filter_map(|(_, c)| c.memory.live_bytes_series.first().map(|&(t, _)| t))
        .min()
        .filter(|&t| t > 0)
}

/// The samples of `g` the utilisation is judged on: from the job's first GPU allocation on,
/// when that leaves enough of them (`GPU_UTIL_MIN_SAMPLES`), else all.
fn judged_samples(g: &GpuSeries, from: Option<u64>) -> &[GpuSample] {
    if let Some(from) = from {
        let start = g.samples.partition_point(|s| s.t_ns < from);
        if g.samples.len() - start >= GPU_UTIL_MIN_SAMPLES {
            return &g.samples[start..];
        }
    }
    &g.samples
}

/// The mean of the samples' utilisation; None without samples.
fn mean_util(samples: &[GpuSample]) -> Option<f64> {
    (!samples.is_empty())
        .then(|| samples.iter().map(|s| s.util_gpu as f64).sum::<f64>() / samples.len() as f64)
}

/// GPU `g`'s mean utilisation as the verdicts judge it and from when (ns since the window
/// start), when that leaves the start-up out; None when every sample counts.
pub fn util_since_work(r: &Report, g: &GpuSeries) -> Option<(f64, u64)> {
    let from = gpu_work_from(r)?;
    let s = judged_samples(g, Some(from));
    if s.len() == g.samples.len() {
        return None;
    }
    mean_util(s).map(|u| (u, from))
}

/// Mean utilisation of every GPU since the job's first GPU allocation (`gpu_work_from`).
pub(crate) fn gpu_util(r: &Report) -> Option<f64> {
    let n = r.nvml.as_ref()?;
    if !n.available || n.gpus.is_empty() {
        return None;
    }
    let from = gpu_work_from(r);
    let mean = |g: &GpuSeries| mean_util(judged_samples(g, from)).unwrap_or(g.mean_util_percent);
    Some(n.gpus.iter().map(mean).sum::<f64>() / n.gpus.len() as f64)
}

/// `" since the first GPU allocation at 9.3 s"` when the utilisation leaves the start-up out.
fn util_since(r: &Report) -> String {
    r.nvml
        .iter()
        .flat_map(|n| &n.gpus)
        .find_map(|g| util_since_work(r, g))
        .map(|(_, from)| {
            format!(
                " since the job's first GPU allocation at {}",
                units::dur(from)
            )
        })
        .unwrap_or_default()
}

fn util_line(r: &Report) -> String {
    match (gpu_util(r), r.nvml.as_ref()) {
        (Some(u), _) => format!("mean GPU utilisation {u:.0}%{} (NVML)", util_since(r)),
        (None, Some(n)) => format!(
            "GPU utilisation not measured: {}",
            n.reason.as_deref().unwrap_or("NVML unavailable")
        ),
        (None, None) => "GPU utilisation not measured".into(),
    }
}

fn cuda_procs(r: &Report) -> impl Iterator<Item = (&ProcessReport, &ProcessCuda)> {
    r.processes.iter().filter_map(|p| {
        p.cuda
            .as_ref()
            .filter(|c| !c.api.is_empty())
            .map(|c| (p, c))
    })
}

struct Syncs {
    calls: u64,
    calls_ns: u64,
    tiny_copies: u64,
    tiny_copies_ns: u64,
}

fn syncs(c: &ProcessCuda) -> Syncs {
    let (calls, calls_ns) = api(c, is_sync).fold((0, 0), |a, s| (a.0 + s.count, a.1 + s.total_ns));
    let (tiny_copies, tiny_copies_ns) = c
        .copies
        .iter()
        .filter(|k| k.direction == "D2H" && k.mode == "sync" && k.count > 0)
        .filter(|k| k.bytes / k.count <= TINY_COPY_BYTES)
        .fold((0, 0), |a, k| (a.0 + k.count, a.1 + k.total_ns));
    Syncs {
        calls,
        calls_ns,
        tiny_copies,
        tiny_copies_ns,
    }
}

/// gpu-bound: the CPU side waits for the GPU in syncs while the GPU is busy.
pub fn gpu_bound(r: &Report) -> Vec<Finding> {
    let mut out = Vec::new();
    let util = gpu_util(r);
    for (p, c) in cuda_procs(r) {
        let s = syncs(c);
        let (pct, tid, who) = share(r, p, "cuda_sync", s.calls_ns);
        if pct < GPU_SYNC_MIN {
            continue;
        }
        let rate = units::per_sec(s.calls, r.window.duration_ns);
        let mean = s.calls_ns.checked_div(s.calls).unwrap_or(0);
        let busy = match util {
            Some(u) => u >= GPU_UTIL_BUSY,
            // Without NVML, long and infrequent waits mean the GPU had work queued.
            None => !(rate >= SYNC_RATE_MIN && mean < SYNC_SHORT_NS),
        };
        if !busy {
            continue;
        }
        let mut f = finding(
            "gpu-bound",
            pct,
            format!(
                "GPU-bound: {who} waited {pct:.0}% of wall time for the GPU to finish ({})",
                util_line(r)
            ),
            [
                format!(
                    "{} sync calls ({rate:.1}/s), mean wait {}",
                    s.calls,
                    units::dur(mean)
                ),
                util_line(r),
            ]
            .into_iter()
            .chain(
                super::cuda_call_sites(p, "cuda_sync", 3)
                    .into_iter()
                    .map(|(s, ns)| format!("{s}: {}", units::dur(ns))),
            )
            .collect(),
            vec![
                "The GPU is the bottleneck, which is where a training job should be. To go \
                 faster, make the GPU work cheaper: mixed precision (torch.autocast / bf16), \
                 fused or better kernels (torch.compile), larger efficient batch sizes.",
                "Profile the kernels themselves (Nsight Systems / Nsight Compute) to find the \
                 slow ones.",
            ],
            Some(p.pid),
            tid,
        );
        // Being GPU-bound is the healthy state; it ranks by impact but never reads as alarming.
        if f.severity == "critical" || f.severity == "high" {
            f.severity = "medium".into();
        }
        out.push(f);
    }
    out
}

/// launch-bound: the CPU spends its time launching many small kernels.
pub fn launch_bound(r: &Report) -> Vec<Finding> {
    let mut out = Vec::new();
    let util = gpu_util(r);
    for (p, c) in cuda_procs(r) {
        let (calls, calls_ns) =
            api(c, is_launch).fold((0, 0), |a, s| (a.0 + s.count, a.1 + s.total_ns));
        let kernel_launches: u64 = c.kernels.iter().map(|k| k.launches).sum();
        let launches = kernel_launches.max(calls);
        if launches == 0 {
            continue;
        }
        let launch_ns = calls_ns.max(c.kernels.iter().map(|k| k.launch_ns).sum());
        let (pct, tid, who) = share(r, p, "cuda_launch", launch_ns);
        let rate = units::per_sec(launches, r.window.duration_ns);
        let window_share = units::pct(launch_ns, r.window.duration_ns);
        let fires =
            pct >= LAUNCH_MIN || (rate >= LAUNCH_RATE_MIN && window_share >= LAUNCH_SHARE_MIN);
        if !fires || util.is_some_and(|u| u >= 90.0) {
            continue;
        }
        let tiny: u64 = c
            .kernels
            .iter()
            .filter(|k| {
                let blocks = k.grid.iter().map(|&g| g.max(1) as u64).product::<u64>();
                blocks <= TINY_KERNEL_BLOCKS
            })
            .map(|k| k.launches)
            .sum();
        let mut evidence = vec![
            format!(
                // Wall time in the call: on a busy machine it includes waits for a CPU.
                "{launches} launches in {} ({rate:.0}/s), {} in each launch call",
                units::dur(r.window.duration_ns),
                units::dur(launch_ns / launches)
            ),
            format!("{} distinct kernels", c.kernels.len()),
        ];
        if kernel_launches > 0 {
            evidence.push(format!(
                "{:.0}% of launches have at most {TINY_KERNEL_BLOCKS} blocks",
                units::pct(tiny, kernel_launches)
            ));
        }
        let mut ks: Vec<_> = c.kernels.iter().collect();
        ks.sort_by_key(|k| std::cmp::Reverse(k.launches));
        for k in ks.iter().take(3) {
            evidence.push(format!(
                "{}: {} launches, grid {}x{}x{}, block {}x{}x{}",
                k.name,
                k.launches,
                k.grid[0],
                k.grid[1],
                k.grid[2],
                k.block[0],
                k.block[1],
                k.block[2]
            ));
        }
        evidence.push(util_line(r));
        out.push(finding(
            "launch-bound",
            pct,
            format!(
                "Launch-bound: {who} spent {pct:.0}% of wall time launching kernels \
                 ({rate:.0} launches/s, {} each)",
                units::dur(launch_ns / launches)
            ),
            evidence,
            vec![
                "Capture the step in a CUDA graph (torch.cuda.graphs / CUDAGraph) so one launch \
                 replays hundreds of kernels.",
                "torch.compile(model, mode=\"reduce-overhead\") fuses small ops and uses CUDA \
                 graphs.",
                "Give each kernel more work: larger batches, fused optimisers (foreach=True / \
                 fused=True), fewer tiny elementwise ops.",
            ],
            Some(p.pid),
            tid,
        ));
    }
    out
}

/// transfer-bound: time goes to host<->device copies.
pub fn transfer_bound(r: &Report) -> Vec<Finding> {
    let mut out = Vec::new();
    for (p, c) in cuda_procs(r) {
        let copy_ns = c
            .copies
            .iter()
            .map(|k| k.total_ns)
            .sum::<u64>()
            .max(api(c, is_memcpy).map(|a| a.total_ns).sum());
        let (pct, tid, who) = share(r, p, "cuda_memcpy", copy_ns);
        // The cuda_memcpy category also holds time that moves nothing across the link:
        // memsets, and tiny synchronous read-backs (`.item()`), which wait for the GPU and
        // are sync points (sync-heavy counts them). Only the rest is transfer time: a loop of
        // 4-byte read-backs read "transfer-bound (1.2 KB at 1.9 KB/s)", memsets "(0 B at -)".
        let memset_ns: u64 = api(c, |f| f.contains("Memset")).map(|a| a.total_ns).sum();
        let readback_ns = syncs(c).tiny_copies_ns;
        let moving_ns = copy_ns.saturating_sub(readback_ns);
        let pct = pct * moving_ns as f64 / (copy_ns + memset_ns).max(1) as f64;
        let bytes: u64 = c.copies.iter().map(|k| k.bytes).sum();
        if pct < MEMCPY_MIN || bytes == 0 {
            continue;
        }
        let mut evidence: Vec<String> = c
            .copies
            .iter()
            .map(|k| {
                format!(
                    "{} {}: {} copies, {}, {} in calls, {:.2} GB/s",
                    k.direction,
                    k.mode,
                    k.count,
                    units::bytes(k.bytes),
                    units::dur(k.total_ns),
                    k.gbps
                )
            })
            .collect();
        evidence.push(format!(
            "a PCIe 4.0 x16 link moves about {PCIE4_X16_GBPS:.0} GB/s with pinned memory"
        ));
        let pageable = c.copies.iter().any(|k| {
            k.direction == "H2D"
                && k.mode == "sync"
                && k.count > 0
                && k.bytes / k.count >= PAGEABLE_MIN_BYTES
                && k.gbps < PAGEABLE_GBPS
        });
        let mut sugg = Vec::new();
        if pageable {
            evidence.push(format!(
                "synchronous host-to-device copies under {PAGEABLE_GBPS:.0} GB/s: the host \
                 memory is likely pageable (staged through a bounce buffer)"
            ));
            sugg.push(
                "Pin host memory: DataLoader(pin_memory=True) or tensor.pin_memory(), then \
                 .to(device, non_blocking=True) so copies overlap compute.",
            );
        } else {
            sugg.push(
                "Overlap copies with compute: pinned memory, .to(device, non_blocking=True), a \
                 separate copy stream.",
            );
        }
        sugg.push(
            "Move less: keep tensors on the GPU between steps, send uint8/fp16 instead of fp32, \
             decode/augment on the GPU.",
        );
        sugg.push("Batch many small copies into one large copy.");
        out.push(finding(
            "transfer-bound",
            pct,
            format!(
                "Transfer-bound: {who} spent {pct:.0}% of wall time in host<->device copies \
                 ({} at {})",
                units::bytes(bytes),
                units::rate(bytes, copy_ns)
            ),
            evidence,
            sugg,
            Some(p.pid),
            tid,
        ));
    }
    out
}

/// sync-heavy: frequent short synchronisations (`.item()`, `.cpu()`, explicit syncs) keep the
/// CPU from queueing work ahead of the GPU.
pub fn sync_heavy(r: &Report, gpu_bound_pids: &[u32]) -> Vec<Finding> {
    let mut out = Vec::new();
    for (p, c) in cuda_procs(r).filter(|(p, _)| !gpu_bound_pids.contains(&p.pid)) {
        let s = syncs(c);
        let points = s.calls + s.tiny_copies;
        let rate = units::per_sec(points, r.window.duration_ns);
        let (sync_pct, tid, who) = share(r, p, "cuda_sync", s.calls_ns);
        let tiny_pct = units::pct(s.tiny_copies_ns, r.window.duration_ns);
        let pct = sync_pct + tiny_pct;
        if rate < SYNC_HEAVY_RATE || pct < SYNC_SHARE_MIN {
            continue;
        }
        let mut evidence = vec![format!(
            "{} sync calls and {} small synchronous device-to-host copies: {rate:.0} sync \
             points/s",
            s.calls, s.tiny_copies
        )];
        if let Some(m) = s.calls_ns.checked_div(s.calls) {
            evidence.push(format!("mean sync wait {}", units::dur(m)));
        }
        let sites = super::cuda_call_sites(p, "cuda_sync", 3);
        let from = sites
            .first()
            .map(|(s, _)| format!(", mostly {s}"))
            .unwrap_or_default();
        evidence.extend(
            sites
                .iter()
                .map(|(s, ns)| format!("{s}: {}", units::dur(*ns))),
        );
        evidence.push(util_line(r));
        out.push(finding(
            "sync-heavy",
            pct,
            format!(
                "Sync-heavy: {who} synchronised with the GPU {rate:.0} times/s, {pct:.0}% of \
                 wall time{from}"
            ),
            evidence,
            vec![
                "Avoid .item(), .cpu(), .numpy(), print(tensor) and Python conditions on GPU \
                 values inside the step; accumulate metrics on the GPU and read them every N \
                 steps.",
                "torch.cuda.set_sync_debug_mode(\"warn\") names every synchronising call.",
                "Replace cudaDeviceSynchronize with events on the streams that need them.",
            ],
            Some(p.pid),
            tid,
        ));
    }
    out
}

/// allocation-churn: frequent cudaMalloc/cudaFree (each may synchronise the device).
pub fn allocation_churn(r: &Report) -> Vec<Finding> {
    let mut out = Vec::new();
    for (p, c) in cuda_procs(r) {
        let (allocs, alloc_ns) =
            api(c, is_alloc).fold((0, 0), |a, s| (a.0 + s.count, a.1 + s.total_ns));
        let (frees, free_ns) =
            api(c, is_free).fold((0, 0), |a, s| (a.0 + s.count, a.1 + s.total_ns));
        let allocs = allocs.max(c.memory.allocs);
        let frees = frees.max(c.memory.frees);
        let rate = units::per_sec(allocs + frees, r.window.duration_ns);
        let (pct, tid, who) = share(r, p, "cuda_malloc", alloc_ns + free_ns);
        if rate < ALLOC_RATE_MIN && pct < ALLOC_SHARE_MIN {
            continue;
        }
        out.push(finding(
            "allocation-churn",
            pct,
            format!(
                "Allocation churn: {who} made {rate:.0} cudaMalloc/cudaFree calls/s, {pct:.1}% \
                 of wall time"
            ),
            vec![
                format!(
                    "{allocs} allocations ({}), {frees} frees in {}",
                    units::bytes(c.memory.alloc_bytes),
                    units::dur(r.window.duration_ns)
                ),
                format!(
                    "{} in allocation calls, {} in frees; peak live {}",
                    units::dur(alloc_ns),
                    units::dur(free_ns),
                    units::bytes(c.memory.peak_live_bytes)
                ),
            ],
            vec![
                "Allocate once and reuse buffers; cudaFree synchronises the whole device.",
                "PyTorch: make sure the caching allocator is on (PYTORCH_NO_CUDA_MEMORY_CACHING \
                 unset) and torch.cuda.empty_cache() is not called in the loop.",
                "Use stream-ordered pools (cudaMallocAsync) or CUDA graphs with static buffers.",
            ],
            Some(p.pid),
            tid,
        ));
    }
    out
}

/// gpu-memory-not-freed: memory allocated during the trace and still held at its end.
pub fn memory_not_freed(r: &Report) -> Vec<Finding> {
    let mut out = Vec::new();
    for (p, c) in cuda_procs(r) {
        let held: u64 = c.memory.never_freed.iter().map(|a| a.bytes).sum();
        if held < NOT_FREED_MIN_BYTES {
            continue;
        }
        let mut evidence = vec![format!(
            "{} allocations never freed, {} in total; {} live at the end, peak {}",
            c.memory.never_freed.len(),
            units::bytes(held),
            units::bytes(c.memory.live_bytes_at_end),
            units::bytes(c.memory.peak_live_bytes)
        )];
        for a in c.memory.never_freed.iter().take(3) {
            evidence.push(format!(
                "{} of {} at {}",
                a.function,
                units::bytes(a.bytes),
                units::dur(a.at_ns)
            ));
        }
        let mut f = finding(
            "gpu-memory-not-freed",
            1.0,
            format!(
                "{} (pid {}) allocated {} of GPU memory during the trace and never freed it",
                p.comm,
                p.pid,
                units::bytes(held)
            ),
            evidence,
            vec![
                "If it keeps growing across steps, something holds references (tensors kept \
                 in a list, a loss history with autograd graphs: use loss.item() when logging).",
                "torch.cuda.memory_summary() shows who holds it.",
            ],
            Some(p.pid),
            None,
        );
        f.severity = "low".into();
        out.push(f);
    }
    out
}

/// cuda-errors: CUDA calls that return errors.
pub fn cuda_errors(r: &Report) -> Vec<Finding> {
    let mut out = Vec::new();
    for (p, c) in cuda_procs(r) {
        let calls: u64 = c.api.iter().map(|a| a.count).sum();
        let mut errs: Vec<(&str, &str, u64)> = c
            .api
            .iter()
            .flat_map(|a| {
                a.errors
                    .iter()
                    .map(move |e| (a.function.as_str(), e.name.as_str(), e.count))
            })
            .filter(|e| e.2 > 0)
            .collect();
        let failed: u64 = errs.iter().map(|e| e.2).sum();
        if failed == 0 {
            continue;
        }
        errs.sort_by_key(|e| std::cmp::Reverse(e.2));
        let share = units::pct(failed, calls);
        let (_, top_err, _) = errs[0];
        let evidence = errs
            .iter()
            .take(5)
            .map(|(f, e, n)| format!("{f}: {n} x {e}"))
            .collect();
        let mut f = finding(
            "cuda-errors",
            share,
            format!(
                "{failed} of {calls} CUDA calls failed ({share:.0}%) in {} (pid {}), mostly {top_err}",
                p.comm, p.pid
            ),
            evidence,
            vec![
                "A failing runtime often means the job silently fell back to the CPU: check \
                 the driver (nvidia-smi), CUDA_VISIBLE_DEVICES and the runtime/driver versions.",
                "Run with CUDA_LAUNCH_BLOCKING=1 and compute-sanitizer to find the first error.",
            ],
            Some(p.pid),
            None,
        );
        if share >= 50.0 {
            f.severity = "critical".into();
        } else if f.severity == "low" {
            f.severity = "medium".into();
        }
        out.push(f);
    }
    out
}

/// gpu-idle: NVML says the GPU mostly did nothing while the process used CUDA. A symptom: the
/// findings that name a cause rank above it (its impact is halved).
pub fn gpu_idle(r: &Report) -> Vec<Finding> {
    let Some(util) = gpu_util(r) else {
        return vec![];
    };
    let users: Vec<&ProcessReport> = cuda_procs(r).map(|(p, _)| p).collect();
    if users.is_empty() || util >= GPU_IDLE_UTIL {
        return vec![];
    }
    let nvml = r.nvml.as_ref().expect("gpu_util needs nvml");
    let from = gpu_work_from(r);
    let mut evidence = Vec::new();
    for g in &nvml.gpus {
        let samples = judged_samples(g, from);
        let mean = mean_util(samples).unwrap_or(0.0);
        let max = samples.iter().map(|s| s.util_gpu).max().unwrap_or(0);
        let none = samples.iter().filter(|s| s.util_gpu == 0).count();
        // NVML's utilisation is the share of its sample period in which a kernel ran: a GPU
        // at 18% in every sample is idle 82% of the time without one idle sample.
        evidence.push(format!(
            "GPU {} {}: a kernel ran {mean:.0}% of the time on average, at most {max}% in one \
             sample; no kernel at all in {none} of {} samples{}",
            g.index,
            g.name,
            samples.len(),
            util_since(r)
        ));
    }
    vec![finding(
        "gpu-idle",
        (100.0 - util) / 2.0,
        format!(
            "{}: the GPU was idle most of the time (mean utilisation {util:.0}%)",
            capitalize(&format!("{} (pid {})", users[0].comm, users[0].pid))
        ),
        evidence,
        vec![
            "The GPU waits on the host: the other findings say for what (data, launches, \
             copies, syncs).",
            "If nothing else fired, the job may simply be too small for the GPU: larger batches \
             or several jobs per GPU (MPS, MIG).",
        ],
        Some(users[0].pid),
        None,
    )]
}
