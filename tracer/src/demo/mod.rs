//! `gputrace demo`: runs a bundled synthetic training job and traces it exactly as
//! `gputrace -- CMD` would, so a new user sees the tool work on a machine without a GPU.
//!
//! The job is this binary itself in hidden roles (see [`workload`]): a trainer that calls a
//! stand-in CUDA runtime ([`cudart`], compiled from `assets/fake_cudart.c` by build.rs) and
//! data-loader worker processes that read real files ([`dataset`]). [`profile`] sets what each
//! mode is bound by.

pub mod cudart;
pub mod dataset;
pub mod profile;
pub mod workload;

use std::{
    os::unix::fs::DirBuilderExt,
    path::{Path, PathBuf},
    process::ExitCode,
};

use anyhow::{Context, Result};
use clap::{Args, Parser, ValueEnum};

pub use profile::Mode;

use crate::{cli::Cli, error::TraceError, procfs};

#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// What the synthetic job is bound by: slow data loading, many tiny kernel launches, big
    /// pageable host-to-device copies, or long GPU work.
    #[arg(long, value_enum, default_value_t = Mode::Data)]
    pub mode: Mode,

    /// How long the job trains, in seconds.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub seconds: u64,

    /// Apply the usual fix for the mode (more workers and a cached data set, fused kernels,
    /// pinned async copies, half-time kernels), e.g. to compare runs with `gputrace diff`.
    #[arg(long)]
    pub fixed: bool,

    /// Also write the report files into this directory (as `gputrace --output`).
    #[arg(short = 'o', long, value_name = "DIR")]
    pub output: Option<PathBuf>,

    /// Print the JSON report to stdout instead of the terminal summary.
    #[arg(long)]
    pub json: bool,

    /// The trace's overhead budget (as `gputrace --max-overhead`), to see what it buys and
    /// costs on a job of known shape.
    #[arg(long, default_value = crate::budget::DEFAULT_BUDGET_ARG, value_parser = crate::budget::parse_budget, value_name = "PERCENT")]
    pub max_overhead: f64,

    /// Internal (benchmarks): run the same job without tracing it, for the untraced baseline.
    #[arg(long, hide = true)]
    pub untraced: bool,

    /// Internal: run as part of the workload instead of tracing it.
    #[arg(long, value_enum, hide = true)]
    pub role: Option<Role>,
    #[arg(long, hide = true)]
    pub data_dir: Option<PathBuf>,
    #[arg(long, hide = true)]
    pub lib: Option<PathBuf>,
    #[arg(long, hide = true, default_value_t = 0)]
    pub worker: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Role {
    Trainer,
    Loader,
}

pub fn run(args: &DemoArgs) -> Result<ExitCode> {
    match args.role {
        Some(Role::Trainer) => {
            workload::trainer(
                args.mode,
                args.fixed,
                args.seconds,
                required(&args.data_dir, "--data-dir")?,
                required(&args.lib, "--lib")?,
            )?;
            return Ok(ExitCode::SUCCESS);
        }
        Some(Role::Loader) => {
            workload::loader(
                args.mode,
                args.fixed,
                required(&args.data_dir, "--data-dir")?,
                args.worker,
            )?;
            return Ok(ExitCode::SUCCESS);
        }
        None => {}
    }
    // Before writing anything: the trace would refuse anyway.
    if !procfs::is_privileged() {
        return Err(TraceError::NotPrivileged.into());
    }
    if let Some(dir) = &args.output {
        crate::report::prepare_output_dir(dir)?;
    }
    let work = WorkDir::create()?;
    let lib = cudart::write_library(&work.path)?;
    let data_dir = work.path.join("data");
    std::fs::create_dir(&data_dir).with_context(|| format!("create {}", data_dir.display()))?;
    let p = args.mode.profile_with(args.fixed);
    let (files, size) = p.dataset();
    dataset::create(&data_dir, files, size).context("write the demo's data set")?;

    crate::note!(
        "gputrace demo: a synthetic training job, {}, for {} s:\n  a trainer and {} data-loader \
         worker process(es) reading {} files of {} MiB, CUDA stand-in\n  {}\n  {}",
        if args.fixed {
            format!("{} with the fix applied", args.mode.name())
        } else {
            describe(args.mode).to_string()
        },
        args.seconds,
        p.workers,
        files,
        size >> 20,
        lib.display(),
        if args.fixed && args.mode == Mode::Gpu {
            // Half-time kernels: still GPU-bound, each step faster (compare with `diff`).
            "Fixed: still gpu-bound, with each step's GPU time halved".to_string()
        } else if args.fixed {
            format!(
                "Fixed: {} should not be a finding",
                args.mode.expected_rule()
            )
        } else {
            format!("Expected first finding: {}", args.mode.expected_rule())
        }
    );

    // The runtime is mapped from the job's first instruction, as when a real job links it, so
    // the CUDA probes find it as soon as the trace starts.
    std::env::set_var("LD_PRELOAD", &lib);
    let trace_args = trace_args(args, &data_dir, &lib)?;
    let result = if args.untraced {
        untraced(&trace_args.command)
    } else {
        crate::session::run(&trace_args)
    };
    std::env::remove_var("LD_PRELOAD");
    result?;
    Ok(ExitCode::SUCCESS)
}

