//! Command line: `gputrace [OPTIONS] --pid PID...` or `gputrace [OPTIONS] -- CMD ARGS...`,
//! plus the subcommands `diff`, `check` and `demo`.

use std::{io::Write, path::PathBuf, process::ExitCode, time::Duration};

use clap::{Args, Parser, Subcommand};

use crate::error::{exit, exit_code_of};

#[derive(Debug, Parser)]
#[command(
    name = "gputrace",
    version,
    about = "Why is this GPU job slow, right now? Traces CPU, scheduler, I/O and CUDA time of \
             running processes with eBPF, with zero code changes.",
    after_help = "Examples:\n  sudo gputrace --pid 1234 --duration 10s\n  sudo gputrace --output out -- python train.py\n\nExit codes: 0 ok (also after Ctrl-C or when the target exits), 1 failure, 2 usage,\n3 not root, 4 no such process, 5 command cannot be executed, 6 output not writable,\n7 eBPF load/attach failure."
)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(flatten)]
    pub trace: TraceArgs,

    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Compare two report.json files: what got faster, what slower, which findings changed.
    ///
    /// Per-category and per-function change and findings that appeared or went away. Exit 0,
    /// 1 when a file cannot be read, 2 when it is not a gputrace report or the two cannot be
    /// compared.
    Diff(DiffArgs),
    /// Can this machine trace? One line per check; non-zero exit when tracing cannot work.
    Check(crate::check::CheckArgs),
    /// Run a bundled synthetic training job, trace it and print the verdict.
    Demo(crate::demo::DemoArgs),
}

#[derive(Debug, Clone, Args)]
pub struct DiffArgs {
    /// The report.json of the earlier run.
    #[arg(value_name = "BEFORE.json")]
    pub before: PathBuf,
    /// The report.json of the later run.
    #[arg(value_name = "AFTER.json")]
    pub after: PathBuf,
    /// Print the comparison as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Args)]
pub struct TraceArgs {
    /// Trace this running process (repeat, or separate by commas, for several: `-p 12,34` as
    /// perf takes it). Its children are followed too.
    #[arg(short = 'p', long = "pid", value_name = "PID", value_delimiter = ',')]
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

    /// Write report.json, report.html, trace.json (Perfetto), the CPU, off-CPU and wall-time
    /// flame graphs (cpu/offcpu.folded and .svg, wall.svg) and CSV tables into this directory
    /// (created if missing).
    #[arg(short = 'o', long, value_name = "DIR")]
    pub output: Option<PathBuf>,

    /// Print the JSON report to stdout instead of the terminal summary.
    #[arg(long)]
    pub json: bool,

    /// At most this many events in the timeline (trace.json); what is cut is said in the
    /// report.
    #[arg(long, default_value_t = 200_000, value_name = "N")]
    pub timeline_limit: usize,

    /// Off-CPU intervals and syscalls at least this long go on the timeline (trace.json).
    #[arg(long, default_value = "1ms", value_parser = parse_duration, value_name = "DURATION")]
    pub timeline_threshold: Duration,

    /// How many functions to list per process.
    #[arg(long, default_value_t = 10)]
    pub top: usize,

    /// Print progress (attach time, events) on stderr.
    #[arg(short = 'v', long)]
    pub verbose: bool,

    /// Probe this CUDA runtime library from the first call, as well as the ones found in the
    /// processes.
    #[arg(long, value_name = "PATH", value_parser = existing_file)]
    pub libcudart: Option<PathBuf>,

    /// Probe this CUDA driver library (libcuda.so) as well as the ones found in the processes.
    #[arg(long, value_name = "PATH", value_parser = existing_file)]
    pub libcuda: Option<PathBuf>,

    /// How often NVML is sampled (e.g. 100ms, 1s).
    #[arg(long, default_value = "100ms", value_parser = parse_duration, value_name = "DURATION")]
    pub nvml_interval: Duration,

    /// Keep gputrace's estimated cost per traced thread under this share of its time (e.g. 2%,
    /// 0.5%); high-rate probes (CUDA launches) are then switched on and off in windows and their
    /// counts scaled and marked as estimated. A thread whose syscalls alone cost more (a syscall
    /// storm) gets the syscall tracepoints taken off, for all threads, and put back on trial;
    /// those figures are then marked partial. The other probes stay on: a thread that pays more
    /// than this for them is named in a warning. Block requests are counted 1 in N past 4,000 a
    /// second (~1,000 a second kept), and a thread's fast run of one syscall (its calls 200 µs
    /// apart or less on average) is timed 1 call in 8: those figures are estimated. 100% never
    /// samples: every count is exact and every call timed.
    #[arg(long, default_value = crate::budget::DEFAULT_BUDGET_ARG, value_parser = crate::budget::parse_budget, value_name = "PERCENT")]
    pub max_overhead: f64,

