//! The CUDA part of the terminal summary: per process the busiest API functions with their
//! errors, copies by direction, top kernels and memory; then NVML. Fits 100 columns.

use std::fmt::Write as _;

use crate::report::model::{cuda::ProcessCuda, Report};

const WIDTH: usize = 100;
const TOP: usize = 10;

pub fn section(r: &Report) -> String {
    let mut o = String::new();
    for p in &r.processes {
        let Some(c) = &p.cuda else { continue };
        let _ = writeln!(o);
        line(&mut o, format!("CUDA in pid {} {}", p.pid, p.comm));
        process(&mut o, c);
    }
    if let Some(n) = &r.nvml {
        let _ = writeln!(o);
        if !n.available {
            line(
                &mut o,
                format!(
                    "NVML: not sampled ({})",
                    n.reason.as_deref().unwrap_or("unavailable")
                ),
            );
        }
        for g in &n.gpus {
            line(
                &mut o,
                format!(
                    "GPU {} {}: mean util {:.0}%, {} samples every {} ms",
                    g.index,
                    g.name,
                    g.mean_util_percent,
                    g.samples.len(),
                    n.interval_ms
                ),
            );
            if let Some(s) = g.samples.last() {
                line(
                    &mut o,
                    format!(
                        "  last: mem {} / {} MiB, PCIe tx {} rx {} KB/s, SM {} MHz, {:.0} W",
                        s.mem_used_bytes >> 20,
                        s.mem_total_bytes >> 20,
                        s.pcie_tx_kbps,
                        s.pcie_rx_kbps,
                        s.sm_clock_mhz,
                        s.power_mw as f64 / 1000.0
                    ),
                );
            }
            for (pid, util) in &g.process_util {
                line(&mut o, format!("  pid {pid}: mean SM {util:.0}%"));
            }
        }
    }
    o
}

fn process(o: &mut String, c: &ProcessCuda) {
    for l in &c.libraries {
        line(
            o,
            format!(
                "  {} {}: {} probes{}",
                l.kind,
                l.path,
                l.attached.len(),
                if l.failed.is_empty() {
                    String::new()
                } else {
                    format!(", {} failed", l.failed.len())
                }
            ),
        );
    }
    if !c.api.is_empty() {
        line(
            o,
            format!(
                "  {:<32} {:>9} {:>11} {:>10} {:>10} {:>9}",
                "API function", "calls", "total ms", "mean us", "max us", "errors"
            ),
        );
    }
    for a in c.api.iter().take(TOP) {
        let failed: u64 = a.errors.iter().map(|e| e.count).sum();
        line(
            o,
            format!(
                "  {:<32} {:>9} {:>11.3} {:>10.1} {:>10.1} {:>9}",
                a.function,
                a.count,
                a.total_ns as f64 / 1e6,
                a.total_ns as f64 / a.count.max(1) as f64 / 1e3,
                a.max_ns as f64 / 1e3,
                failed
            ),
        );
        for e in &a.errors {
            line(o, format!("      {} x {} ({})", e.count, e.name, e.code));
        }
    }
    for cp in &c.copies {
        line(
            o,
            format!(
                "  copies {:<7} {:<5} {:>7} x, {:>12} bytes, {:.2} GB/s in the call",
                cp.direction, cp.mode, cp.count, cp.bytes, cp.gbps
            ),
        );
    }
    if !c.kernels.is_empty() {
        line(o, "  top kernels by launches:".into());
    }
    for k in c.kernels.iter().take(TOP) {
        line(
            o,
            format!(
                "  {:>9}  grid {:?} block {:?}  {}",
                k.launches, k.grid, k.block, k.name
            ),
        );
    }
    let m = &c.memory;
    if m.allocs + m.frees > 0 {
        line(
            o,
            format!(
                "  memory: {} allocs ({} bytes), {} frees, peak live {} bytes, {} bytes never freed",
                m.allocs, m.alloc_bytes, m.frees, m.peak_live_bytes, m.live_bytes_at_end
            ),
        );
    }
}

