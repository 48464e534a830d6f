//! Third-party files the tests need, fetched into target/test-deps/ once: the real CUDA runtime
//! (`libcudart.so.12` from NVIDIA's `nvidia-cuda-runtime-cu12` wheel), which loads and fails
//! with error 35 on a machine without a GPU, so probes on it can be checked exactly.

use std::{path::PathBuf, process::Command};

use anyhow::{bail, Context, Result};

/// The wheel version the tests were written against.
const CUDART_WHEEL: &str = "nvidia-cuda-runtime-cu12==12.9.79";

pub fn dir() -> PathBuf {
    crate::workspace_root().join("target/test-deps")
}

/// Where the tests find the real runtime.
pub fn libcudart() -> PathBuf {
    dir().join("nvidia/cuda_runtime/lib/libcudart.so.12")
}

pub fn fetch() -> Result<()> {
    if libcudart().is_file() {
        return Ok(());
    }
    let dir = dir();
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    eprintln!("xtask: fetching {CUDART_WHEEL} into {}", dir.display());
    let st = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--quiet",
            CUDART_WHEEL,
            "-d",
        ])
        .arg(&dir)
        .status()
        .context("run pip download (needs python3 with pip)")?;
    if !st.success() {
        bail!("pip download {CUDART_WHEEL} failed");
    }
    let wheel = std::fs::read_dir(&dir)?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("nvidia_cuda_runtime_cu12-"))
        })
        .context("the downloaded wheel is missing")?;
    let st = Command::new("python3")
        .args(["-m", "zipfile", "-e"])
        .arg(&wheel)
        .arg(&dir)
        .status()
        .context("unpack the wheel")?;
    if !st.success() || !libcudart().is_file() {
        bail!("{} holds no libcudart.so.12", wheel.display());
    }
    Ok(())
}
