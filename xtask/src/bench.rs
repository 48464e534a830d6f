//! `cargo xtask bench`: gputrace's cost measured side by side with the untraced workload and
//! with bpftrace / perf doing the same job, in one run, as ratios (this machine is shared and
//! noisy: absolute numbers drift, ratios taken in one run hold). Never run in CI.
//!
//! Each workload (xtask/bench/*.c) times its own hot loop and prints `ns_per_op X`, so tracer
//! start-up and report writing are not part of what is measured.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{bail, Context, Result};

use crate::workspace_root;

const RUNS: usize = 3;

struct Row {
    name: String,
    untraced: f64,
    traced: Vec<(String, f64)>,
}

impl Row {
    fn added(&self, label: &str) -> Option<f64> {
        self.traced
            .iter()
            .find(|(l, _)| l == label)
            .map(|(_, v)| v - self.untraced)
    }
}

pub fn run(quick: bool) -> Result<()> {
    if !crate::is_root() {
        bail!("the benchmarks load eBPF programs: run `sudo -E cargo xtask bench`");
    }
    for tool in ["bpftrace", "perf", "gcc"] {
        if crate::setup::which(tool).is_none() {
            bail!("{tool} is missing: run `cargo xtask setup`");
        }
    }
    let root = workspace_root();
    crate::cargo(&["build", "--release", "-p", "gputrace"])?;
    let gputrace = root.join("target/release/gputrace");
    let dir = root.join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let w = Workloads::build(&dir)?;
    let scale = if quick { 1 } else { 4 };

    let mut rows = Vec::new();
    let n_sys = 250_000 * scale;
    rows.push(compare(
        &format!("syscall (getppid x{n_sys})"),
        &[w.syscall.to_str().unwrap(), &n_sys.to_string()],
        &gputrace,
        &[(
            "bpftrace",
            "tracepoint:raw_syscalls:sys_enter /pid == cpid/ { @s[tid] = nsecs; } \
             tracepoint:raw_syscalls:sys_exit /@s[tid]/ { @lat = hist(nsecs - @s[tid]); delete(@s[tid]); }",
        )],
    )?);
    let n_cs = 25_000 * scale;
    rows.push(compare(
        &format!("context switch (pipe ping-pong x{n_cs})"),
        &[w.ctxswitch.to_str().unwrap(), &n_cs.to_string()],
        &gputrace,
        &[(
            "bpftrace",
            "tracepoint:sched:sched_switch { @off[args->prev_pid] = nsecs; \
             if (@off[args->next_pid]) { @t = sum(nsecs - @off[args->next_pid]); delete(@off[args->next_pid]); } }",
        )],
    )?);
    let n_l = 250_000 * scale;
    let lib = w.cudart.to_str().unwrap();
    rows.push(compare(
        &format!("CUDA launch (cudaLaunchKernel x{n_l})"),
        &[w.launch.to_str().unwrap(), lib, &n_l.to_string(), "1500"],
        &gputrace,
        &[
            (
                "bpftrace uprobe",
                &format!("uprobe:{lib}:cudaLaunchKernel {{ @c = count(); }}"),
            ),
            (
                "bpftrace uprobe+uretprobe",
                &format!(
                    "uprobe:{lib}:cudaLaunchKernel {{ @s[tid] = nsecs; }} \
                     uretprobe:{lib}:cudaLaunchKernel /@s[tid]/ {{ @lat = hist(nsecs - @s[tid]); delete(@s[tid]); }}"
                ),
            ),
        ],
    )?);
    let burn = (500 * scale).to_string();
    rows.push(sampling(&w.burn, &burn, &gputrace)?);

    let table = render(&rows);
    println!("{table}");
    let md = root.join("BENCHMARKS.md");
    let mut text = std::fs::read_to_string(&md).unwrap_or_else(|_| HEADER.to_string());
    let _ = write!(text, "\n## {} on {}\n\n{table}\n", date(), machine());
    std::fs::write(&md, text).with_context(|| format!("write {}", md.display()))?;
    eprintln!("xtask: results appended to {}", md.display());
    Ok(())
}

const HEADER: &str =
    "# Benchmarks\n\nMeasured by `cargo xtask bench` (never in CI). Each row times \
the same workload untraced, under gputrace, and under bpftrace/perf doing the same job, \
interleaved, median of 3. \"added\" is the traced time per operation minus the untraced time; \
the ratio compares gputrace's added cost with the reference tool's.\n";

struct Workloads {
    syscall: PathBuf,
    ctxswitch: PathBuf,
    burn: PathBuf,
    launch: PathBuf,
    cudart: PathBuf,
}

impl Workloads {
    fn build(dir: &Path) -> Result<Workloads> {
        let src = workspace_root().join("xtask/bench");
        let cc = |name: &str, out: &Path, extra: &[&str]| -> Result<()> {
            let st = Command::new("gcc")
                .args(["-O2", "-fno-omit-frame-pointer", "-pthread", "-o"])
                .arg(out)
                .arg(src.join(format!("{name}.c")))
                .args(extra)
                .status()
                .context("gcc")?;
            if !st.success() {
                bail!("gcc {name}.c failed");
            }
            Ok(())
        };
        let w = Workloads {
            syscall: dir.join("syscall_loop"),
            ctxswitch: dir.join("ctxswitch"),
            burn: dir.join("cpu_burn"),
            launch: dir.join("launch_loop"),
            cudart: dir.join("libcudart.so.12"),
        };
        cc("syscall_loop", &w.syscall, &[])?;
        cc("ctxswitch", &w.ctxswitch, &[])?;
        cc("cpu_burn", &w.burn, &[])?;
        cc("launch_loop", &w.launch, &["-ldl"])?;
        cc("fake_cudart", &w.cudart, &["-shared", "-fPIC"])?;
        Ok(w)
    }
}

