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
            let last = g.samples.last();
            line(
                &mut o,
                format!(
                    "GPU {} {}: mean util {:.0}%, {} samples every {} ms{}",
                    g.index,
                    g.name,
                    g.mean_util_percent,
                    g.samples.len(),
                    n.interval_ms,
                    last.map(|s| format!(
                        ", last: mem {} / {} MiB, PCIe tx {} rx {} KB/s, SM {} MHz, {:.0} W",
                        s.mem_used_bytes >> 20,
                        s.mem_total_bytes >> 20,
                        s.pcie_tx_kbps,
                        s.pcie_rx_kbps,
                        s.sm_clock_mhz,
                        s.power_mw as f64 / 1000.0
                    ))
                    .unwrap_or_default()
                ),
            );
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
