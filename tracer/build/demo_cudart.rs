//! Build step for `gputrace demo`, kept apart from the eBPF build: compiles the stand-in CUDA
//! runtime (src/demo/assets/fake_cudart.c) into OUT_DIR/libcudart.so.12, which the binary
//! embeds and writes out when the demo runs.
//!
//! Why at build time: Rust on Linux already needs a C compiler driver (`cc`) to link, so this
//! adds no new build dependency, and the binary then carries the library: the demo works on a
//! machine with no compiler at all (a GPU box the binary was copied to). When compiling fails
//! anyway, the build goes on with an empty placeholder and only `gputrace demo` says so.

use std::{path::Path, process::Command};

pub const LIB_NAME: &str = "libcudart.so.12";

pub fn build(manifest: &Path, out_dir: &Path) {
    let src = manifest.join("src/demo/assets/fake_cudart.c");
    println!("cargo::rerun-if-changed={}", src.display());
    println!("cargo::rerun-if-env-changed=CC");
    let out = out_dir.join(LIB_NAME);
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    // -O0 with frame pointers: every exported function starts with `push %rbp; mov %rsp,%rbp`
    // like the real libcudart (at -O1 gcc drops the frame of leaf functions and shrink-wraps
    // early returns, and a uprobe on another first instruction costs 15x more).
    let status = Command::new(&cc)
        .args([
            "-shared",
            "-fPIC",
            "-O0",
            "-g",
            "-fno-omit-frame-pointer",
            "-pthread",
        ])
        .arg(format!("-Wl,-soname,{LIB_NAME}"))
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .status();
    match status {
        Ok(s) if s.success() => {}
        other => {
            println!(
                "cargo::warning=gputrace: compiling the demo's stand-in CUDA runtime with `{cc}` \
                 failed ({other:?}); `gputrace demo` will not work, everything else will"
            );
            let _ = std::fs::write(&out, b"");
        }
    }
}
