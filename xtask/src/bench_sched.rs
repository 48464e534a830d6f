//! Per-event cost of the time-accounting programs (issue 3): ns added to a syscall (raw_syscalls
//! sys_enter + sys_exit) and to a context switch (sched_switch + sched_wakeup), measured
//! against the same workload untraced.
//!
//! The workloads are this binary itself (`xtask bench-sched-worker`), pinned to CPU 0 with
//! taskset: `syscalls N` calls getppid N times; `pingpong N` bounces a byte between two threads
//! over two pipes N times (per round trip: 2 context switches, 2 wakeups, 4 syscalls). Each
//! configuration runs several times and the fastest run counts: the machine is shared, and
//! noise only ever adds time.

use std::{
    io::{Read, Write},
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{bail, Context, Result};

const SYSCALLS: u64 = 2_000_000;
const ROUND_TRIPS: u64 = 200_000;
const RUNS: usize = 5;

/// (program name, ns per run) as gputrace -v reports them.
type ProgramCosts = Vec<(String, f64)>;

/// Runs one workload and prints ns per operation (stdout of the worker, one number).
pub fn worker(mode: &str, n: u64, out: &Path) -> Result<()> {
    let ns_per_op = match mode {
        "syscalls" => {
            let t = Instant::now();
            let mut x = 0u32;
            for _ in 0..n {
                // getppid is not cached by glibc: one real syscall each.
                x = x.wrapping_add(std::os::unix::process::parent_id());
            }
            std::hint::black_box(x);
            t.elapsed().as_nanos() as f64 / n as f64
        }
        "pingpong" => {
            let (mut a_rx, mut a_tx) = std::io::pipe()?;
            let (mut b_rx, mut b_tx) = std::io::pipe()?;
            let peer = std::thread::spawn(move || -> std::io::Result<()> {
                let mut byte = [0u8; 1];
                for _ in 0..n {
                    a_rx.read_exact(&mut byte)?;
                    b_tx.write_all(&byte)?;
                }
                Ok(())
            });
            let t = Instant::now();
            let mut byte = [1u8; 1];
            for _ in 0..n {
                a_tx.write_all(&byte)?;
                b_rx.read_exact(&mut byte)?;
            }
            let el = t.elapsed();
            peer.join()
                .map_err(|_| anyhow::anyhow!("peer panicked"))??;
            el.as_nanos() as f64 / n as f64
        }
        other => bail!("unknown worker mode {other}"),
    };
    std::fs::write(out, format!("{ns_per_op}\n")).context("write the result")?;
    Ok(())
}

/// One run: the worker's ns per operation and, when traced, gputrace's `-v` lines giving each
/// program's own run time ("program NAME: R runs, X ns/run").
fn run_once(
    gputrace: Option<&Path>,
    stacks: bool,
    mode: &str,
    n: u64,
) -> Result<(f64, ProgramCosts)> {
    let out = std::env::temp_dir().join(format!("bench-sched-{}-{mode}", std::process::id()));
    let me = std::env::current_exe()?;
    let worker: Vec<String> = vec![
        "taskset".into(),
        "-c".into(),
        "0".into(),
        me.display().to_string(),
        "bench-sched-worker".into(),
        mode.into(),
        n.to_string(),
        out.display().to_string(),
    ];
    let output = match gputrace {
        None => Command::new(&worker[0]).args(&worker[1..]).output(),
        Some(g) => Command::new(g)
            .arg("-v")
            .arg("--")
            .args(&worker)
            .env("GPUTRACE_OFFCPU_STACKS", if stacks { "1" } else { "0" })
            .output(),
    }
    .context("run the benchmark worker")?;
    if !output.status.success() {
        bail!(
            "benchmark worker failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let text = std::fs::read_to_string(&out).context("read the worker's result")?;
    let _ = std::fs::remove_file(&out);
    let progs = String::from_utf8_lossy(&output.stderr)
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("gputrace: program ")?;
            let (name, rest) = rest.split_once(": ")?;
            let ns = rest.split(", ").nth(1)?.strip_suffix(" ns/run")?;
            Some((name.to_string(), ns.parse().ok()?))
        })
        .collect();
    Ok((
        text.trim().parse().context("parse the worker's result")?,
        progs,
    ))
}

/// Best untraced and traced times, runs interleaved so that load changes hit both alike, and
/// the programs' own ns/run from the fastest traced run.
fn best(gputrace: &Path, stacks: bool, mode: &str, n: u64) -> Result<(f64, f64, ProgramCosts)> {
    let (mut base, mut traced, mut progs) = (f64::MAX, f64::MAX, Vec::new());
    for _ in 0..RUNS {
        base = base.min(run_once(None, stacks, mode, n)?.0);
        let (t, p) = run_once(Some(gputrace), stacks, mode, n)?;
        if t < traced {
            traced = t;
            progs = p;
        }
    }
    Ok((base, traced, progs))
}

pub fn run(gputrace: PathBuf) -> Result<()> {
    if !crate::is_root() {
        bail!("bench-sched loads eBPF programs: run it as root");
    }
    println!("bench-sched (best of {RUNS}, pinned to CPU 0; untraced and traced runs interleaved)");
    for stacks in [true, false] {
        let (sys_base, sys_traced, sys_progs) = best(&gputrace, stacks, "syscalls", SYSCALLS)?;
        let (pp_base, pp_traced, pp_progs) = best(&gputrace, stacks, "pingpong", ROUND_TRIPS)?;
        let per_syscall = sys_traced - sys_base;
        // A round trip is 2 switches (each with its wakeup) and 4 syscalls.
        let per_switch = ((pp_traced - pp_base) - 4.0 * per_syscall) / 2.0;
        println!(
            "off-CPU stacks {}:",
            if stacks { "on (default)" } else { "off" }
        );
        println!(
            "  syscall (getppid):      {sys_base:8.1} ns untraced, {sys_traced:8.1} ns traced: {per_syscall:+.1} ns per syscall"
        );
        println!(
            "  pipe ping-pong (round): {pp_base:8.1} ns untraced, {pp_traced:8.1} ns traced: {per_switch:+.1} ns per context switch (wakeup included)"
        );
        println!("  the programs' own run time (kernel.bpf_stats_enabled), averaged over all CPUs' events:");
        for (name, ns) in sys_progs
            .iter()
            .filter(|(n, _)| n.starts_with("sys_"))
            .chain(
                pp_progs
                    .iter()
                    .filter(|(n, _)| n == "sched_switch" || n == "sched_wakeup"),
            )
        {
            println!("    {name:<14} {ns:7.1} ns/run");
        }
    }
    Ok(())
}
