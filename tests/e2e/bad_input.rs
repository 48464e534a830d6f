//! Issue 2's bad input: each gets one clear line on stderr and its documented exit code
//! (docs/report.md, "Exit codes"), never a panic, and leaves nothing in the kernel.

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use crate::{
    common::*,
    faults::{self, assert_no_orphans, assert_released, Bg, Live, Tmpfs},
};

/// Exit code, exactly one non-empty stderr line containing `needle`, no panic or backtrace.
fn assert_one_line(run: &Run, code: i32, needle: &str) {
    let lines: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert_eq!(run.code(), code, "exit code; stderr:\n{}", run.stderr);
    assert_eq!(lines.len(), 1, "one stderr line expected:\n{}", run.stderr);
    assert!(
        lines[0].starts_with("gputrace: error: ") && lines[0].contains(needle),
        "`{needle}` expected in: {}",
        lines[0]
    );
    for bad in ["panicked", "backtrace", "RUST_BACKTRACE"] {
        assert!(!run.stderr.contains(bad), "{}", run.stderr);
    }
}

fn run_with_backtraces(cmd: &mut Command) -> Run {
    let output = cmd
        .env("RUST_BACKTRACE", "1")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run");
    Run {
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        output,
    }
}

#[test]
fn usage_errors() {
    let _g = serial();
    let r = run_with_backtraces(&mut Command::new(GPUTRACE));
    assert_one_line(&r, 2, "nothing to trace");
    let r = run_with_backtraces(Command::new(GPUTRACE).args(["--pid", "1", "--", "true"]));
    assert_one_line(&r, 2, "not both");
    // The argument parser's errors are one line too, tips kept, usage left to --help.
    let r = run_with_backtraces(Command::new(GPUTRACE).args(["-d", "soon", "--pid", "1"]));
    assert_one_line(&r, 2, "`soon` is not a duration");
    let r = run_with_backtraces(Command::new(GPUTRACE).args(["--pid", "-1"]));
    assert_one_line(&r, 2, "(tip: to pass '-1' as a value, use '-- -1')");
    let r = run_with_backtraces(Command::new(GPUTRACE).arg("diff"));
    assert_one_line(&r, 2, "not provided: <BEFORE.json> <AFTER.json>");
    // Past what the clock holds once added to it: refused, not a panic after the attach.
    let r =
        run_with_backtraces(Command::new(GPUTRACE).args(["-d", "5000000000000000h", "--", "true"]));
    assert_one_line(&r, 2, "too long");
    // A bare number is a fraction: 2 is not read as 2% (nor as 200%).
    let r = run_with_backtraces(Command::new(GPUTRACE).args(["--max-overhead", "2", "--", "true"]));
    assert_one_line(&r, 2, "as a percentage (2%)");
    let r = run_with_backtraces(Command::new(GPUTRACE).arg("--help"));
    assert_eq!(r.code(), 0, "{}", r.stderr);
    assert!(r.stdout.contains("Usage:"), "{}", r.stdout);
}

/// A thread's id is not taken for its process (it was traced as one, named after it, and its
/// exit ended the trace while the process ran on), nor a kernel thread for a user process
/// (its syscall, read as 0, made it "blocked on disk I/O" for the whole trace).
#[test]
fn pids_that_are_not_processes() {
    let _g = serial();
    if !require_root("pids_that_are_not_processes") {
        return;
    }
    let r = run_with_backtraces(Command::new(GPUTRACE).args(["--pid", "2", "-d", "1s"]));
    assert_one_line(&r, 2, "pid 2 is a kernel thread");
    let (tx, rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        tx.send(unsafe { libc::gettid() } as u32).unwrap();
        let _ = done_rx.recv();
    });
    let tid = rx.recv().unwrap();
    let me = std::process::id();
    let r =
        run_with_backtraces(Command::new(GPUTRACE).args(["--pid", &tid.to_string(), "-d", "1s"]));
    assert_one_line(
        &r,
        2,
        &format!("pid {tid} is a thread of process {me}: give --pid {me}"),
    );
    drop(done_tx);
    t.join().unwrap();
    assert_no_orphans();
}

