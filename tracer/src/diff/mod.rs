//! `gputrace diff BEFORE.json AFTER.json`: what changed between two runs.

use std::process::ExitCode;

use crate::cli::DiffArgs;

pub fn run(_args: &DiffArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`gputrace diff` is not built yet")
}
