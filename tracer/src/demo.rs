//! `gputrace demo`. Placeholder on the `report` branch so the subcommand compiles; the
//! `demo` branch owns this file and replaces it whole.

use std::process::ExitCode;

use clap::Args;

#[derive(Debug, Clone, Args)]
pub struct DemoArgs {}

pub fn run(_args: &DemoArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`gputrace demo` is not built yet")
}