    /// Count CUDA calls at entry only (no durations or errors); for measuring probe cost.
    #[arg(long, hide = true)]
    pub cuda_entry_only: bool,

    /// CPython frames (file:line function) in stacks: auto (when found), on (and warn when no
    /// traced process runs CPython), off.
    #[arg(long, value_enum, default_value_t = crate::python::PythonMode::Auto)]
    pub python: crate::python::PythonMode,

    /// The command to launch and trace from its first instruction.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// A library named on the command line must be there: said as a usage error (exit 2) before
/// anything is loaded, not as a failure after the eBPF load.
fn existing_file(s: &str) -> Result<PathBuf, String> {
    let p = PathBuf::from(s);
    if p.is_file() {
        Ok(p)
    } else if p.exists() {
        Err(format!("{s} is not a file"))
    } else {
        Err(format!("{s}: no such file"))
    }
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
    match Duration::try_from_secs_f64(secs) {
        Ok(d) if d.is_zero() => Err(format!("`{s}`: the duration is shorter than a nanosecond")),
        // A deadline this far off is added to the clock, which a few hundred years overflow.
        Ok(d) if d <= MAX_DURATION => Ok(d),
        _ => Err(format!(
            "`{s}`: the duration is too long (at most 100 years)"
        )),
    }
}

/// The longest duration taken: 100 years of 365 days.
pub const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 86_400);

/// Why gputrace refuses to run: a setuid, setgid or file-capability install, where whoever
/// runs it is not who it runs as. Every subcommand is refused, before the arguments are
/// even parsed: `demo` creates directories and loads a library named on its command line,
/// `diff` reads the files it is given, and each would do so with the owner's rights.
fn insecure_install() -> Option<&'static str> {
    // SAFETY: these calls have no preconditions. AT_SECURE is what the kernel sets for a
    // setuid, setgid or capability-raising exec (the dynamic linker's own test).
    let secure = unsafe { libc::getauxval(libc::AT_SECURE) } != 0;
    let uid_differs = unsafe { libc::getuid() != libc::geteuid() };
    let gid_differs = unsafe { libc::getgid() != libc::getegid() };
    (secure || uid_differs || gid_differs)
        .then_some("gputrace must not be installed setuid, setgid or with file capabilities; run it with sudo instead")
}

pub fn main() -> ExitCode {
    if let Some(why) = insecure_install() {
        let _ = writeln!(std::io::stderr(), "gputrace: error: {why}");
        return ExitCode::from(exit::PERMISSION);
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                e.exit();
            }
            let _ = writeln!(std::io::stderr(), "gputrace: {}", one_line(&e.to_string()));
            return ExitCode::from(exit::USAGE);
        }
    };
    match run(cli) {
        Ok(code) => code,
        Err(err) => {
            if is_broken_pipe(&err) {
                return ExitCode::SUCCESS;
            }
            let _ = writeln!(std::io::stderr(), "gputrace: error: {err:#}");
            ExitCode::from(exit_code_of(&err))
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Some(Command::Diff(a)) => return crate::diff::run(&a),
        Some(Command::Check(a)) => return crate::check::run(&a),
        Some(Command::Demo(a)) => return crate::demo::run(&a),
        None => {}
    }
    let mut args = cli.trace;
    // `--pid A --pid B --pid A` is two targets, not three (each warning said twice).
    let mut seen = std::collections::HashSet::new();
    args.pids.retain(|p| seen.insert(*p));
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
    crate::session::run(&args)?;
    Ok(ExitCode::SUCCESS)
}

/// clap's message on one line: its `error: ...` line and any tips (how to pass `-1` as a
/// value), without the usage and the pointer to `--help` after them.
fn one_line(rendered: &str) -> String {
    let mut lines = rendered
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"));
    let mut out = lines
        .next()
        .unwrap_or("error: invalid arguments")
        .to_string();
    for l in lines {
        match l.strip_prefix("tip:") {
            Some(tip) => out.push_str(&format!(" (tip:{tip})")),
            // The arguments a "not provided:" line lists below it.
            None => {
                out.push(' ');
                out.push_str(l);
            }
        }
    }
    out
}

