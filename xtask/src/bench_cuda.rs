//! Cost of tracing one CUDA launch: the fake libcudart's `cudaLaunchKernel` (which calls the
//! fake libcuda's `cuLaunchKernel` through a pointer, as the real runtime does, so one launch
//! hits two probed functions) in a tight loop, untraced, traced with entry probes only, and
//! traced with entry + return probes. Reports ns per launch and the difference.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

const LAUNCHES: u64 = 300_000;
const REPEATS: usize = 3;

pub fn run(gputrace: &Path) -> Result<()> {
    let dir = crate::workspace_root().join("target/bench/fake_cuda");
    build_fake_cuda(&dir)?;
    let workload = dir.join("workload");
    let n = LAUNCHES.to_string();
    let libcudart = dir.join("libcudart.so.12");
    let libcuda = dir.join("libcuda.so.1");
    let traced = |extra: &[&str]| -> Result<f64> {
        let mut cmd = sudo(gputrace);
        cmd.args(["-F", "1", "--nvml-interval", "10s", "--libcudart"])
            .arg(&libcudart)
            .arg("--libcuda")
            .arg(&libcuda)
            .args(extra)
            .arg("--")
            .arg(&workload)
            .args(["--bench", &n]);
        ns_per_launch(cmd)
    };
    let mut base = Vec::new();
    let mut entry = Vec::new();
    let mut full = Vec::new();
    for _ in 0..REPEATS {
        let mut c = Command::new(&workload);
        c.args(["--bench", &n]);
        base.push(ns_per_launch(c)?);
        entry.push(traced(&["--cuda-entry-only"])?);
        full.push(traced(&[])?);
    }
    let (b, e, f) = (median(&mut base), median(&mut entry), median(&mut full));
    println!("CUDA launch cost, {LAUNCHES} launches, median of {REPEATS} runs (ns per launch):");
    println!("  untraced                       {b:>9.1}");
    println!("  uprobes only (2 per launch)    {e:>9.1}  (+{:.1})", e - b);
    println!("  uprobes + uretprobes           {f:>9.1}  (+{:.1})", f - b);
    Ok(())
}

fn sudo(bin: &Path) -> Command {
    if crate::is_root() {
        Command::new(bin)
    } else {
        let mut c = Command::new("sudo");
        c.arg(bin);
        c
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Runs the workload (directly or under gputrace) and reads its `ns_per_launch=` line.
fn ns_per_launch(mut cmd: Command) -> Result<f64> {
    let out = cmd.output().context("run the CUDA benchmark workload")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "benchmark run failed: {}\n{text}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    text.split_whitespace()
        .find_map(|w| w.strip_prefix("ns_per_launch="))
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("no ns_per_launch in the workload's output:\n{text}"))
}

/// The fake libraries as the e2e tests build them (-O0: every function keeps `push %rbp`).
pub fn build_fake_cuda(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let src = crate::workspace_root().join("tests/workloads/fake_cuda");
    let rpath = format!("-Wl,-rpath,{}", dir.display());
    let s = |n: &str| -> PathBuf { src.join(n) };
    let cc = |out: &str, args: Vec<std::ffi::OsString>| -> Result<()> {
        let st = Command::new("gcc")
            .args(["-O0", "-g", "-fno-omit-frame-pointer", "-o"])
            .arg(dir.join(out))
            .args(args)
            .status()
            .context("run gcc")?;
        if !st.success() {
            bail!("gcc failed building {out}");
        }
        Ok(())
    };
    cc(
        "libcuda.so.1",
        vec!["-shared".into(), "-fPIC".into(), s("cuda.c").into()],
    )?;
    cc(
        "libcudart.so.12",
        vec![
            "-shared".into(),
            "-fPIC".into(),
            s("cudart.c").into(),
            "-ldl".into(),
            rpath.clone().into(),
        ],
    )?;
    cc(
        "workload",
        vec![
            s("workload.c").into(),
            dir.join("libcudart.so.12").into(),
            "-ldl".into(),
            rpath.into(),
        ],
    )
}
