//! Errors callers branch on, each with its documented exit code (docs/report.md, "Exit codes").

use std::path::PathBuf;

/// Exit codes. 0 is success, also when the trace was stopped by Ctrl-C or the target exited.
pub mod exit {
    pub const FAILURE: u8 = 1;
    pub const USAGE: u8 = 2;
    pub const PERMISSION: u8 = 3;
    pub const NO_SUCH_PROCESS: u8 = 4;
    pub const EXEC_FAILED: u8 = 5;
    pub const OUTPUT: u8 = 6;
    pub const BPF: u8 = 7;
}

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("needs root, or CAP_BPF and CAP_PERFMON (run it with sudo)")]
    NotPrivileged,
    #[error("no such process: {0}")]
    NoSuchProcess(u32),
    #[error("pid {0} is gputrace itself: give the pid of the job to trace")]
    SelfTarget(u32),
    #[error("cannot execute {program}: {reason}")]
    Exec { program: String, reason: String },
    #[error("cannot write output directory {}: {reason}", path.display())]
    Output { path: PathBuf, reason: String },
    #[error("cannot write {}: {reason}", path.display())]
    OutputFile { path: PathBuf, reason: String },
    #[error("loading the eBPF programs failed: {0}")]
    BpfLoad(String),
    #[error("the kernel refused to attach {what}: {reason}")]
    Attach { what: String, reason: String },
    #[error("pid {pid} is a thread of process {tgid}: give --pid {tgid}")]
    ThreadId { pid: u32, tgid: u32 },
    #[error("pid {0} is a kernel thread: gputrace traces user processes")]
    KernelThread(u32),
}

impl TraceError {
    pub fn exit_code(&self) -> u8 {
        match self {
            TraceError::NotPrivileged => exit::PERMISSION,
            TraceError::NoSuchProcess(_) => exit::NO_SUCH_PROCESS,
            TraceError::SelfTarget(_) => exit::USAGE,
            TraceError::Exec { .. } => exit::EXEC_FAILED,
            TraceError::Output { .. } | TraceError::OutputFile { .. } => exit::OUTPUT,
            TraceError::BpfLoad(_) | TraceError::Attach { .. } => exit::BPF,
            TraceError::ThreadId { .. } | TraceError::KernelThread(_) => exit::USAGE,
        }
    }
}

/// The exit code for any error: a [`TraceError`] anywhere in the chain decides, else 1.
pub fn exit_code_of(err: &anyhow::Error) -> u8 {
    err.chain()
        .find_map(|e| e.downcast_ref::<TraceError>())
        .map(TraceError::exit_code)
        .unwrap_or(exit::FAILURE)
}

#[cfg(test)]
mod tests {
    use anyhow::Context;

    use super::*;

    #[test]
    fn the_trace_error_in_the_chain_decides_the_exit_code() {
        let e = Err::<(), _>(TraceError::Attach {
            what: "x".into(),
            reason: "y".into(),
        })
        .context("attach the core probes")
        .unwrap_err();
        assert_eq!(exit_code_of(&e), exit::BPF);
        let e = anyhow::anyhow!("something else").context("outer");
        assert_eq!(exit_code_of(&e), exit::FAILURE);
        let e: anyhow::Error = TraceError::OutputFile {
            path: "out/cpu.svg".into(),
            reason: "disk full".into(),
        }
        .into();
        assert_eq!(exit_code_of(&e), exit::OUTPUT);
        assert_eq!(format!("{e:#}"), "cannot write out/cpu.svg: disk full");
    }

    #[test]
    fn exit_codes_are_distinct() {
        let mut codes = [
            exit::FAILURE,
            exit::USAGE,
            exit::PERMISSION,
            exit::NO_SUCH_PROCESS,
            exit::EXEC_FAILED,
            exit::OUTPUT,
            exit::BPF,
        ];
        codes.sort_unstable();
        assert!(codes.windows(2).all(|w| w[0] != w[1]));
        assert!(!codes.contains(&0));
    }
}
