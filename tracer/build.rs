//! Builds the eBPF programs (tracer-ebpf) for bpfel-unknown-none and leaves the object in
//! OUT_DIR, so that a plain `cargo build` gives a `gputrace` binary with the object embedded.
//!
//! Two toolchains can build it; the first one found wins:
//! 1. rustup nightly with `rust-src` (upstream aya's path: `-Z build-std=core`);
//! 2. Debian's `rustc-web` (/usr/bin/rustc) with `libstd-rust-web-dev-bpf`, which ships a
//!    prebuilt `core` for bpfel (`RUSTC_BOOTSTRAP=1` unlocks the unstable bits aya-ebpf uses).
//!
//! Both need `bpf-linker`. `GPUTRACE_EBPF_OBJ=/path/to/object` skips the build (packagers).
//! When nothing fits, the build fails with one message that names what to install.

use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

const OBJECT_NAME: &str = "gputrace.bpf.o";

// Not part of the eBPF build: the demo's stand-in CUDA runtime (see the file).
#[path = "build/demo_cudart.rs"]
mod demo_cudart;

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest.parent().unwrap().to_path_buf();
    let ebpf_dir = root.join("tracer-ebpf");
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    let out_obj = out_dir.join(OBJECT_NAME);
    demo_cudart::build(&manifest, &out_dir);

    for p in [
        "tracer-ebpf/src",
        "tracer-ebpf/Cargo.toml",
        "tracer-ebpf/Cargo.lock",
        "tracer-common/src",
        "tracer-common/Cargo.toml",
    ] {
        println!("cargo::rerun-if-changed={}", root.join(p).display());
    }
    println!("cargo::rerun-if-env-changed=GPUTRACE_EBPF_OBJ");
    println!("cargo::rerun-if-env-changed=GPUTRACE_EBPF_TOOLCHAIN");

    if let Ok(prebuilt) = env::var("GPUTRACE_EBPF_OBJ") {
        if let Err(e) = std::fs::copy(&prebuilt, &out_obj) {
            fail(&format!("GPUTRACE_EBPF_OBJ={prebuilt}: {e}"));
        }
        return;
    }

    let Some(linker) = find_bpf_linker() else {
        fail("bpf-linker not found (looked in PATH and ~/.cargo/bin); run `cargo xtask setup`");
    };
    let toolchain = match detect_toolchain() {
        Ok(t) => t,
        Err(why) => fail(&why),
    };

    let target_dir = out_dir.join("ebpf-target");
    let mut cmd = toolchain.cargo_command();
    cmd.current_dir(&ebpf_dir)
        .args(["build", "--release", "--target", "bpfel-unknown-none"])
        .arg("--target-dir")
        .arg(&target_dir)
        .args(toolchain.extra_args());
    // The outer (rustup) cargo exports variables that would point the inner build at the host
    // toolchain, which has no `core` for bpfel.
    for (k, _) in env::vars_os() {
        let k = k.to_string_lossy().to_string();
        if k.starts_with("CARGO")
            || k.starts_with("RUSTC")
            || k.starts_with("RUSTUP")
            || k == "RUSTFLAGS"
            || k == "RUSTDOC"
            || k == "DEBUG"
            || k == "OPT_LEVEL"
            || k == "PROFILE"
            || k == "TARGET"
            || k == "HOST"
            || k == "NUM_JOBS"
            || k == "OUT_DIR"
        {
            cmd.env_remove(&k);
        }
    }
    let linker_dir = linker.parent().unwrap().to_path_buf();
    let path = env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = toolchain.path_prefix();
    dirs.push(linker_dir);
    dirs.extend(env::split_paths(&path));
    cmd.env("PATH", env::join_paths(dirs).unwrap())
        .env("CARGO_TARGET_BPFEL_UNKNOWN_NONE_LINKER", &linker)
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            ["-Cdebuginfo=2", "-Clink-arg=--btf"].join("\x1f"),
        );
    if toolchain.needs_bootstrap() {
        cmd.env("RUSTC_BOOTSTRAP", "1");
    }
    if let Some(home) = env::var_os("CARGO_HOME") {
        cmd.env("CARGO_HOME", home);
    }

    let status = cmd.status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => fail(&format!(
            "building the eBPF programs with {} failed ({s}); see the errors above",
            toolchain.describe()
        )),
        Err(e) => fail(&format!("running {}: {e}", toolchain.describe())),
    }
    let built = target_dir.join("bpfel-unknown-none/release/gputrace-ebpf");
    if let Err(e) = std::fs::copy(&built, &out_obj) {
        fail(&format!("copying {}: {e}", built.display()));
    }
}

