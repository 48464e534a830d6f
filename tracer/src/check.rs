//! `gputrace check`. Placeholder on the `report` branch so the subcommand compiles; the
//! `demo` branch owns this file and replaces it whole.

use std::process::ExitCode;

use clap::Args;

#[derive(Debug, Clone, Args)]
pub struct CheckArgs {}

pub fn run(_args: &CheckArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`gputrace check` is not built yet")
}
