//! Installs the eBPF toolchain and test tools on a fresh Debian 12 machine of this kind.
//! Every step checks first, so a second run takes well under a second.
//!
//! Two toolchains can build tracer-ebpf (see tracer/build.rs): rustup nightly with rust-src
//! (upstream aya's path) or Debian's rustc-web with libstd-rust-web-dev-bpf (a prebuilt `core`
//! for bpfel; rustup here has no rust-src and cannot fetch one). Both need bpf-linker, built
//! against the LLVM that matches the compiler's (LLVM 22 for rustc-web 1.96).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

/// bpf-linker release pinned with its LLVM: they must move together.
const BPF_LINKER_VERSION: &str = "0.13.0";
const BPF_LINKER_LLVM_FEATURE: &str = "llvm-22";
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";

const DEBIAN_TOOLCHAIN: &[&str] = &["rustc-web", "cargo-web", "libstd-rust-web-dev-bpf"];
const LINKER_BUILD_DEPS: &[&str] = &[
    "llvm-22-dev",
    "libpolly-22-dev",
    "zlib1g-dev",
    "libzstd-dev",
];
/// Used by the tests (workload and fake CUDA libraries) and the benchmarks.
const TEST_TOOLS: &[(&str, &str)] = &[("gcc", "gcc"), ("python3", "python3")];
const BENCH_TOOLS: &[(&str, &str)] = &[("bpftrace", "bpftrace"), ("perf", "linux-perf")];

pub fn run() -> Result<()> {
    let mut apt: Vec<&str> = Vec::new();
    let nightly = nightly_has_rust_src();
    if !nightly && !debian_bpf_core_present() {
        apt.extend(DEBIAN_TOOLCHAIN);
    }
    let linker = bpf_linker();
    if linker.is_none() {
        apt.extend(LINKER_BUILD_DEPS);
    }
    for (bin, pkg) in TEST_TOOLS.iter().chain(BENCH_TOOLS) {
        if which(bin).is_none() {
            apt.push(pkg);
        }
    }
    if !apt.is_empty() {
        apt_install(&apt)?;
    }
    if linker.is_none() {
        install_bpf_linker()?;
    }
    if !nightly && !debian_bpf_core_present() {
        bail!(
            "Debian's rustc-web is installed but /usr/lib/rustlib/bpfel-unknown-none has no core"
        );
    }
    crate::test_deps::fetch()?;
    eprintln!(
        "xtask: eBPF toolchain ready ({}, bpf-linker {})",
        if nightly {
            "rustup nightly + rust-src"
        } else {
            "Debian rustc-web + prebuilt bpfel core"
        },
        bpf_linker()
            .map(|p| p.display().to_string())
            .unwrap_or_default()
    );
    Ok(())
}

fn apt_install(pkgs: &[&str]) -> Result<()> {
    eprintln!("xtask: installing {}", pkgs.join(" "));
    let sudo = !crate::is_root();
    let mut update = if sudo {
        Command::new("sudo")
    } else {
        Command::new("apt-get")
    };
    if sudo {
        update.arg("apt-get");
    }
    let st = update
        .arg("update")
        .arg("-qq")
        .status()
        .context("apt-get update")?;
    if !st.success() {
        bail!("apt-get update failed");
    }
    let mut install = if sudo {
        Command::new("sudo")
    } else {
        Command::new("apt-get")
    };
    if sudo {
        install.arg("apt-get");
    }
    let st = install
        .env("DEBIAN_FRONTEND", "noninteractive")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(pkgs)
        .status()
        .context("apt-get install")?;
    if !st.success() {
        bail!("apt-get install {} failed", pkgs.join(" "));
    }
    Ok(())
}

fn install_bpf_linker() -> Result<()> {
    eprintln!("xtask: building bpf-linker {BPF_LINKER_VERSION} against {LLVM_PREFIX} (~80 s)");
    let path = format!(
        "{LLVM_PREFIX}/bin:{}",
        std::env::var("PATH").unwrap_or_default()
    );
    let cargo_bin = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let st = Command::new(cargo_bin)
        .args([
            "install",
            "bpf-linker",
            "--version",
            BPF_LINKER_VERSION,
            "--locked",
            "--no-default-features",
            "--features",
            BPF_LINKER_LLVM_FEATURE,
        ])
        .env("PATH", path)
        .env("LLVM_SYS_221_PREFIX", LLVM_PREFIX)
        .env("LLVM_SYS_220_PREFIX", LLVM_PREFIX)
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("RUSTFLAGS")
        .status()
        .context("cargo install bpf-linker")?;
    if !st.success() {
        bail!("cargo install bpf-linker failed (needs llvm-22-dev; see the errors above)");
    }
    Ok(())
}

fn bpf_linker() -> Option<PathBuf> {
    let p = which("bpf-linker").or_else(|| {
        let home = std::env::var_os("CARGO_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))?;
        let p = home.join("bin/bpf-linker");
        p.is_file().then_some(p)
    })?;
    // A linker built against an LLVM that is gone fails to start: treat it as missing.
    Command::new(&p)
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|_| p)
}

fn nightly_has_rust_src() -> bool {
    Command::new("rustup")
        .args(["run", "nightly", "rustc", "--print", "sysroot"])
        .env_remove("RUSTUP_TOOLCHAIN")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| {
            Path::new(String::from_utf8_lossy(&o.stdout).trim())
                .join("lib/rustlib/src/rust/library/core/Cargo.toml")
                .exists()
        })
        .unwrap_or(false)
}

fn debian_bpf_core_present() -> bool {
    Path::new("/usr/bin/rustc").exists()
        && Path::new("/usr/bin/cargo").exists()
        && std::fs::read_dir("/usr/lib/rustlib/bpfel-unknown-none/lib")
            .map(|rd| {
                rd.flatten()
                    .any(|e| e.file_name().to_string_lossy().starts_with("libcore-"))
            })
            .unwrap_or(false)
}

pub fn which(bin: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(bin))
            .find(|c| c.is_file())
    })
}
