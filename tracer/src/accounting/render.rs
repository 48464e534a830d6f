//! The time section of the terminal summary and the folded stacks of the off-CPU and wall-clock
//! flame graphs.

use std::{
    collections::{BTreeMap, HashMap as StdHashMap},
    fmt::Write as _,
    io::Write,
};

use tracer_common::{time::Category, wall::WallKey};

use super::{aggregate::Row, Folded};
use crate::{
    collect::Stacks,
    probes::FinishCtx,
    report::{
        flamegraph,
        folded::{frame_label, thread_label},
        model::{time::TimeBreakdown, Report},
        Exporter, ReportData,
    },
};

/// The category frame under each thread in the flame graphs.
fn category_frame(c: Category) -> String {
    format!("[{}]", c.name())
}

/// Folded lines weighted in µs: off-CPU time by stack, and the wall graph where the on-CPU
/// samples (converted to µs at the sampling period) sit beside the off-CPU stacks.
pub fn folded(
    rows: &[Row],
    verdicts: &StdHashMap<WallKey, Category>,
    ctx: &mut FinishCtx<'_>,
    data: &ReportData,
    comms: &BTreeMap<u32, (u32, String)>,
    stacks: &mut Stacks<'_>,
) -> Folded {
    let mut off: BTreeMap<String, u64> = BTreeMap::new();
    for r in rows {
        let Some(&cat) = verdicts.get(&r.key) else {
            continue;
        };
        if cat == Category::Cpu || r.val.ns < 1000 {
            continue;
        }
        let k = &r.key;
        let comm = comms.get(&k.tid).map(|c| c.1.as_str()).unwrap_or("?");
        let mut line = thread_label(comm, k.tgid, k.tid);
        line.push(';');
        line.push_str(&category_frame(cat));
        if let Some(ips) = stacks.get(k.ustack).map(<[u64]>::to_vec) {
            let (maps, alive) = match ctx.tracker.procs.get(&k.tgid) {
                Some(t) => (t.maps.as_slice(), !t.info.exited),
                None => (&[][..], false),
            };
            for f in ctx.symbolizer.user(k.tgid, maps, alive, &ips).iter().rev() {
                line.push(';');
                line.push_str(&frame_label(f));
            }
        }
        if let Some(ips) = stacks.get(k.kstack).map(<[u64]>::to_vec) {
            for f in ctx.symbolizer.kernel(&ips).iter().rev() {
                line.push(';');
                line.push_str(&frame_label(f));
            }
        }
        *off.entry(line).or_default() += r.val.ns / 1000;
    }
    let mut wall = off.clone();
    let period_us = 1_000_000 / data.report.sampling.frequency_hz.max(1);
    for s in &data.cpu.samples {
        let mut line = thread_label(&s.comm, s.pid, s.tid);
        line.push(';');
        line.push_str(&category_frame(Category::Cpu));
        for f in &s.frames {
            line.push(';');
            line.push_str(&frame_label(f));
        }
        *wall.entry(line).or_default() += s.count * period_us;
    }
    let fmt = |m: BTreeMap<String, u64>| -> Vec<String> {
        m.into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|(l, n)| format!("{l} {n}"))
            .collect()
    };
    Folded {
        offcpu: fmt(off),
        wall: fmt(wall),
    }
}

const MAX_THREADS: usize = 12;
const MAX_PROCESSES: usize = 6;

fn secs(ns: u64) -> String {
    format!("{:.2}s", ns as f64 / 1e9)
}

fn split(b: &TimeBreakdown, max: usize) -> String {
    let mut parts: Vec<String> = b
        .categories
        .iter()
        .take(max)
        .map(|c| format!("{} {:.1}%", c.category, c.percent))
        .collect();
    if b.categories.len() > max {
        parts.push("…".into());
    }
    parts.join(", ")
}

