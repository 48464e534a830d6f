//! End-to-end tests: the real `gputrace` binary, real eBPF programs, real workloads.
//!
//! They need root (or CAP_BPF + CAP_PERFMON). Without it they skip with a loud message, unless
//! `CI` is set: then a would-be skip is a failure, because a skipped kernel test in CI hides a
//! broken tracer. They share kernel state (perf events, tracepoints) and CPU time, so each one
//! holds a global lock while it runs.

mod bad_input;
mod budget;
mod check;
mod common;
mod cpu_profile;
mod cuda;
mod demo;
mod faults;
mod python;
mod report_outputs;
mod security;
mod time_accounting;
mod timeline;