/// A reader that closed stdout early (`gputrace --json ... | head`): written directly or
/// through serde_json, which wraps the I/O error in its own.
fn is_broken_pipe(err: &anyhow::Error) -> bool {
    let pipe = Some(std::io::ErrorKind::BrokenPipe);
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>().map(std::io::Error::kind) == pipe
            || e.downcast_ref::<serde_json::Error>()
                .and_then(serde_json::Error::io_error_kind)
                == pipe
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_stdout_is_not_an_error() {
        let pipe = || std::io::Error::from(std::io::ErrorKind::BrokenPipe);
        assert!(is_broken_pipe(&anyhow::Error::from(pipe())));
        let json = serde_json::to_writer(BrokenPipe, &[1, 2, 3]).unwrap_err();
        assert!(is_broken_pipe(
            &anyhow::Error::from(json).context("print the report")
        ));
        let other = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        assert!(!is_broken_pipe(&anyhow::Error::from(other)));
    }

    /// A writer whose reader went away.
    struct BrokenPipe;

    impl std::io::Write for BrokenPipe {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn pids_repeat_or_come_comma_separated() {
        let cli = Cli::try_parse_from(["gputrace", "-p", "12,34", "--pid", "56"]).unwrap();
        assert_eq!(cli.trace.pids, vec![12, 34, 56]);
        assert!(Cli::try_parse_from(["gputrace", "-p", "12,x"]).is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("abc").is_err());
        assert!(parse_duration("5parsecs").is_err());
        let clap = "error: unexpected argument '-1' found\n\n  tip: to pass '-1' as a value, \
                    use '-- -1'\n\nUsage: gputrace [OPTIONS] [-- <COMMAND>...]\n\nFor more \
                    information, try '--help'.\n";
        assert_eq!(
            one_line(clap),
            "error: unexpected argument '-1' found (tip: to pass '-1' as a value, use '-- -1')"
        );
        let missing = "error: the following required arguments were not provided:\n  <BEFORE>\n  \
                       <AFTER>\n\nUsage: gputrace diff <BEFORE> <AFTER>\n\nFor more information, \
                       try '--help'.\n";
        assert_eq!(
            one_line(missing),
            "error: the following required arguments were not provided: <BEFORE> <AFTER>"
        );
        // Past what a Duration holds, and rounding to nothing: refused, not a panic or a 0 s
        // trace.
        assert!(parse_duration("99999999999999999999").is_err());
        assert!(parse_duration("99999999999999999999h").is_err());
        assert!(parse_duration("0.0000000001ms").is_err());
        assert_eq!(
            parse_duration("0.000001ms").unwrap(),
            Duration::from_nanos(1)
        );
        // Accepted as a Duration, but past what the clock holds once added to it.
        assert!(parse_duration("5000000000000000h").is_err());
        assert!(parse_duration("876000h").is_ok());
        assert!(parse_duration("876001h").is_err());
    }

    #[test]
    fn cli_shapes() {
        let c = Cli::try_parse_from(["gputrace", "-p", "1", "--pid", "2", "-d", "1s"]).unwrap();
        assert_eq!(c.trace.pids, vec![1, 2]);
        let c = Cli::try_parse_from(["gputrace", "-o", "x", "--", "python", "-c", "1"]).unwrap();
        assert_eq!(c.trace.command, vec!["python", "-c", "1"]);
        assert!(c.command.is_none());
        assert_eq!(c.trace.max_overhead, 0.02);
        let c = Cli::try_parse_from(["gputrace", "diff", "a.json", "b.json"]).unwrap();
        match c.command {
            Some(Command::Diff(d)) => {
                assert_eq!(d.before, PathBuf::from("a.json"));
                assert_eq!(d.after, PathBuf::from("b.json"));
            }
            other => panic!("expected diff, got {other:?}"),
        }
        assert!(matches!(
            Cli::try_parse_from(["gputrace", "check"]).unwrap().command,
            Some(Command::Check(_))
        ));
        assert!(matches!(
            Cli::try_parse_from(["gputrace", "demo"]).unwrap().command,
            Some(Command::Demo(_))
        ));
        // A command named like a subcommand still runs after `--`.
        let c = Cli::try_parse_from(["gputrace", "--", "diff", "x"]).unwrap();
        assert_eq!(c.trace.command, vec!["diff", "x"]);
        assert!(c.command.is_none());
        assert!(Cli::try_parse_from(["gputrace", "-p", "1", "diff", "a", "b"]).is_err());
    }
}
