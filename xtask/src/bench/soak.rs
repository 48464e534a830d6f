//! The memory soak (issue 6: "memory of gputrace bounded for an hour-long trace at 100k
//! events/s"): gputrace at default settings on a steady mix of every kind of event it
//! aggregates (`xtask/bench/soak.c`), its resident memory sampled from /proc while it runs.
//! Aggregation, not retention, means the curve flattens once each table has seen its keys.

use std::{
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use super::{drops, read_report};

/// getppid calls and launches per millisecond of the workload: 50 calls are 100k syscall
/// events a second, the rate the issue names; the launches are sampled by the budget.
const CALLS_PER_MS: u32 = 50;
const LAUNCHES_PER_MS: u32 = 5;
const SAMPLE_EVERY: Duration = Duration::from_secs(5);

/// A process's resident memory (KiB) and CPU time (s), from /proc.
fn rss_and_cpu(pid: u32) -> Option<(u64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which may hold spaces: utime and stime are 14 and 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // USER_HZ: /proc counts CPU time in hundredths of a second on every architecture we run.
    Some((rss, ticks / 100.0))
}

/// (seconds since start, RSS KiB) at the samples nearest to these shares of the run.
fn marks(samples: &[(f64, u64)], seconds: u64) -> Vec<(f64, u64)> {
    let mut out: Vec<(f64, u64)> = Vec::new();
    let mut at = vec![10.0, 60.0];
    at.extend([0.25, 0.5, 0.75].iter().map(|s| s * seconds as f64));
    at.retain(|t| *t < seconds as f64 * 0.95);
    at.sort_by(f64::total_cmp);
    for t in at {
        if let Some(s) = samples.iter().find(|(st, _)| *st >= t) {
            if out.last() != Some(s) {
                out.push(*s);
            }
        }
    }
    if let Some(last) = samples.last() {
        if out.last() != Some(last) {
            out.push(*last);
        }
    }
    out
}

fn mib(kib: u64) -> String {
    format!("{:.0}", kib as f64 / 1024.0)
}

pub fn soak(g: &Path, workload: &Path, cudart: &Path, dir: &Path, seconds: u64) -> Result<String> {
    eprintln!("xtask: bench soak ({seconds} s)");
    let out = dir.join("soak-out");
    let _ = std::fs::remove_dir_all(&out);
    let time_out = dir.join("soak-rusage");
    // Under GNU time for the peak RSS: it comes at the end, while the report is built, most
    // likely between two of the 5 s samples.
    let mut child = Command::new("/usr/bin/time")
        .args(["-f", "maxrss %M", "-o"])
        .arg(&time_out)
        .arg(g)
        // Every event through: at the default budget the syscall tracepoints would come off
        // the workload's 50,000 syscalls a second (3.5% of its thread's time), and the soak
        // is about memory at 100k events/s.
        .args(["--max-overhead", "100%"])
        .arg("--libcudart")
        .arg(cudart)
        .arg("-o")
        .arg(&out)
        .arg("--")
        .arg(workload)
        .arg(cudart)
        .arg(seconds.to_string())
        .arg(CALLS_PER_MS.to_string())
        .arg(LAUNCHES_PER_MS.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("start gputrace")?;
    // Read as it comes: the terminal report must not fill the pipe and stall gputrace.
    let mut pipe = child.stdout.take().context("no stdout")?;
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        use std::io::Read;
        let _ = pipe.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let mut pid = None;
    let mut samples: Vec<(f64, u64)> = Vec::new();
    let mut cpu = 0.0;
    while child.try_wait()?.is_none() {
        pid = pid.or_else(|| {
            let c = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", child.id()));
            c.ok()?.split_whitespace().next()?.parse::<u32>().ok()
        });
        if let Some((rss, c)) = pid.and_then(rss_and_cpu) {
            samples.push((start.elapsed().as_secs_f64(), rss));
            cpu = c;
        }
        std::thread::sleep(SAMPLE_EVERY.min(Duration::from_secs(seconds.max(1))));
    }
    let status = child.wait()?;
    let stdout = reader.join().unwrap_or_default();
    if !status.success() || !stdout.contains("ticks ") {
        // The last 400 characters (the report has multi-byte ones: µs, …).
        let from = stdout.char_indices().rev().nth(399).map_or(0, |(i, _)| i);
        let tail = &stdout[from..];
        bail!("gputrace on the soak exited with {status}; its output ends {tail:?}");
    }
    let peak_kib: u64 = std::fs::read_to_string(&time_out)
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("maxrss "))?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0);
    let r = read_report(&out)?;
    let o = &r["overhead"];
    let hits = o["probe_hits"].as_f64().unwrap_or(0.0);
    let syscalls: f64 = r["processes"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .flat_map(|p| p["syscalls"].as_array().into_iter().flatten())
                .filter_map(|s| s["count"].as_f64())
                .sum()
        })
        .unwrap_or(0.0);
    let behind = stdout
        .lines()
        .find_map(|l| l.strip_prefix("ms_behind "))
        .unwrap_or("?")
        .trim()
        .to_string();
    let report_kib = std::fs::metadata(out.join("report.json")).map_or(0, |m| m.len() / 1024);
    let trace_kib = std::fs::metadata(out.join("trace.json")).map_or(0, |m| m.len() / 1024);
    let after_minute: Vec<u64> = samples
        .iter()
        .filter(|(t, _)| *t >= 60.0)
        .map(|s| s.1)
        .collect();
    let growth = match (after_minute.first(), samples.last()) {
        (Some(&first), Some(&(t, last))) if t > 120.0 => {
            let kib = last as f64 - first as f64;
            format!(
                "; from the first minute's end to the last sample {:+.1} MiB ({:+.0} KiB a \
                 minute)",
                kib / 1024.0,
                kib / ((t - 60.0) / 60.0)
            )
        }
        _ => String::new(),
    };
    let series: Vec<String> = marks(&samples, seconds)
        .iter()
        .map(|(t, k)| format!("{:.0} s {} MiB", t, mib(*k)))
        .collect();
    let max = samples.iter().map(|s| s.1).max().unwrap_or(0);
    // The timeline keeps up to --timeline-limit events (200,000 by default, ~104 bytes each
    // while tracing): the part of the curve that rises until that limit is reached.
    let tl = &r["timeline"];
    let timeline = format!(
        "timeline {} events kept, {} cut at the limit",
        tl["events"].as_u64().unwrap_or(0),
        tl["cut_events"].as_u64().unwrap_or(0)
    );
    let wall = start.elapsed().as_secs_f64();
    Ok(format!(
        "Memory soak: `soak` ({CALLS_PER_MS} getppid calls, {LAUNCHES_PER_MS} cudaLaunchKernel \
         and a 1 ms sleep every ms; a cudaDeviceSynchronize every 10 ms, an open/read/close every \
         100 ms, a short-lived thread every second) traced {seconds} s at default settings \
         (`--libcudart`, `-o`): {:.0} k syscalls/s of the job ({:.0} k syscall events/s), \
         {:.0} k probe hits/s on the machine; pacing fell {behind} ms behind. gputrace's RSS: \
         {}; max sampled {} MiB{growth}; peak (report building included) {} MiB. gputrace CPU {cpu:.1} s ({:.1}% of one CPU); {} dropped; \
         {timeline}; report.json {report_kib} KiB, trace.json {trace_kib} KiB.\n",
        syscalls / seconds as f64 / 1e3,
        2.0 * syscalls / seconds as f64 / 1e3,
        hits / seconds as f64 / 1e3,
        series.join(", "),
        mib(max),
        mib(peak_kib),
        100.0 * cpu / wall,
        drops(&r),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_pick_the_first_minute_quarters_and_the_end() {
        let samples: Vec<(f64, u64)> = (0..=120).map(|i| (i as f64 * 5.0, 1000 + i)).collect();
        let m = marks(&samples, 600);
        let times: Vec<f64> = m.iter().map(|s| s.0).collect();
        assert_eq!(times, vec![10.0, 60.0, 150.0, 300.0, 450.0, 600.0]);
    }

    #[test]
    fn short_runs_keep_only_the_marks_inside_them() {
        let samples: Vec<(f64, u64)> = (0..=6).map(|i| (i as f64 * 5.0, 1000)).collect();
        let m = marks(&samples, 30);
        let times: Vec<f64> = m.iter().map(|s| s.0).collect();
        assert_eq!(times, vec![10.0, 15.0, 25.0, 30.0]);
    }
}