#[test]
fn not_root_is_refused() {
    let _g = serial();
    if !require_root("not_root_is_refused") {
        return;
    }
    let r = run_with_backtraces(
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .args([GPUTRACE, "--pid", "1"]),
    );
    assert_one_line(&r, 3, "needs root");
    assert!(r.stderr.contains("sudo"), "the fix is named: {}", r.stderr);
}

#[test]
fn no_such_pid() {
    let _g = serial();
    if !require_root("no_such_pid") {
        return;
    }
    let pid_max: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let pid = (2..pid_max)
        .rev()
        .find(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())
        .unwrap();
    let r = run_with_backtraces(Command::new(GPUTRACE).args(["--pid", &pid.to_string()]));
    assert_one_line(&r, 4, &format!("no such process: {pid}"));
}

/// gputrace's own pid is refused; a target that is gputrace's ancestor (the shell it was
/// started from) is traced without gputrace itself, whose work would otherwise be profiled and
/// blamed on the target.
#[test]
fn gputrace_never_traces_itself() {
    let _g = serial();
    if !require_root("gputrace_never_traces_itself") {
        return;
    }
    // `exec`: the shell's pid becomes gputrace's.
    let r = run_with_backtraces(
        Command::new("sh")
            .arg("-c")
            .arg(format!("exec {GPUTRACE} -d 1s --pid $$")),
    );
    assert_one_line(&r, 2, "is gputrace itself");

    let dir = out_dir("self-ancestor");
    // A command after gputrace keeps the shell alive as its parent.
    let r = run_with_backtraces(Command::new("sh").arg("-c").arg(format!(
        "{GPUTRACE} -d 1s -o {} --pid $$; echo shell-after",
        dir.display()
    )));
    assert_eq!(r.code(), 0, "{}", r.stderr);
    assert!(r.stdout.contains("shell-after"), "{}", r.stdout);
    let report = r.report(&dir);
    let comms: Vec<&str> = report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["comm"].as_str().unwrap())
        .collect();
    assert!(comms.contains(&"sh"), "{comms:?}");
    assert!(
        !comms.contains(&"gputrace"),
        "gputrace traced itself: {comms:?}"
    );
    assert_eq!(
        report["followed"]["processes"], 1,
        "{:#}",
        report["followed"]
    );
}

/// A reader that goes away before the report is printed (`gputrace ... | head`) is not an
/// error: exit 0, nothing on stderr, the files still written.
#[test]
fn a_closed_stdout_is_a_normal_end() {
    let _g = serial();
    if !require_root("a_closed_stdout_is_a_normal_end") {
        return;
    }
    let target = Bg::spawn(Command::new("sleep").arg("30"));
    for json in ["--json", "--top=10"] {
        let dir = out_dir("closed-stdout");
        // `true` exits at once: the report's first write finds the pipe closed.
        let r = run_with_backtraces(Command::new("bash").arg("-c").arg(format!(
            "set -o pipefail; {GPUTRACE} {json} -d 1s -o {} --pid {} | true",
            dir.display(),
            target.pid()
        )));
        assert_eq!(r.code(), 0, "{json}: {}", r.stderr);
        // Nothing but the line that says the trace runs.
        assert!(
            r.stderr
                .lines()
                .all(|l| l.starts_with("gputrace: tracing ")),
            "{json}: {}",
            r.stderr
        );
        assert!(dir.join("report.json").exists(), "{json}");
    }
}

