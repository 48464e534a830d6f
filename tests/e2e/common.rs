//! Shared helpers for the end-to-end tests.

#![allow(dead_code)]

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    sync::{Mutex, MutexGuard},
};

pub const GPUTRACE: &str = env!("CARGO_BIN_EXE_gputrace");

/// Serialises the tests that load BPF programs or measure CPU shares.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// True when the test may run; false (after a loud message) when it must skip. Panics when it
/// would skip but `CI` is set.
pub fn require_root(test: &str) -> bool {
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    let msg = format!(
        "\n!!! SKIPPED {test}: needs root to load eBPF programs (run `cargo xtask test`, which \
         uses sudo) !!!\n"
    );
    if std::env::var_os("CI").is_some() {
        panic!("{msg}CI is set, so a skipped kernel test is a failure");
    }
    eprintln!("{msg}");
    false
}

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

pub fn tmp_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
}

/// Compiles `tests/workloads/<name>.c` once per test run (frame pointers kept so user stacks
/// unwind, as in the real libraries we stand in for). `extra` are more gcc arguments.
pub fn build_c(name: &str, extra: &[&str]) -> PathBuf {
    static BUILT: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let src = repo_root().join(format!("tests/workloads/{name}.c"));
    let out = tmp_dir().join(format!("workloads/{name}"));
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if built.iter().any(|b| b == name) {
        return out;
    }
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    let status = Command::new("gcc")
        .args(["-O1", "-g", "-fno-omit-frame-pointer", "-pthread", "-o"])
        .arg(&out)
        .arg(&src)
        .args(extra)
        .status()
        .expect("run gcc");
    assert!(status.success(), "gcc failed for {}", src.display());
    built.push(name.to_string());
    out
}

/// Compiles C source `src` into shared library `out` as the real CUDA libraries are built
/// where it matters here: -O0 keeps every function's `push %rbp` prologue (at -O1 gcc drops
/// it in leaf functions). `extra` are more gcc arguments.
pub fn build_shared_c(src: &Path, out: &Path, extra: &[&str]) {
    let st = Command::new("gcc")
        .args([
            "-O0",
            "-g",
            "-fno-omit-frame-pointer",
            "-shared",
            "-fPIC",
            "-o",
        ])
        .arg(out)
        .arg(src)
        .args(extra)
        .status()
        .expect("run gcc");
    assert!(st.success(), "gcc failed building {}", out.display());
}

pub struct Run {
    pub output: Output,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn code(&self) -> i32 {
        self.output.status.code().unwrap_or(-1)
    }
    pub fn report(&self, dir: &Path) -> serde_json::Value {
        let text = std::fs::read_to_string(dir.join("report.json")).unwrap_or_else(|e| {
            panic!(
                "no report.json in {}: {e}\nstdout:\n{}\nstderr:\n{}",
                dir.display(),
                self.stdout,
                self.stderr
            )
        });
        serde_json::from_str(&text).expect("report.json is JSON")
    }
}

/// Runs gputrace to completion.
pub fn gputrace(args: &[&str]) -> Run {
    gputrace_env(args, &[])
}

/// Runs gputrace to completion with extra environment variables.
pub fn gputrace_env(args: &[&str], env: &[(&str, &str)]) -> Run {
    let output = Command::new(GPUTRACE)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run gputrace");
    Run {
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        output,
    }
}

/// A fresh empty directory under the test tmp dir.
pub fn out_dir(name: &str) -> PathBuf {
    let d = tmp_dir().join(format!("out-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Builds C workload `name` (tests/workloads/NAME.c), launches it with `args` under gputrace
/// writing into a fresh output directory, and checks that gputrace succeeded.
pub fn trace_workload(name: &str, args: &[&str]) -> (PathBuf, Run) {
    let bin = build_c(name, &[]);
    let out = out_dir(name);
    let mut argv = vec!["-o", out.to_str().unwrap(), "--", bin.to_str().unwrap()];
    argv.extend_from_slice(args);
    let run = gputrace(&argv);
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr);
    (out, run)
}

/// `field` of the row of the JSON array `rows` whose `key` is `is` (0 when there is none): a
/// syscall's count, a program's hits, a file's calls.
pub fn field_of(rows: &serde_json::Value, key: &str, is: &str, field: &str) -> u64 {
    rows.as_array()
        .into_iter()
        .flatten()
        .find(|r| r[key] == is)
        .and_then(|r| r[field].as_u64())
        .unwrap_or(0)
}

/// The sum of `field` over the JSON array `rows` (every row must have it).
pub fn sum_of(rows: &serde_json::Value, field: &str) -> u64 {
    rows.as_array()
        .unwrap()
        .iter()
        .map(|r| r[field].as_u64().unwrap())
        .sum()
}

/// Names of the BPF programs loaded in the kernel right now.
pub fn loaded_program_names() -> Vec<String> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter_map(|p| p.name_as_str().map(str::to_string))
        .collect()
}

/// `text` with every run of whitespace one space: the terminal report wraps its lines at 100
/// columns, anywhere between words.
pub fn unwrapped(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The children of `pid` (its main thread's) with their names.
pub fn children_of(pid: i32) -> Vec<(u32, String)> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|c| c.parse::<u32>().ok())
        .map(|c| {
            let comm = std::fs::read_to_string(format!("/proc/{c}/comm")).unwrap_or_default();
            (c, comm.trim().to_string())
        })
        .collect()
}

/// `pid` and its descendants named `comm`.
pub fn descendants_named(pid: u32, comm: &str) -> Vec<u32> {
    let mut out = Vec::new();
    let own = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    if own.trim() == comm {
        out.push(pid);
    }
    for (c, _) in children_of(pid as i32) {
        out.extend(descendants_named(c, comm));
    }
    out
}

/// Starts `cmd` with its stdout piped and waits for its first line, `ready`: a workload that
/// says so once it is set up to be traced.
pub fn spawn_ready(cmd: &mut Command) -> Child {
    let mut child = cmd.stdout(Stdio::piped()).spawn().unwrap();
    let mut ready = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut ready)
        .unwrap();
    assert_eq!(ready.trim(), "ready");
    child
}

/// The running kernel's (major, minor) version.
pub fn kernel_version() -> (u32, u32) {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut parts = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}