/// "Where the time went", per process and thread; empty when accounting did not run.
pub fn terminal_section(r: &Report) -> String {
    let mut o = String::new();
    // The processes that lived longest first; short-lived helpers (shell scripts, launchers)
    // are only counted here and are all in report.json.
    let mut procs: Vec<_> = r
        .processes
        .iter()
        .filter_map(|p| p.time.as_ref().map(|b| (p, b)))
        .collect();
    procs.sort_by_key(|(p, b)| (std::cmp::Reverse(b.alive_ns), p.pid));
    let more = procs.len().saturating_sub(MAX_PROCESSES);
    for (p, b) in procs.into_iter().take(MAX_PROCESSES) {
        let _ = writeln!(
            o,
            "wall time of pid {} {}: {} alive over {} threads, {:.1}% accounted",
            p.pid,
            p.comm,
            secs(b.alive_ns),
            p.threads.iter().filter(|t| t.time.is_some()).count(),
            100.0 * b.accounted_ns as f64 / b.alive_ns.max(1) as f64
        );
        let _ = writeln!(o, "  {}", split(b, 8));
        // The threads that lived longest first; a process with hundreds of threads stays short.
        let mut threads: Vec<(&str, u32, &TimeBreakdown)> = p
            .threads
            .iter()
            .filter_map(|t| t.time.as_ref().map(|b| (t.comm.as_str(), t.tid, b)))
            .collect();
        threads.sort_by_key(|(_, tid, b)| (std::cmp::Reverse(b.alive_ns), *tid));
        for (comm, tid, tb) in threads.iter().take(MAX_THREADS) {
            let _ = writeln!(o, "  {tid:>7} {comm:<15} {}", split(tb, 4));
        }
        if threads.len() > MAX_THREADS {
            let _ = writeln!(o, "  … {} more threads", threads.len() - MAX_THREADS);
        }
        if !p.syscalls.is_empty() {
            let calls: Vec<String> = p
                .syscalls
                .iter()
                .take(5)
                .map(|s| format!("{} {}x {}", s.name, s.count, secs(s.total_ns)))
                .collect();
            let _ = writeln!(o, "  syscalls by time: {}", calls.join(", "));
        }
        for f in p.files.iter().take(3) {
            let _ = writeln!(
                o,
                "  file {}: {} in {} calls, {} bytes",
                f.file,
                secs(f.ns),
                f.calls,
                f.bytes
            );
        }
        for d in &p.block_io {
            let _ = writeln!(
                o,
                "  block {}: {} requests, read {} B, written {} B, {} in flight",
                d.device,
                d.requests,
                d.read_bytes,
                d.write_bytes,
                secs(d.total_ns)
            );
        }
    }
    if more > 0 {
        let _ = writeln!(
            o,
            "… and {more} shorter-lived processes (their time is in report.json)"
        );
    }
    o
}

pub struct OffcpuFolded;
impl Exporter for OffcpuFolded {
    fn file_name(&self) -> &'static str {
        "offcpu.folded"
    }
    fn write(&self, data: &ReportData, out: &mut dyn Write) -> anyhow::Result<()> {
        for l in &data.time.offcpu {
            writeln!(out, "{l}")?;
        }
        Ok(())
    }
}

pub struct OffcpuSvg;
impl Exporter for OffcpuSvg {
    fn file_name(&self) -> &'static str {
        "offcpu.svg"
    }
    fn write(&self, data: &ReportData, out: &mut dyn Write) -> anyhow::Result<()> {
        flamegraph::write_svg(
            "gputrace: off-CPU time by category and stack",
            "us",
            &data.time.offcpu,
            out,
        )
    }
}

pub struct WallSvg;
impl Exporter for WallSvg {
    fn file_name(&self) -> &'static str {
        "wall.svg"
    }
    fn write(&self, data: &ReportData, out: &mut dyn Write) -> anyhow::Result<()> {
        flamegraph::write_svg(
            "gputrace: wall time (on- and off-CPU) by category and stack",
            "us",
            &data.time.wall,
            out,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::model::time::CategoryTime;

    #[test]
    fn split_lists_the_largest_categories() {
        let b = TimeBreakdown {
            alive_ns: 100,
            accounted_ns: 100,
            categories: vec![
                CategoryTime {
                    category: "sleep".into(),
                    ns: 60,
                    percent: 60.0,
                },
                CategoryTime {
                    category: "cpu".into(),
                    ns: 40,
                    percent: 40.0,
                },
            ],
            ..Default::default()
        };
        assert_eq!(split(&b, 4), "sleep 60.0%, cpu 40.0%");
        assert_eq!(split(&b, 1), "sleep 60.0%, …");
    }
}
