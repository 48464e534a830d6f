//! Cost per CPU sample of the Python frame walk: runs gputrace on tests/workloads/py_hot.py with
//! `--python off` and `--python auto` and reads the kernel's run-time statistics of the
//! `cpu_sample` program (kernel.bpf_stats_enabled, restored afterwards). Root only.
//!
//! `cargo build && sudo target/debug/examples/py_walk_cost [PYTHON] [SECONDS]`

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

fn measure(gputrace: &str, python: &str, mode: &str, secs: &str) -> (u64, u64) {
    let before: HashSet<u32> = sampler_stats().into_keys().collect();
    let workload = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/workloads/py_hot.py");
    let mut child = Command::new(gputrace)
        .args(["--python", mode, "-F", "999", "--", python, workload, secs])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("run gputrace");
    let mut last: HashMap<u32, (u64, u64)> = HashMap::new();
    while child.try_wait().expect("wait").is_none() {
        for (id, v) in sampler_stats() {
            if !before.contains(&id) {
                last.insert(id, v);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    last.values()
        .fold((0, 0), |(t, n), (dt, dn)| (t + dt, n + dn))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let python = args.get(1).map_or("/usr/bin/python3.11", String::as_str);
    let secs = args.get(2).map_or("5", String::as_str);
    let gputrace = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/debug/gputrace");
    let old = std::fs::read_to_string(STATS).expect("read bpf_stats_enabled");
    std::fs::write(STATS, "1").expect("enable BPF stats (root needed)");
    let mut rows = Vec::new();
    for mode in ["off", "auto", "off", "auto"] {
        let (ns, runs) = measure(gputrace, python, mode, secs);
        rows.push((mode, ns, runs));
    }
    let _ = std::fs::write(STATS, old.trim());
    println!("python={python} seconds={secs} frequency=999 Hz");
    for (mode, ns, runs) in rows {
        println!(
            "--python {mode:<4}: {runs:>7} sampler runs, {:>6.0} ns per run",
            ns as f64 / runs.max(1) as f64
        );
    }
}
