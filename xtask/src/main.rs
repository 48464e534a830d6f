//! `cargo xtask setup | run | test | bench`: what a build script should not do.

mod bench;
mod setup;
mod test_deps;
mod workloads;

use std::process::{Command, ExitCode};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "gputrace's developer tasks")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what the eBPF build and the tests need (idempotent; fast when present).
    Setup,
    /// Build gputrace (release) and run it as root with these arguments.
    Run {
        /// Arguments for gputrace, after `--`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Set up, check formatting and lints, and run every test, the root/BPF ones included.
    Test {
        /// Extra arguments for `cargo test` (e.g. a test name filter).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Measure gputrace's overhead against untraced runs, bpftrace and perf (root; never CI).
    Bench {
        /// Smaller iteration counts (about a minute).
        #[arg(long)]
        quick: bool,
        /// Only measure what one window of the launch probes costs a storm (printed, not
        /// appended to BENCHMARKS.md).
        #[arg(long)]
        window_cost: bool,
        /// Only the end-to-end demo table (printed, not appended to BENCHMARKS.md).
        #[arg(long, conflicts_with = "window_cost")]
        demo_only: bool,
        /// Only the launch and copy storms at the default budget (printed, not appended to
        /// BENCHMARKS.md).
        #[arg(long, conflicts_with_all = ["window_cost", "demo_only"])]
        storms_only: bool,
        /// Only the shell loop of short-lived children at the default settings (printed, not
        /// appended to BENCHMARKS.md).
        #[arg(long, conflicts_with_all = ["window_cost", "demo_only", "storms_only"])]
        churn_only: bool,
        /// The demo modes to run, comma-separated (default: data,launch,transfer,gpu).
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "data,launch,transfer,gpu"
        )]
        modes: Vec<String>,
        /// Only the memory soak: gputrace's resident memory over this many seconds of a
        /// steady ~100k events/s mix (printed, not appended to BENCHMARKS.md; 3600 for an
        /// hour).
        #[arg(long, value_name = "SECONDS", conflicts_with_all = ["window_cost", "demo_only"])]
        soak: Option<u64>,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Setup => setup::run(),
        Cmd::Bench {
            quick,
            window_cost,
            demo_only,
            storms_only,
            churn_only,
            modes,
            soak,
        } => {
            setup::run()?;
            bench::run(
                quick,
                window_cost,
                demo_only,
                storms_only,
                churn_only,
                &modes,
                soak,
            )
        }
        Cmd::Run { args } => {
            setup::run()?;
            workloads::build(&workspace_root())?;
            cargo(&["build", "--release", "-p", "gputrace"])?;
            let bin = workspace_root().join("target/release/gputrace");
            let mut cmd = if is_root() {
                Command::new(&bin)
            } else {
                let mut c = Command::new("sudo");
                c.arg("-E").arg(&bin);
                c
            };
            let status = cmd.args(&args).status().context("run gputrace")?;
            if !status.success() {
                std::process::exit(status.code().unwrap_or(1));
            }
            Ok(())
        }
        Cmd::Test { args } => {
            setup::run()?;
            cargo(&["fmt", "--all", "--", "--check"])?;
            // The eBPF crate is not a workspace member (it builds for another target).
            cargo(&[
                "fmt",
                "--manifest-path",
                "tracer-ebpf/Cargo.toml",
                "--",
                "--check",
            ])?;
            cargo(&[
                "clippy",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ])?;
            let mut test: Vec<&str> = vec!["test", "--workspace", "--all-targets"];
            test.extend(args.iter().map(String::as_str));
            let cargo_bin = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let mut cmd = if is_root() {
                Command::new(cargo_bin)
            } else {
                eprintln!(
                    "xtask: not root: running the tests with sudo so the BPF tests really run"
                );
                let mut c = Command::new("sudo");
                c.arg("-E").arg(cargo_bin);
                c
            };
            cmd.args(&test).current_dir(workspace_root());
            run_tests(cmd)
        }
    }
}

/// Runs `cargo test`, passing its output through, and ends with one line that sums every test
/// binary's result (cargo's own last line is that of whichever binary ran last).
fn run_tests(mut cmd: Command) -> Result<()> {
    use std::io::{BufRead, BufReader};
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("run cargo test")?;
    let (mut passed, mut failed, mut ignored) = (0u64, 0u64, 0u64);
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.context("read cargo test output")?;
        println!("{line}");
        if let Some(rest) = line.strip_prefix("test result: ") {
            for part in rest.split(['.', ';']) {
                let mut w = part.split_whitespace();
                if let (Some(n), Some(what)) = (w.next(), w.next()) {
                    let n: u64 = n.parse().unwrap_or(0);
                    match what {
                        "passed" => passed += n,
                        "failed" => failed += n,
                        "ignored" => ignored += n,
                        _ => {}
                    }
                }
            }
        }
    }
    let status = child.wait().context("wait for cargo test")?;
    println!("summary: {passed} passed, {failed} failed, {ignored} skipped");
    if !status.success() {
        bail!("tests failed");
    }
    Ok(())
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions; declared here to keep xtask free of libc.
    extern "C" {
        fn geteuid() -> u32;
    }
    unsafe { geteuid() == 0 }
}

pub fn workspace_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

pub fn cargo(args: &[&str]) -> Result<()> {
    let cargo_bin = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo_bin)
        .args(args)
        .current_dir(workspace_root())
        .status()
        .with_context(|| format!("run cargo {}", args.join(" ")))?;
    if !status.success() {
        bail!("cargo {} failed", args.join(" "));
    }
    Ok(())
}