fn line(o: &mut String, s: String) {
    if s.chars().count() <= WIDTH {
        let _ = writeln!(o, "{s}");
    } else {
        let c: String = s.chars().take(WIDTH - 1).collect();
        let _ = writeln!(o, "{c}…");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::model::cuda::{
        ApiStat, CopyStat, CudaErrorCount, GpuSample, GpuSeries, KernelStat, Nvml,
    };

    fn report(cuda: ProcessCuda, nvml: Option<Nvml>) -> Report {
        let mut r: Report = serde_json::from_value(serde_json::json!({
            "schema_version": 1, "tool": "gputrace test",
            "target": {"command": null, "pids": [7], "follow_children": true, "exit_code": null},
            "window": {"start_unix_ns": 0, "duration_ns": 1, "ended_by": "duration",
                       "attach_ms": 1.0},
            "sampling": {"frequency_hz": 99, "cpus": 1, "samples": 0},
            "processes": [{"pid": 7, "ppid": null, "comm": "train", "cmdline": [],
                           "exited": false, "samples": 0, "top_self": [], "top_total": [],
                           "threads": []}],
            "drops": [], "blind_spots": [], "warnings": []
        }))
        .unwrap();
        r.processes[0].cuda = Some(cuda);
        r.nvml = nvml;
        r
    }

    #[test]
    fn renders_api_errors_copies_kernels_and_gpus() {
        let cuda = ProcessCuda {
            api: vec![ApiStat {
                function: "cudaMalloc".into(),
                layer: "runtime".into(),
                count: 4,
                total_ns: 4_000_000,
                max_ns: 2_000_000,
                errors: vec![CudaErrorCount {
                    code: 35,
                    name: "cudaErrorInsufficientDriver".into(),
                    count: 4,
                }],
                ..Default::default()
            }],
            copies: vec![CopyStat {
                direction: "H2D".into(),
                mode: "sync".into(),
                count: 2,
                bytes: 2048,
                total_ns: 1000,
                gbps: 2.048,
            }],
            kernels: vec![KernelStat {
                name: "vectorAdd(float*)".into(),
                launches: 9,
                grid: [4, 1, 1],
                block: [128, 1, 1],
                launch_ns: 10,
            }],
            ..Default::default()
        };
        let nvml = Nvml {
            available: true,
            reason: None,
            interval_ms: 100,
            gpus: vec![GpuSeries {
                index: 0,
                name: "H100".into(),
                samples: vec![GpuSample {
                    power_mw: 300_000,
                    ..Default::default()
                }],
                mean_util_percent: 55.0,
                process_util: vec![],
            }],
        };
        let s = section(&report(cuda, Some(nvml)));
        assert!(s.contains("CUDA in pid 7 train"), "{s}");
        let malloc = s.lines().find(|l| l.contains("cudaMalloc")).unwrap();
        assert!(
            malloc.contains(" 4 ") && malloc.contains("1000.0"),
            "{malloc}"
        );
        assert!(s.contains("4 x cudaErrorInsufficientDriver (35)"), "{s}");
        assert!(
            s.contains("copies H2D     sync") && s.contains("2048 bytes"),
            "{s}"
        );
        assert!(
            s.contains("grid [4, 1, 1] block [128, 1, 1]  vectorAdd(float*)"),
            "{s}"
        );
        assert!(s.contains("GPU 0 H100: mean util 55%"), "{s}");
        assert!(s.contains("300 W"), "{s}");
        assert!(s.lines().all(|l| l.chars().count() <= WIDTH));
    }

    #[test]
    fn says_why_nvml_is_missing_and_skips_processes_without_cuda() {
        let mut r = report(ProcessCuda::default(), None);
        r.processes[0].cuda = None;
        r.nvml = Some(Nvml {
            available: false,
            reason: Some("no NVIDIA driver".into()),
            ..Default::default()
        });
        let s = section(&r);
        assert!(!s.contains("CUDA in pid"));
        assert!(s.contains("NVML: not sampled (no NVIDIA driver)"), "{s}");
    }
}