/// The job's trainer run directly: what the traced run is compared with (`cargo xtask bench`).
fn untraced(command: &[String]) -> Result<()> {
    let status = std::process::Command::new(&command[0])
        .args(&command[1..])
        .status()
        .context("run the demo's trainer")?;
    if !status.success() {
        anyhow::bail!("the demo's trainer failed: {status}");
    }
    Ok(())
}

fn describe(mode: Mode) -> &'static str {
    match mode {
        Mode::Data => "data-loading bound (slow workers doing direct disk reads)",
        Mode::Launch => "launch bound (thousands of tiny kernels per step)",
        Mode::Transfer => "transfer bound (big pageable host-to-device copies)",
        Mode::Gpu => "GPU bound (long kernels, the CPU waits in cudaStreamSynchronize)",
    }
}

fn required<'a>(v: &'a Option<PathBuf>, flag: &str) -> Result<&'a Path> {
    v.as_deref()
        .with_context(|| format!("internal demo role needs {flag}"))
}

/// The arguments of `gputrace [-o DIR] [--json] -- <this binary> demo --role trainer ...`,
/// parsed by the real command line so that the demo takes exactly the path of a user's trace.
fn trace_args(args: &DemoArgs, data_dir: &Path, lib: &Path) -> Result<crate::cli::TraceArgs> {
    let exe = std::env::current_exe().context("find the gputrace binary")?;
    let mut argv: Vec<String> = vec!["gputrace".into()];
    if let Some(out) = &args.output {
        argv.push("--output".into());
        argv.push(out.to_string_lossy().into_owned());
    }
    if args.json {
        argv.push("--json".into());
    }
    argv.push(format!("--max-overhead={}", args.max_overhead));
    argv.push("--".into());
    argv.push(exe.to_string_lossy().into_owned());
    argv.push("demo".into());
    if args.fixed {
        argv.push("--fixed".into());
    }
    argv.extend(
        [
            "--role",
            "trainer",
            "--mode",
            args.mode.name(),
            "--seconds",
            &args.seconds.to_string(),
            "--data-dir",
            &data_dir.to_string_lossy(),
            "--lib",
            &lib.to_string_lossy(),
        ]
        .map(String::from),
    );
    let cli = Cli::try_parse_from(&argv).context("build the demo's trace command line")?;
    Ok(cli.trace)
}

/// A private scratch directory for the library and the data set, removed when dropped. On the
/// disk-backed temp dir, so that direct reads are real disk I/O.
struct WorkDir {
    path: PathBuf,
}

impl WorkDir {
    fn create() -> Result<WorkDir> {
        let base = std::env::var_os("TMPDIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/var/tmp"));
        remove_stale(&base);
        let path = base.join(format!("gputrace-demo-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .with_context(|| format!("create {}", path.display()))?;
        Ok(WorkDir { path })
    }
}

/// Removes the scratch directories of demos that were killed before they could clean up.
fn remove_stale(base: &Path) {
    let Ok(rd) = std::fs::read_dir(base) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("gputrace-demo-"))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !procfs::is_alive(pid) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demo_traces_through_the_normal_command_line() {
        let args = DemoArgs {
            mode: Mode::Launch,
            seconds: 3,
            fixed: false,
            output: Some(PathBuf::from("out")),
            json: false,
            max_overhead: 0.005,
            role: None,
            data_dir: None,
            lib: None,
            worker: 0,
            untraced: false,
        };
        let t = trace_args(&args, Path::new("/d"), Path::new("/l/libcudart.so.12")).unwrap();
        assert_eq!(t.output, Some(PathBuf::from("out")));
        assert_eq!(t.max_overhead, 0.005);
        assert!(t.pids.is_empty());
        let cmd = t.command.join(" ");
        assert!(
            cmd.ends_with(
                "demo --role trainer --mode launch --seconds 3 --data-dir /d --lib \
                 /l/libcudart.so.12"
            ),
            "{cmd}"
        );
    }
}
