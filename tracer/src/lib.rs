//! gputrace: why is this GPU job slow, right now?
//!
//! Data flows one way: probes (tracer-ebpf) -> `collect` (reads kernel maps and ring buffers)
//! -> `aggregate` (pure) -> `symbolize` -> `report` (pure rendering).

/// `max`, or the lower cap a test sets in environment variable `var` (never a higher one):
/// the bounds on what gputrace keeps, lowered so that a test reaches them in seconds.
pub fn env_cap(var: &str, max: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(max, |n: usize| n.min(max))
}

/// `eprintln!` that never panics: after a hang-up (an ssh session that dropped) stderr is a
/// dead terminal, and a failed progress line must not cost the report being written.
#[macro_export]
macro_rules! note {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

pub mod accounting;
pub mod aggregate;
pub mod batch;
pub mod bpf;
pub mod btf;
pub mod budget;
pub mod check;
pub mod cli;
pub mod collect;
pub mod cpu_samples;
pub mod cuda;
pub mod demo;
pub mod diff;
pub mod error;
pub mod image;
pub mod overhead;
pub mod perf_map;
pub mod prealloc;
pub mod probes;
pub mod procfs;
pub mod python;
pub mod report;
pub mod session;
pub mod streams;
pub mod symbolize;
pub mod target;
pub mod tracefs;
pub mod tracker;
pub mod uprobes;
pub mod verdict;
pub mod young;
