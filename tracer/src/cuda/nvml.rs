//! NVML sampling on its own thread: per GPU utilisation, memory, PCIe throughput, SM clock and
//! power, and per-process utilisation where the driver offers it. Without an NVIDIA driver the
//! sampler says so once and the trace carries on.

use std::{
    collections::BTreeMap,
    ffi::OsString,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::Duration,
};

use nvml_wrapper::{
    enum_wrappers::device::{Clock, PcieUtilCounter},
    Nvml as Lib,
};

use crate::{
    probes::ktime_now,
    report::model::cuda::{GpuSample, GpuSeries, Nvml},
};

/// Loads this libnvidia-ml instead of the system's (tests use a fake one).
pub const LIB_ENV: &str = "GPUTRACE_NVML_LIB";

pub struct Sampler {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<Sampled>>,
}

/// Samples with `t_ns` in CLOCK_MONOTONIC ns, rebased by [`Sampler::finish`].
struct Sampled {
    nvml: Nvml,
    /// gpu index -> pid -> (sum of SM %, samples).
    process_util: BTreeMap<u32, BTreeMap<u32, (u64, u64)>>,
}

/// The shortest wait between two NVML samples.
pub const MIN_INTERVAL: Duration = Duration::from_millis(1);

impl Sampler {
    pub fn start(interval: Duration) -> Sampler {
        // NVML refreshes its utilisation counters every ~1/6 s: a shorter wait only spins the
        // sampling thread (a 1 ns `--nvml-interval` was a busy loop).
        let interval = interval.max(MIN_INTERVAL);
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let lib = std::env::var_os(LIB_ENV);
        let handle = std::thread::Builder::new()
            .name("gputrace-nvml".into())
            .spawn(move || run(interval, lib, &stop2))
            .ok();
        Sampler { stop, handle }
    }

    /// Stops sampling; the series' times become ns since `window_start_ktime`.
    pub fn finish(mut self, window_start_ktime: u64, pids: &[u32]) -> Nvml {
        self.stop.store(true, Ordering::Relaxed);
        let Some(Ok(mut s)) = self.handle.take().map(JoinHandle::join) else {
            return Nvml {
                available: false,
                reason: Some("the NVML sampling thread failed".into()),
                ..Default::default()
            };
        };
        for g in &mut s.nvml.gpus {
            for x in &mut g.samples {
                x.t_ns = x.t_ns.saturating_sub(window_start_ktime);
            }
            if let Some(per) = s.process_util.get(&g.index) {
                g.process_util = per
                    .iter()
                    .filter(|(pid, _)| pids.contains(pid))
                    .map(|(pid, (sum, n))| (*pid, *sum as f64 / (*n).max(1) as f64))
                    .collect();
            }
        }
        s.nvml
    }
}

fn run(interval: Duration, lib: Option<OsString>, stop: &AtomicBool) -> Sampled {
    let mut out = Sampled {
        nvml: Nvml {
            interval_ms: interval.as_millis() as u64,
            ..Default::default()
        },
        process_util: BTreeMap::new(),
    };
    let init = match &lib {
        Some(path) => Lib::builder().lib_path(path).init(),
        None => Lib::init(),
    };
    let nvml = match init {
        Ok(n) => n,
        Err(e) => {
            // Said once, in the report (terminal summary and report.json), not on stderr: a
            // CPU-only target on a machine without a GPU is not an error.
            out.nvml.reason = Some(format!("no NVIDIA driver or NVML library ({e})"));
            return out;
        }
    };
    let count = nvml.device_count().unwrap_or(0);
    out.nvml.available = true;
    for i in 0..count {
        let name = nvml
            .device_by_index(i)
            .and_then(|d| d.name())
            .unwrap_or_else(|_| format!("GPU {i}"));
        out.nvml.gpus.push(GpuSeries {
            index: i,
            name,
            ..Default::default()
        });
    }
    let mut last_seen: u64 = 0;
    loop {
        let t = ktime_now();
        for g in out.nvml.gpus.iter_mut() {
            let Ok(d) = nvml.device_by_index(g.index) else {
                continue;
            };
            let util = d.utilization_rates().ok();
            let mem = d.memory_info().ok();
            g.samples.push(GpuSample {
                t_ns: t,
                util_gpu: util.as_ref().map_or(0, |u| u.gpu),
                util_mem: util.as_ref().map_or(0, |u| u.memory),
                mem_used_bytes: mem.as_ref().map_or(0, |m| m.used),
                mem_total_bytes: mem.as_ref().map_or(0, |m| m.total),
                pcie_tx_kbps: d.pcie_throughput(PcieUtilCounter::Send).unwrap_or(0),
                pcie_rx_kbps: d.pcie_throughput(PcieUtilCounter::Receive).unwrap_or(0),
                sm_clock_mhz: d.clock_info(Clock::SM).unwrap_or(0),
                power_mw: d.power_usage().unwrap_or(0),
            });
            if let Ok(ps) = d.process_utilization_stats(last_seen) {
                let per = out.process_util.entry(g.index).or_default();
                for p in ps {
                    let e = per.entry(p.pid).or_default();
                    e.0 += p.sm_util as u64;
                    e.1 += 1;
                    last_seen = last_seen.max(p.timestamp);
                }
            }
        }
        // Sleep in short steps so the end of the trace is not delayed by a long interval.
        let mut slept = Duration::ZERO;
        while slept < interval {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let step = (interval - slept).min(Duration::from_millis(20));
            std::thread::sleep(step);
            slept += step;
        }
        if stop.load(Ordering::Relaxed) {
            break;
        }
    }
    for g in out.nvml.gpus.iter_mut() {
        if !g.samples.is_empty() {
            g.mean_util_percent =
                g.samples.iter().map(|s| s.util_gpu as f64).sum::<f64>() / g.samples.len() as f64;
        }
    }
    out
}
