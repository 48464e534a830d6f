//! Builds the bundled C workloads (tests/workloads/*.c) into target/workloads/, so the README's
//! `cargo xtask run -- --output out -- target/workloads/hot_threads 3` works on a fresh clone.
//! Frame pointers are kept so user stacks unwind through them, as the e2e tests build them.

use std::{path::Path, process::Command};

use anyhow::{bail, Context, Result};

pub fn build(root: &Path) -> Result<()> {
    let src_dir = root.join("tests/workloads");
    let out_dir = root.join("target/workloads");
    std::fs::create_dir_all(&out_dir).with_context(|| format!("create {}", out_dir.display()))?;
    let mut sources: Vec<_> = std::fs::read_dir(&src_dir)
        .with_context(|| format!("read {}", src_dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "c"))
        .collect();
    sources.sort();
    for src in sources {
        let name = src.file_stem().unwrap();
        let out = out_dir.join(name);
        let fresh = match (std::fs::metadata(&src), std::fs::metadata(&out)) {
            (Ok(s), Ok(o)) => o.modified()? >= s.modified()?,
            _ => false,
        };
        if fresh {
            continue;
        }
        let status = Command::new("gcc")
            .args(["-O1", "-g", "-fno-omit-frame-pointer", "-pthread", "-o"])
            .arg(&out)
            .arg(&src)
            .status()
            .context("run gcc (install it with `apt-get install gcc`)")?;
        if !status.success() {
            bail!("gcc failed for {}", src.display());
        }
    }
    Ok(())
}
