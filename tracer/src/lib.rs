//! gputrace: why is this GPU job slow, right now?
//!
//! Data flows one way: probes (tracer-ebpf) -> `collect` (reads kernel maps and ring buffers)
//! -> `aggregate` (pure) -> `symbolize` -> `report` (pure rendering).

pub mod aggregate;
pub mod bpf;
pub mod cli;
pub mod collect;
pub mod error;
pub mod probes;
pub mod procfs;
pub mod python;
pub mod report;
pub mod session;
pub mod symbolize;
pub mod target;
pub mod tracefs;
pub mod tracker;