#[test]
fn pid_exits_during_the_trace() {
    let _g = serial();
    if !require_root("pid_exits_during_the_trace") {
        return;
    }
    let spin = build_c("spin", &[]);
    // Long enough to outlast the attach (2.2-2.3 s here in a debug build, as CI's).
    let target = Bg::spawn(Command::new(&spin).arg("6"));
    let pid = target.pid();
    let dir = out_dir("pid-exits");
    let started = Instant::now();
    let mut live = Live::start(&[
        "-v",
        "-d",
        "60s",
        "-o",
        dir.to_str().unwrap(),
        "--pid",
        &pid.to_string(),
    ]);
    live.wait_attached();
    let held = live.held();
    let st = live
        .wait_for(Duration::from_secs(30))
        .expect("gputrace hung");
    assert!(st.success(), "{}", live.stderr());
    assert!(started.elapsed() < Duration::from_secs(20));
    assert!(live.stderr().contains("target exited"), "{}", live.stderr());
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
    assert_eq!(r["window"]["ended_by"], "target-exited");
    let p = r["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pid)
        .expect("the target is in the report");
    assert_eq!(p["exited"], true);
    assert!(p["samples"].as_u64().unwrap() > 0, "{p:#}");
    assert_released(&held, live.pid());
}

/// A target that exits while gputrace attaches: the report says nothing of it was traced,
/// rather than an empty "traced for 0.00s" (and the trace ends at once, exit 0).
#[test]
fn a_pid_gone_before_the_window_opens_is_said_so() {
    let _g = serial();
    if !require_root("a_pid_gone_before_the_window_opens_is_said_so") {
        return;
    }
    // Alive as gputrace checks it, gone long before the attach (~0.3 s, more in debug) ends.
    let mut target = Bg::spawn(Command::new("sleep").arg("0.15"));
    let pid = target.pid();
    let dir = out_dir("pid-gone-early");
    let run = gputrace(&[
        "-d",
        "10s",
        "-o",
        dir.to_str().unwrap(),
        "--pid",
        &pid.to_string(),
    ]);
    let _ = target.0.wait();
    assert_eq!(run.code(), 0, "{}", run.stderr);
    let r = run.report(&dir);
    let warned = r["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|w| w.as_str())
        .any(|w| w.contains(&format!("pid {pid} exited while gputrace attached")));
    assert!(warned, "{:#}", r["warnings"]);
}

#[test]
fn commands_that_cannot_be_executed() {
    let _g = serial();
    if !require_root("commands_that_cannot_be_executed") {
        return;
    }
    let dir = out_dir("bad-commands");
    std::fs::create_dir_all(&dir).unwrap();
    let plain = dir.join("not-executable");
    std::fs::write(&plain, "#!/bin/sh\necho hi\n").unwrap();
    // Executable but not a program the kernel can run: found only when exec is tried, after the
    // probes are loaded; they must be unloaded again.
    let garbage = dir.join("garbage");
    std::fs::write(&garbage, [0x7f, b'E', b'L', b'F', 0, 1, 2, 3]).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::set_permissions(&garbage, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cases = [
        ("definitely-not-a-command-xyz", "not found"),
        ("/nonexistent/dir/cmd", "No such file"),
        (plain.to_str().unwrap(), "not executable"),
        ("/tmp", "is a directory"),
        (garbage.to_str().unwrap(), "Exec format error"),
    ];
    for (cmd, why) in cases {
        let r = run_with_backtraces(Command::new(GPUTRACE).args(["--", cmd, "arg"]));
        assert_one_line(&r, 5, &format!("cannot execute {cmd}: "));
        assert!(
            r.stderr.contains(why),
            "{cmd}: `{why}` expected: {}",
            r.stderr
        );
    }
    assert_no_orphans();
}

#[test]
fn output_directories_that_cannot_be_written() {
    let _g = serial();
    if !require_root("output_directories_that_cannot_be_written") {
        return;
    }
    let base = out_dir("bad-output");
    std::fs::create_dir_all(&base).unwrap();
    let file = base.join("a-file");
    std::fs::write(&file, "x").unwrap();
    let under_file = file.join("sub");
    let ro = Tmpfs::mount("ro-output", "ro,size=64k");
    for (dir, why) in [
        (file.clone(), "exists and is not a directory"),
        (under_file, "a-file is not a directory"),
        (ro.0.clone(), "Read-only file system"),
        (ro.0.join("new"), "Read-only file system"),
    ] {
        let started = Instant::now();
        let r = run_with_backtraces(
            Command::new(GPUTRACE)
                .arg("-o")
                .arg(&dir)
                .args(["--", "sleep", "30"]),
        );
        assert_one_line(&r, 6, "cannot write output directory");
        assert!(
            r.stderr.contains(why),
            "{}: `{why}`: {}",
            dir.display(),
            r.stderr
        );
        // Checked before anything is launched or loaded.
        assert!(started.elapsed() < Duration::from_secs(10));
    }
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "x");
    assert_no_orphans();
}

/// Ctrl-C and SIGTERM: detach, write what was collected, exit 0.
#[test]
fn interrupt_and_terminate_write_what_was_collected() {
    let _g = serial();
    if !require_root("interrupt_and_terminate_write_what_was_collected") {
        return;
    }
    let spin = build_c("spin", &[]);
    for (sig, name) in [
        (libc::SIGINT, "sigint"),
        (libc::SIGTERM, "sigterm"),
        (libc::SIGHUP, "sighup"),
    ] {
        let target = Bg::spawn(Command::new(&spin).arg("30"));
        let dir = out_dir(name);
        let mut live = Live::start(&[
            "-v",
            "-o",
            dir.to_str().unwrap(),
            "--pid",
            &target.pid().to_string(),
        ]);
        live.wait_attached();
        let held = live.held();
        std::thread::sleep(Duration::from_millis(700));
        live.signal(sig);
        let st = live
            .wait_for(Duration::from_secs(20))
            .unwrap_or_else(|| panic!("gputrace did not stop on {name}"));
        assert!(st.success(), "{name}: {st:?}\n{}", live.stderr());
        assert!(live.stderr().contains("interrupted"), "{}", live.stderr());
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap())
                .unwrap();
        assert_eq!(r["window"]["ended_by"], "interrupted");
        assert!(
            r["sampling"]["samples"].as_u64().unwrap() > 10,
            "{name}: {r:#}"
        );
        assert!(dir.join("cpu.svg").exists() && dir.join("cpu.folded").exists());
        assert_released(&held, live.pid());
        // The target goes on: gputrace only observed it.
        assert!(std::path::Path::new(&format!("/proc/{}", target.pid())).exists());
    }
}

/// The on-call's ssh session drops mid-trace: gputrace gets SIGHUP and its stdout and stderr
/// lead nowhere. The trace ends as with SIGTERM, every file is written, and nothing stays.
#[test]
fn a_hang_up_with_dead_outputs_still_writes_the_report() {
    let _g = serial();
    if !require_root("a_hang_up_with_dead_outputs_still_writes_the_report") {
        return;
    }
    let spin = build_c("spin", &[]);
    let target = Bg::spawn(Command::new(&spin).arg("30"));
    let dir = out_dir("hangup");
    let mut child = Command::new(GPUTRACE)
        .args(["-v", "-o", dir.to_str().unwrap(), "--pid"])
        .arg(target.pid().to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start gputrace");
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("attached in") {
        line.clear();
        let n = std::io::BufRead::read_line(&mut err, &mut line).unwrap();
        assert!(n > 0, "gputrace ended before attaching");
    }
    let held = faults::held_by(child.id() as i32);
    std::thread::sleep(Duration::from_millis(500));
    // Both readers gone: every later write fails (EPIPE here, EIO on a hung-up terminal).
    drop(err);
    drop(child.stdout.take());
    unsafe { libc::kill(child.id() as i32, libc::SIGHUP) };
    let st = faults::wait_child(&mut child, Duration::from_secs(30))
        .expect("gputrace did not end after SIGHUP");
    assert!(st.success(), "{st:?}");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
    assert_eq!(r["window"]["ended_by"], "interrupted");
    assert!(r["sampling"]["samples"].as_u64().unwrap() > 10, "{r:#}");
    for f in ["report.html", "trace.json", "cpu.svg"] {
        assert!(dir.join(f).exists(), "{f} missing");
    }
    assert_released(&held, child.id() as i32);
}

/// A kernel that refuses to load our programs (here: a seccomp filter makes every
/// bpf(BPF_PROG_LOAD) fail with EACCES; maps, BTF and perf events still work): exit 7 with one
/// line, the launched command is not left waiting, and nothing of gputrace stays loaded.
#[test]
fn programs_the_kernel_refuses_exit_7() {
    let _g = serial();
    if !require_root("programs_the_kernel_refuses_exit_7") {
        return;
    }
    let deny = build_c("deny_prog_load", &[]);
    let started = Instant::now();
    let run = run_with_backtraces(
        Command::new(&deny)
            .arg(GPUTRACE)
            .args(["-d", "1s", "--", "sleep", "30"]),
    );
    assert_one_line(&run, 7, "loading the eBPF programs failed");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the launched command was left waiting"
    );
    assert_no_orphans();
}

/// A CUDA library named on the command line that is not there is a usage error, said in one
/// line before anything is loaded (it was found only after the eBPF load, exit 1).
#[test]
fn a_named_library_that_is_not_there() {
    let _g = serial();
    if !require_root("a_named_library_that_is_not_there") {
        return;
    }
    for opt in ["--libcudart", "--libcuda"] {
        let r = run_with_backtraces(Command::new(GPUTRACE).args([
            opt,
            "/nonexistent/libcudart.so.12",
            "--",
            "true",
        ]));
        assert_one_line(&r, 2, "/nonexistent/libcudart.so.12: no such file");
        let r = run_with_backtraces(Command::new(GPUTRACE).args([opt, "/tmp", "--", "true"]));
        assert_one_line(&r, 2, "/tmp is not a file");
    }
}

/// A `--pid` target that exits while gputrace loads its programs, its pid taken at once by
/// another process: that process is not traced as the target (it was, with a confident
/// verdict on the wrong program), and the report says what happened.
#[test]
fn a_pid_taken_over_during_the_attach_is_not_traced_as_the_target() {
    let _g = serial();
    if !require_root("a_pid_taken_over_during_the_attach_is_not_traced_as_the_target") {
        return;
    }
    let spin = build_c("spin", &[]);
    let dir = out_dir("pid-taken-over");
    let mut target = Command::new("sleep")
        .arg("30")
        .spawn()
        .expect("spawn sleep");
    let pid = target.id();
    let mut tracer = Command::new(GPUTRACE)
        .args([
            "-d",
            "3s",
            "-o",
            dir.to_str().unwrap(),
            "--pid",
            &pid.to_string(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run gputrace");
    // The target ends once gputrace checked it and is loading its programs (its first BPF
    // object is an fd of its own), long before they are attached.
    let loading = Instant::now();
    let has_bpf_fd = |p: u32| {
        std::fs::read_dir(format!("/proc/{p}/fd")).is_ok_and(|d| {
            d.flatten().any(|e| {
                std::fs::read_link(e.path())
                    .is_ok_and(|l| l.to_string_lossy().starts_with("anon_inode:bpf"))
            })
        })
    };
    while !has_bpf_fd(tracer.id()) {
        assert!(
            loading.elapsed() < Duration::from_secs(30) && tracer.try_wait().unwrap().is_none(),
            "gputrace never loaded its programs"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let _ = target.kill();
    let _ = target.wait();
    // The next pid the kernel hands out is the one after ns_last_pid: retried where another
    // process forked in between.
    let mut newcomer = None;
    for _ in 0..100 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string()).unwrap();
        let mut c = Command::new(&spin)
            .arg("4")
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn spin");
        if c.id() == pid {
            newcomer = Some(c);
            break;
        }
        let _ = c.kill();
        let _ = c.wait();
    }
    let mut newcomer = newcomer.expect("no process could take the target's pid");
    let run = tracer.wait_with_output().expect("wait for gputrace");
    let _ = newcomer.kill();
    let _ = newcomer.wait();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "{stderr}");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
    let warnings = r["warnings"].to_string();
    assert!(
        warnings.contains(&format!("pid {pid} exited while gputrace attached"))
            && warnings.contains("another process's (spin)"),
        "{warnings}"
    );
    let spun: u64 = r["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["comm"] == "spin")
        .map(|p| p["samples"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(spun, 0, "the newcomer was traced: {:#}", r["processes"]);
    assert_eq!(r["window"]["ended_by"], "target-exited");
}