/// Untraced vs gputrace vs each bpftrace script, interleaved, medians.
fn compare(name: &str, cmd: &[&str], gputrace: &Path, refs: &[(&str, &str)]) -> Result<Row> {
    eprintln!("xtask: bench {name}");
    let mut untraced = Vec::new();
    let mut traced: Vec<(String, Vec<f64>)> = vec![("gputrace".into(), Vec::new())];
    traced.extend(refs.iter().map(|(l, _)| (l.to_string(), Vec::new())));
    for _ in 0..RUNS {
        untraced.push(ns_per_op(Command::new(cmd[0]).args(&cmd[1..]))?);
        traced[0]
            .1
            .push(ns_per_op(&mut gputrace_cmd(gputrace, &[], cmd))?);
        for (i, (_, script)) in refs.iter().enumerate() {
            traced[i + 1].1.push(ns_per_op(
                Command::new("bpftrace")
                    .arg("-c")
                    .arg(cmd.join(" "))
                    .arg("-e")
                    .arg(script),
            )?);
        }
    }
    Ok(Row {
        name: name.into(),
        untraced: median(untraced),
        traced: traced.into_iter().map(|(l, v)| (l, median(v))).collect(),
    })
}

/// CPU sampling: gputrace at 99 and 999 Hz against `perf record -g` at the same rates.
fn sampling(burn: &Path, millions: &str, gputrace: &Path) -> Result<Row> {
    eprintln!("xtask: bench CPU sampling");
    let cmd = [burn.to_str().unwrap(), millions];
    let perf_data = std::env::temp_dir().join("gputrace-bench-perf.data");
    let labels = [
        "gputrace -F 99",
        "perf -F 99 -g",
        "gputrace -F 999",
        "perf -F 999 -g",
    ];
    let mut vals: Vec<Vec<f64>> = vec![Vec::new(); labels.len()];
    let mut untraced = Vec::new();
    for _ in 0..RUNS {
        untraced.push(ns_per_op(Command::new(cmd[0]).args(&cmd[1..]))?);
        for (i, label) in labels.iter().enumerate() {
            let freq = if label.contains("999") { "999" } else { "99" };
            let v = if label.starts_with("gputrace") {
                ns_per_op(&mut gputrace_cmd(gputrace, &["-F", freq], &cmd))?
            } else {
                ns_per_op(
                    Command::new("perf")
                        .args(["record", "-q", "-g", "-F", freq, "-o"])
                        .arg(&perf_data)
                        .arg("--")
                        .args(cmd),
                )?
            };
            vals[i].push(v);
        }
    }
    let _ = std::fs::remove_file(perf_data);
    Ok(Row {
        name: format!("CPU sampling (fixed work, {millions}M iterations)"),
        untraced: median(untraced),
        traced: labels
            .iter()
            .zip(vals)
            .map(|(l, v)| (l.to_string(), median(v)))
            .collect(),
    })
}

fn gputrace_cmd(gputrace: &Path, extra: &[&str], cmd: &[&str]) -> Command {
    let mut c = Command::new(gputrace);
    c.args(extra).arg("--").args(cmd);
    c
}

fn ns_per_op(cmd: &mut Command) -> Result<f64> {
    let out = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .with_context(|| format!("run {cmd:?}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("ns_per_op "))
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("no ns_per_op line from {cmd:?}: {text}"))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn render(rows: &[Row]) -> String {
    let mut t = String::from(
        "| benchmark | untraced ns/op | traced by | ns/op | added ns/op | gputrace added / this added |\n\
         |---|---:|---|---:|---:|---:|\n",
    );
    for r in rows {
        let g_added = r.traced.first().map(|(_, v)| v - r.untraced).unwrap_or(0.0);
        for (i, (label, v)) in r.traced.iter().enumerate() {
            let added = r.added(label).unwrap_or(0.0);
            let ratio = if i == 0 || added.abs() < 1e-9 {
                "".to_string()
            } else {
                // Compare like with like for the sampling row (same frequency).
                let base = if label.contains("999") {
                    r.added("gputrace -F 999").unwrap_or(g_added)
                } else if label.contains("99") {
                    r.added("gputrace -F 99").unwrap_or(g_added)
                } else {
                    g_added
                };
                format!("{:.2}x", base / added)
            };
            let _ = writeln!(
                t,
                "| {} | {} | {label} | {v:.1} | {added:.1} ({:+.1}%) | {ratio} |",
                if i == 0 { r.name.as_str() } else { "" },
                if i == 0 {
                    format!("{:.1}", r.untraced)
                } else {
                    String::new()
                },
                100.0 * added / r.untraced
            );
        }
    }
    t
}

fn date() -> String {
    Command::new("date")
        .arg("+%Y-%m-%d %H:%M UTC")
        .env("TZ", "UTC")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn machine() -> String {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cpus} CPUs ({model}), Linux {}", kernel.trim())
}
