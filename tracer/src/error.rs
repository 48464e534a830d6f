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
    #[error("cannot execute {program}: {reason}")]
    Exec { program: String, reason: String },
    #[error("cannot write output directory {}: {reason}", path.display())]
    Output { path: PathBuf, reason: String },
    #[error("cannot write {}: {reason}", path.display())]
    OutputFile { path: PathBuf, reason: String },
    #[error("loading the eBPF programs failed: {0}")]
    BpfLoad(String),
    #[error("refusing to run: {0}")]
    Refused(String),
}

impl TraceError {
    pub fn exit_code(&self) -> u8 {
        match self {
            TraceError::NotPrivileged => exit::PERMISSION,
            TraceError::NoSuchProcess(_) => exit::NO_SUCH_PROCESS,
            TraceError::Exec { .. } => exit::EXEC_FAILED,
            TraceError::Output { .. } | TraceError::OutputFile { .. } => exit::OUTPUT,
            TraceError::BpfLoad(_) => exit::BPF,
            TraceError::Refused(_) => exit::PERMISSION,
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
