//! Command line: `gputrace [OPTIONS] --pid PID...` or `gputrace [OPTIONS] -- CMD ARGS...`.

use std::{io::Write, path::PathBuf, process::ExitCode, time::Duration};

use clap::{Args, Parser};

use crate::error::{exit, exit_code_of};

#[derive(Debug, Parser)]
#[command(
    name = "gputrace",
    version,
    about = "Why is this GPU job slow, right now? Traces CPU, scheduler, I/O and CUDA time of \
             running processes with eBPF, with zero code changes.",
    after_help = "Examples:\n  sudo gputrace --pid 1234 --duration 10s\n  sudo gputrace --output out -- python train.py\n\nExit codes: 0 ok (also after Ctrl-C or when the target exits), 1 failure, 2 usage,\n3 not root, 4 no such process, 5 command cannot be executed, 6 output not writable,\n7 eBPF load/attach failure."
)]
pub struct Cli {
    #[command(flatten)]
    pub trace: TraceArgs,
}

#[derive(Debug, Clone, Args)]
pub struct TraceArgs {
    /// Trace this running process (repeat for several). Its children are followed too.
    #[arg(short = 'p', long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,

    /// Do not follow child processes (fork/clone) of the targets.
    #[arg(long)]
    pub no_children: bool,

    /// Stop after this long (e.g. 10s, 500ms, 2m). Default: until the target exits or Ctrl-C.
    #[arg(short = 'd', long, value_parser = parse_duration, value_name = "DURATION")]
    pub duration: Option<Duration>,

    /// CPU sampling frequency in Hz, per CPU.
    #[arg(short = 'F', long, default_value_t = 99, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub frequency: u64,

    /// Write report.json, cpu.folded and cpu.svg into this directory (created if missing).
    #[arg(short = 'o', long, value_name = "DIR")]
    pub output: Option<PathBuf>,

    /// Print the JSON report to stdout instead of the terminal summary.
    #[arg(long)]
    pub json: bool,

    /// How many functions to list per process.
    #[arg(long, default_value_t = 10)]
    pub top: usize,

    /// Print progress (attach time, events) on stderr.
    #[arg(short = 'v', long)]
    pub verbose: bool,

    /// CPython frames (file:line function) in stacks: auto (when found), on (and warn when no
    /// traced process runs CPython), off.
    #[arg(long, value_enum, default_value_t = crate::python::PythonMode::Auto)]
    pub python: crate::python::PythonMode,

    /// The command to launch and trace from its first instruction.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// Parses `10s`, `500ms`, `2m`, `1h` or a plain number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let value: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a duration (try 10s, 500ms, 2m)"))?;
    let secs = match unit {
        "ms" => value / 1000.0,
        "s" | "sec" => value,
        "m" | "min" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(format!("`{s}`: unknown unit `{unit}` (use ms, s, m or h)")),
    };
    if !(secs > 0.0 && secs.is_finite()) {
        return Err(format!("`{s}`: the duration must be positive"));
    }
    Ok(Duration::from_secs_f64(secs))
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            if is_broken_pipe(&err) {
                return ExitCode::SUCCESS;
            }
            let _ = writeln!(std::io::stderr(), "gputrace: error: {err:#}");
            ExitCode::from(exit_code_of(&err))
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let args = cli.trace;
    if args.pids.is_empty() && args.command.is_empty() {
        let _ = writeln!(
            std::io::stderr(),
            "gputrace: error: nothing to trace: give --pid PID or -- CMD ARGS (see --help)"
        );
        std::process::exit(exit::USAGE as i32);
    }
    if !args.pids.is_empty() && !args.command.is_empty() {
        let _ = writeln!(
            std::io::stderr(),
            "gputrace: error: give either --pid or a command, not both"
        );
        std::process::exit(exit::USAGE as i32);
    }
    crate::session::run(&args)
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("abc").is_err());
        assert!(parse_duration("5parsecs").is_err());
    }

    #[test]
    fn cli_shapes() {
        let c = Cli::try_parse_from(["gputrace", "-p", "1", "--pid", "2", "-d", "1s"]).unwrap();
        assert_eq!(c.trace.pids, vec![1, 2]);
        let c = Cli::try_parse_from(["gputrace", "-o", "x", "--", "python", "-c", "1"]).unwrap();
        assert_eq!(c.trace.command, vec!["python", "-c", "1"]);
    }
}