enum Toolchain {
    Nightly,
    Debian { cargo: PathBuf, bin: PathBuf },
}

impl Toolchain {
    fn cargo_command(&self) -> Command {
        match self {
            Toolchain::Nightly => {
                let mut c = Command::new("rustup");
                c.args(["run", "nightly", "cargo"]);
                c
            }
            Toolchain::Debian { cargo, .. } => Command::new(cargo),
        }
    }
    fn extra_args(&self) -> Vec<&'static str> {
        match self {
            Toolchain::Nightly => vec!["-Z", "build-std=core"],
            Toolchain::Debian { .. } => vec![],
        }
    }
    fn path_prefix(&self) -> Vec<PathBuf> {
        match self {
            Toolchain::Nightly => vec![],
            Toolchain::Debian { bin, .. } => vec![bin.clone()],
        }
    }
    fn needs_bootstrap(&self) -> bool {
        matches!(self, Toolchain::Debian { .. })
    }
    fn describe(&self) -> String {
        match self {
            Toolchain::Nightly => "rustup nightly + rust-src".into(),
            Toolchain::Debian { cargo, .. } => format!("{} (Debian rustc-web)", cargo.display()),
        }
    }
}

fn detect_toolchain() -> Result<Toolchain, String> {
    let forced = env::var("GPUTRACE_EBPF_TOOLCHAIN").ok();
    if forced.as_deref() != Some("debian") && nightly_has_rust_src() {
        return Ok(Toolchain::Nightly);
    }
    if forced.as_deref() == Some("nightly") {
        return Err(
            "GPUTRACE_EBPF_TOOLCHAIN=nightly but rustup nightly has no rust-src \
                    (`rustup component add rust-src --toolchain nightly`)"
                .into(),
        );
    }
    let bin = PathBuf::from("/usr/bin");
    let rustc = bin.join("rustc");
    let cargo = bin.join("cargo");
    if rustc.exists() && cargo.exists() && has_prebuilt_bpf_core(&rustc) {
        return Ok(Toolchain::Debian { cargo, bin });
    }
    Err(
        "no toolchain can build the eBPF programs: install Debian's rustc-web, cargo-web and \
         libstd-rust-web-dev-bpf (prebuilt core for bpfel), or rustup nightly with rust-src; \
         `cargo xtask setup` installs them"
            .into(),
    )
}

fn nightly_has_rust_src() -> bool {
    let Ok(out) = Command::new("rustup")
        .args(["run", "nightly", "rustc", "--print", "sysroot"])
        .env_remove("RUSTUP_TOOLCHAIN")
        .output()
    else {
        return false;
    };
    if !out.status.success() {
        return false;
    }
    let sysroot = String::from_utf8_lossy(&out.stdout).trim().to_string();
    Path::new(&sysroot)
        .join("lib/rustlib/src/rust/library/core/Cargo.toml")
        .exists()
}

fn has_prebuilt_bpf_core(rustc: &Path) -> bool {
    let Ok(out) = Command::new(rustc).args(["--print", "sysroot"]).output() else {
        return false;
    };
    let sysroot = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let lib = Path::new(&sysroot).join("lib/rustlib/bpfel-unknown-none/lib");
    std::fs::read_dir(lib)
        .map(|rd| {
            rd.flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with("libcore-"))
        })
        .unwrap_or(false)
}

fn find_bpf_linker() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = env::var_os("PATH")
        .map(|p| env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Some(home) = env::var_os("CARGO_HOME") {
        dirs.push(PathBuf::from(home).join("bin"));
    }
    if let Some(home) = env::var_os("HOME") {
        dirs.push(PathBuf::from(home).join(".cargo/bin"));
    }
    dirs.into_iter()
        .map(|d| d.join("bpf-linker"))
        .find(|p| p.is_file())
}

fn fail(msg: &str) -> ! {
    println!("cargo::error=gputrace: {msg}");
    eprintln!("error: gputrace: {msg}");
    std::process::exit(1);
}
