//! Cost per CPU sample of the Python frame walk: runs gputrace on tests/workloads/py_hot.py with
//! `--python off` and `--python auto` and reads the kernel's run-time statistics of the
//! `cpu_sample` program (kernel.bpf_stats_enabled, restored afterwards). Root only.
//!
//! `cargo build --examples && sudo target/debug/examples/py_walk_cost [PYTHON] [SECONDS] [DEPTH]`
//! (DEPTH extra Python frames under each worker: the walk's cost grows with it). `GPUTRACE` names
//! the gputrace binary to run (default: target/debug/gputrace); `cargo xtask bench` runs this.

use std::{
    collections::{HashMap, HashSet},
    process::{Command, Stdio},
    time::Duration,
};

const STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";

fn sampler_stats() -> HashMap<u32, (u64, u64)> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| p.name_as_str() == Some("cpu_sample"))
        .map(|p| (p.id(), (p.run_time().as_nanos() as u64, p.run_count())))
        .collect()
}

/// (sampler run time ns, sampler runs, samples of the traced process).
fn measure(gputrace: &str, python: &str, mode: &str, secs: &str, depth: &str) -> (u64, u64, u64) {
    let before: HashSet<u32> = sampler_stats().into_keys().collect();
    let workload = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/workloads/py_hot.py");
    let mut child = Command::new(gputrace)
        .args([
            "--python", mode, "-F", "999", "--json", "--", python, workload, secs, depth,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run gputrace");
    // Drained on threads: a report larger than the pipe would otherwise block gputrace's exit.
    let drain = |mut r: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            v
        })
    };
    let stdout = drain(Box::new(child.stdout.take().expect("stdout")));
    let stderr = drain(Box::new(child.stderr.take().expect("stderr")));
    let mut last: HashMap<u32, (u64, u64)> = HashMap::new();
    while child.try_wait().expect("wait").is_none() {
        for (id, v) in sampler_stats() {
            if !before.contains(&id) {
                last.insert(id, v);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let stdout = stdout.join().expect("stdout thread");
    let stderr = stderr.join().expect("stderr thread");
    // The workload shares gputrace's stdout ("ready"); the report is the JSON object after it.
    let text = String::from_utf8_lossy(&stdout);
    let json = text.find("\n{").map_or(&text[..], |i| &text[i + 1..]);
    let report: serde_json::Value = serde_json::from_str(json).unwrap_or_else(|e| {
        panic!(
            "no JSON report ({e}): {text}\n{}",
            String::from_utf8_lossy(&stderr)
        )
    });
    let traced = report["sampling"]["samples"].as_u64().unwrap_or(0);
    let (ns, runs) = last
        .values()
        .fold((0, 0), |(t, n), (dt, dn)| (t + dt, n + dn));
    (ns, runs, traced)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let python = args.get(1).map_or("/usr/bin/python3.11", String::as_str);
    let secs = args.get(2).map_or("5", String::as_str);
    let depth = args.get(3).map_or("0", String::as_str);
    let gputrace = std::env::var("GPUTRACE").unwrap_or_else(|_| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/../target/debug/gputrace").to_string()
    });
    let gputrace = gputrace.as_str();
    let old = std::fs::read_to_string(STATS).expect("read bpf_stats_enabled");
    std::fs::write(STATS, "1").expect("enable BPF stats (root needed)");
    let mut rows = Vec::new();
    for mode in ["off", "auto", "off", "auto"] {
        rows.push((mode, measure(gputrace, python, mode, secs, depth)));
    }
    let _ = std::fs::write(STATS, old.trim());
    println!("python={python} seconds={secs} depth={depth} frequency=999 Hz");
    let per_run = |(ns, runs, _): (u64, u64, u64)| ns as f64 / runs.max(1) as f64;
    let off: Vec<f64> = rows
        .iter()
        .filter(|r| r.0 == "off")
        .map(|r| per_run(r.1))
        .collect();
    let base = off.iter().sum::<f64>() / off.len() as f64;
    for (mode, (ns, runs, traced)) in rows {
        let mut line = format!(
            "--python {mode:<4}: {runs:>7} sampler runs ({traced} of the workload), {:>6.0} ns per run",
            per_run((ns, runs, traced))
        );
        if mode == "auto" && traced > 0 {
            // What the walk added, spread over the samples that ran it.
            let extra = (ns as f64 - base * runs as f64) / traced as f64;
            line += &format!(", walk ~{extra:.0} ns per workload sample");
        }
        println!("{line}");
    }
}
