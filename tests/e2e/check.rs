//! Issue 5, `gputrace check`: as root on this machine everything a trace needs is ok; as an
//! unprivileged user the privilege check fails and so does the exit code; a process that
//! dlopens a library named libcudart.so.12 is listed with the library.

use std::{
    os::unix::fs::PermissionsExt,
    path::PathBuf,
    process::{Command, Stdio},
};

use crate::common::*;

/// The line of check `name` (`STATUS  NAME  DETAIL`), if any.
fn line_of<'a>(out: &'a str, name: &str) -> Option<&'a str> {
    out.lines()
        .find(|l| l.get(6..).is_some_and(|rest| rest.starts_with(name)))
}

fn status_of(out: &str, name: &str) -> String {
    line_of(out, name)
        .unwrap_or_else(|| panic!("no `{name}` line in:\n{out}"))
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn check_as_root_passes() {
    let _g = serial();
    if !require_root("check_as_root_passes") {
        return;
    }
    let run = gputrace(&["check"]);
    assert_eq!(
        run.code(),
        0,
        "stdout:\n{}\nstderr:\n{}",
        run.stdout,
        run.stderr
    );
    for name in [
        "privileges",
        "kernel",
        "btf",
        "tracefs",
        "tracepoints",
        "uprobes",
        "perf events",
        "ring buffer",
        "ebpf object",
    ] {
        assert_eq!(
            status_of(&run.stdout, name),
            "ok",
            "{name}:\n{}",
            run.stdout
        );
    }
    // Hash maps allocated as used in every program type: Linux 6.1 and later (earlier where
    // a distribution's kernel took the change in). Else every map is preallocated, said but
    // not a failure.
    let memory = status_of(&run.stdout, "map memory");
    assert!(
        memory == "ok" || (memory == "info" && kernel_version() < (6, 1)),
        "{}",
        run.stdout
    );
    // This machine has no kprobes and no NVIDIA driver: said, but not failures.
    assert_eq!(status_of(&run.stdout, "kprobes"), "info", "{}", run.stdout);
    assert!(
        ["ok", "warn"].contains(&status_of(&run.stdout, "nvidia").as_str()),
        "{}",
        run.stdout
    );
    assert!(
        line_of(&run.stdout, "cuda procs").is_some(),
        "{}",
        run.stdout
    );
    assert!(
        !run.stdout.lines().any(|l| l.starts_with("fail")),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("gputrace can trace on this machine"));
    // How far the verifier walked the largest program, read from the kernel (fdinfo's
    // `verified_insns`, Linux 5.16).
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut v = release
        .split(['.', '-'])
        .map(|n| n.parse::<u32>().unwrap_or(0));
    if (v.next().unwrap_or(0), v.next().unwrap_or(0)) >= (5, 16) {
        assert!(
            line_of(&run.stdout, "ebpf object")
                .is_some_and(|l| l.contains("of the verifier's limit (")),
            "{}",
            run.stdout
        );
    }
}

/// A copy of the binary that an unprivileged user can execute wherever the tree lives.
fn world_executable_copy() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gputrace-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = dir.join("gputrace");
    std::fs::copy(GPUTRACE, &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

#[test]
fn check_unprivileged_fails() {
    let _g = serial();
    if !require_root("check_unprivileged_fails") {
        return;
    }
    let bin = world_executable_copy();
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(&bin)
        .arg("check")
        .stdin(Stdio::null())
        .output()
        .expect("run setpriv (util-linux)");
    let _ = std::fs::remove_dir_all(bin.parent().unwrap());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(
        out.status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let line = line_of(&stdout, "privileges").expect("privileges line");
    assert!(line.starts_with("fail"), "{stdout}");
    assert!(
        line.contains("uid 65534") && line.contains("fix: run it with sudo"),
        "{line}"
    );
    assert!(stdout.contains("cannot trace here"), "{stdout}");
    // Checks that do not need privileges still answer.
    assert_eq!(status_of(&stdout, "kernel"), "ok", "{stdout}");
}

#[test]
fn check_lists_a_process_with_libcudart() {
    let _g = serial();
    if !require_root("check_lists_a_process_with_libcudart") {
        return;
    }
    // A fake libcudart.so.12: only the name matters to the scan.
    let dir = tmp_dir().join(format!("check-cuda-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("fake.c");
    std::fs::write(&src, "int cudaLaunchKernel(void) { return 0; }\n").unwrap();
    let lib = dir.join("libcudart.so.12");
    let status = Command::new("gcc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .expect("run gcc");
    assert!(status.success(), "gcc failed");
    let holder = build_c("dlopen_hold", &["-ldl"]);
    let mut child = spawn_ready(Command::new(&holder).arg(&lib).arg("30"));
    let pid = child.id();

    let run = gputrace(&["check"]);
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(run.code(), 0, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(status_of(&run.stdout, "cuda procs"), "ok", "{}", run.stdout);
    let listed = run
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("pid {pid} ")))
        .unwrap_or_else(|| panic!("pid {pid} not listed:\n{}", run.stdout));
    assert!(listed.contains("dlopen_hold"), "{listed}");
    assert!(listed.contains(lib.to_str().unwrap()), "{listed}");
}
