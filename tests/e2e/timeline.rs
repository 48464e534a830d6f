//! Issue 5, trace.json: the probe families stream off-CPU intervals, long syscalls and CUDA
//! calls onto each traced thread's track. tests/workloads/timeline.c sleeps 20 ms 5 times,
//! waits on a pipe, then calls the fake libcudart's cudaDeviceSynchronize 3 times (20 ms each)
//! and one 4 KiB H2D cudaMemcpy, 10 quick __cudaRegisterFunction calls, one failing
//! cudaLaunchKernel and one successful one.

use std::{collections::BTreeMap, path::PathBuf};

use serde_json::Value;

use crate::common::*;

const SLEEPS: usize = 5;
const SLEEP_MS: f64 = 20.0;
const SYNCS: usize = 3;
const REGS: u64 = 10;

/// The fake runtime and driver, built into a directory of their own (the CUDA tests build
/// theirs elsewhere); the runtime finds the driver through its rpath.
fn fake_cudart() -> PathBuf {
    let dir = tmp_dir().join("timeline_fake_cuda");
    std::fs::create_dir_all(&dir).unwrap();
    let src = repo_root().join("tests/workloads/fake_cuda");
    let rpath = format!("-Wl,-rpath,{}", dir.display());
    for (out, file, extra) in [
        ("libcuda.so.1", "cuda.c", &[][..]),
        ("libcudart.so.12", "cudart.c", &["-ldl", rpath.as_str()][..]),
    ] {
        build_shared_c(&src.join(file), &dir.join(out), extra);
    }
    dir.join("libcudart.so.12")
}

/// Traces the workload; returns trace.json's events and the traced pid.
fn trace(name: &str, extra: &[&str]) -> (Vec<Value>, Value, u64) {
    trace_env(name, extra, &[])
}

/// As [`trace`], gputrace run with environment variables `env`.
fn trace_env(name: &str, extra: &[&str], env: &[(&str, &str)]) -> (Vec<Value>, Value, u64) {
    let lib = fake_cudart();
    let bin = build_c("timeline", &["-ldl"]);
    let dir = out_dir(name);
    let mut args = vec![
        "-o",
        dir.to_str().unwrap(),
        "--libcudart",
        lib.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    // The target dir is on the root disk: O_DIRECT there reaches the block layer.
    let direct = tmp_dir();
    args.extend_from_slice(&[
        "--",
        bin.to_str().unwrap(),
        lib.to_str().unwrap(),
        direct.to_str().unwrap(),
    ]);
    let run = gputrace_env(&args, env);
    assert_eq!(
        run.code(),
        0,
        "stdout:\n{}\nstderr:\n{}",
        run.stdout,
        run.stderr
    );
    let report = run.report(&dir);
    let pid = report["target"]["pids"][0].as_u64().expect("target pid");
    assert_eq!(report["target"]["exit_code"], 0, "the workload failed");
    let text = std::fs::read_to_string(dir.join("trace.json")).expect("trace.json");
    (validate(&text), report, pid)
}

/// The trace-event rules Perfetto relies on: ph/ts/pid/tid everywhere, non-negative times,
/// complete events on one track nest or follow each other.
fn validate(text: &str) -> Vec<Value> {
    let doc: Value = serde_json::from_str(text).expect("trace.json is JSON");
    let evs = doc["traceEvents"].as_array().expect("traceEvents").clone();
    let mut tracks: BTreeMap<(u64, u64), Vec<(f64, f64)>> = BTreeMap::new();
    for e in &evs {
        for k in ["ph", "ts", "pid", "tid", "name"] {
            assert!(e.get(k).is_some(), "event without {k}: {e}");
        }
        assert!(e["ts"].as_f64().unwrap() >= 0.0, "{e}");
        if e["ph"] == "X" {
            let dur = e["dur"].as_f64().expect("X has dur");
            assert!(dur >= 0.0, "negative dur: {e}");
            let key = (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap());
            tracks
                .entry(key)
                .or_default()
                .push((e["ts"].as_f64().unwrap(), dur));
        }
    }
    for (key, mut xs) in tracks {
        xs.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
        let mut open: Vec<f64> = Vec::new();
        for (ts, dur) in xs {
            while open.last().is_some_and(|&end| end <= ts + 1e-6) {
                open.pop();
            }
            if let Some(&end) = open.last() {
                assert!(ts + dur <= end + 1e-6, "overlap without nesting on {key:?}");
            }
            open.push(ts + dur);
        }
    }
    evs
}

/// Complete events of the main thread with this category.
fn slices<'a>(evs: &'a [Value], pid: u64, cat: &str) -> Vec<&'a Value> {
    evs.iter()
        .filter(|e| e["ph"] == "X" && e["pid"] == pid && e["tid"] == pid && e["cat"] == cat)
        .collect()
}

fn ms(e: &Value) -> f64 {
    e["dur"].as_f64().unwrap() / 1000.0
}

#[test]
fn thread_track_has_sleeps_pipe_wait_and_cuda_syncs() {
    let _g = serial();
    if !require_root("thread_track_has_sleeps_pipe_wait_and_cuda_syncs") {
        return;
    }
    let (evs, report, pid) = trace("timeline", &[]);
    check_thread_track(&evs, &report, pid);
}

/// A switch onto a CPU that ran no program (the kernel runs none while the development VM's
/// sandbox agent is current: a switch from one of its threads to a traced one is never seen,
/// which failed the test above ~1 run in 40 beside two CPU hogs). Here every traced thread's
/// switch-in goes unseen (a test hook): the thread's own next syscall closes each wait, so
/// the track and the time are as before, and the report counts the switch-ins it missed.
/// Without the closing, no off-CPU slice at all is drawn.
#[test]
fn unseen_switch_ins_are_closed_by_the_threads_own_syscalls() {
    let _g = serial();
    if !require_root("unseen_switch_ins_are_closed_by_the_threads_own_syscalls") {
        return;
    }
    let (evs, report, pid) = trace_env(
        "timeline_unseen",
        &[],
        &[("GPUTRACE_TEST_UNSEEN_SWITCH_INS", "1")],
    );
    check_thread_track(&evs, &report, pid);
    // At least one per sleep, sync and the pipe wait.
    let unseen = field_of(&report["drops"], "reason", "SwitchInUnseen", "count");
    assert!(unseen > (SLEEPS + SYNCS) as u64, "{}", report["drops"]);
    let thread = report["processes"][0]["threads"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["tid"].as_u64() == Some(pid))
        .expect("the main thread");
    let ns = |cat: &str| -> f64 {
        thread["time"]["reasons"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|x| x["category"] == cat)
            .map(|x| x["ns"].as_f64().unwrap())
            .sum()
    };
    let (sleep, sync) = (ns("sleep") / 1e6, ns("cuda_sync") / 1e6);
    assert!(
        sleep >= SLEEPS as f64 * SLEEP_MS && sleep < SLEEPS as f64 * SLEEP_MS + 30.0,
        "sleep {sleep} ms: {:#}",
        thread["time"]
    );
    assert!(
        sync >= SYNCS as f64 * SLEEP_MS && sync < SYNCS as f64 * SLEEP_MS + 30.0,
        "cuda_sync {sync} ms: {:#}",
        thread["time"]
    );
}

fn check_thread_track(evs: &[Value], report: &Value, pid: u64) {
    let off = slices(evs, pid, "off_cpu");
    let sleeps: Vec<f64> = off
        .iter()
        .filter(|e| e["args"]["category"] == "sleep")
        .map(|e| ms(e))
        .collect();
    assert_eq!(sleeps.len(), SLEEPS, "{off:#?}");
    for d in &sleeps {
        // At least the requested sleep (less a few us between sys_enter and switch-out); the
        // upper bound allows for a busy shared machine.
        assert!(
            *d >= SLEEP_MS - 0.1 && *d < SLEEP_MS + 30.0,
            "sleep of {d} ms: {sleeps:?}"
        );
    }
    let pipe: Vec<&&Value> = off
        .iter()
        .filter(|e| e["args"]["syscall"] == "read")
        .collect();
    assert_eq!(pipe.len(), 1, "{off:#?}");
    // The child writes 30 ms after the fork; the parent may start reading a little late.
    assert!(ms(pipe[0]) >= 10.0, "pipe wait {} ms", ms(pipe[0]));
    // Classified from the kernel stack the accounting walked at switch-out, as in report.json.
    assert_eq!(pipe[0]["args"]["category"], "ipc", "{}", pipe[0]);

    let cuda = slices(evs, pid, "cuda");
    let syncs: Vec<&&Value> = cuda
        .iter()
        .filter(|e| e["name"] == "cudaDeviceSynchronize")
        .collect();
    assert_eq!(syncs.len(), SYNCS, "{cuda:#?}");
    for s in &syncs {
        assert_eq!(s["args"]["category"], "cuda_sync");
        assert_eq!(s["args"]["return"], "cudaSuccess");
        assert!(ms(s) >= SLEEP_MS - 0.1, "{s}");
        // The wait inside the sync is off CPU, charged to the sync, nested in the call.
        let (ts, end) = (
            s["ts"].as_f64().unwrap(),
            s["ts"].as_f64().unwrap() + s["dur"].as_f64().unwrap(),
        );
        assert!(
            off.iter().any(|o| o["args"]["category"] == "cuda_sync"
                && o["ts"].as_f64().unwrap() >= ts
                && o["ts"].as_f64().unwrap() + o["dur"].as_f64().unwrap() <= end),
            "no off-CPU wait inside {s}"
        );
    }
    let copy = cuda
        .iter()
        .find(|e| e["name"] == "cudaMemcpy")
        .expect("every cudaMemcpy is on the timeline, however short");
    assert_eq!(copy["args"]["bytes"], 4096);
    assert_eq!(copy["args"]["direction"], "H2D");
    // Failing calls are always drawn, with the launch's arguments and the error.
    let launch = cuda
        .iter()
        .find(|e| e["name"] == "cudaLaunchKernel")
        .expect("the failing launch");
    assert_eq!(launch["args"]["grid"], "64x2x1");
    assert_eq!(launch["args"]["block"], "128x1x1");
    assert_eq!(launch["args"]["return"], "cudaErrorInvalidDeviceFunction");
    // The successful launch (over 20 us: it loads the driver) names its kernel, from the
    // __cudaRegisterFunction calls, as the report's kernel table does.
    let named = cuda
        .iter()
        .find(|e| e["name"] == "cudaLaunchKernel" && e["args"]["return"] == "cudaSuccess")
        .expect("the first successful launch");
    assert_eq!(named["args"]["kernel"], "tl_kernel", "{named}");
    assert!(named["args"]["handle"].as_str().unwrap().starts_with("0x"));
    // Quick calls outside the always-drawn kinds are counted, not drawn (one the machine
    // slowed past 20 us is drawn).
    let drawn: Vec<f64> = cuda
        .iter()
        .filter(|e| e["name"] == "__cudaRegisterFunction")
        .map(|e| e["dur"].as_f64().unwrap())
        .collect();
    assert!(drawn.iter().all(|us| *us >= 20.0), "{drawn:?}");
    let short = report["timeline"]["cuda_calls_below_threshold"]
        .as_u64()
        .unwrap();
    assert!(
        short + drawn.len() as u64 >= REGS && short > 0,
        "{short} {drawn:?}"
    );

    let sys = slices(evs, pid, "syscall");
    assert!(
        sys.iter()
            .filter(|e| e["name"] == "clock_nanosleep")
            .count()
            >= SLEEPS + SYNCS,
        "{sys:#?}"
    );
    // Block I/O: the process's requests on its block track, reads and writes of the 1 MiB.
    for op in ["read", "write"] {
        let reqs: Vec<&Value> = evs
            .iter()
            .filter(|e| e["cat"] == "block_io" && e["pid"] == pid && e["args"]["op"] == op)
            .collect();
        let bytes: u64 = reqs
            .iter()
            .map(|e| e["args"]["bytes"].as_u64().unwrap())
            .sum();
        // Requests the block layer dispatches from a kernel worker (after a plug flush or a
        // requeue) cannot be tied to the process at completion, so the timeline may miss some;
        // the exact per-process bytes are in report.json's block_io (tested in
        // time_accounting). Here: the process's own requests are drawn, with their fields.
        assert!(
            bytes > 0 && bytes <= 2 << 20,
            "{op}: {bytes} bytes in {reqs:#?}"
        );
        assert!(reqs.iter().all(|e| e["tid"] != pid
            && e["args"]["device"].as_str().unwrap().contains(':')
            && e["args"]["latency_us"].is_u64()));
    }
    let drops = report["drops"].to_string();
    assert!(!drops.contains("TimelineFull"), "{drops}");
    assert_eq!(report["timeline"]["cut_events"], 0);
}

#[test]
fn timeline_threshold_leaves_out_shorter_waits() {
    let _g = serial();
    if !require_root("timeline_threshold_leaves_out_shorter_waits") {
        return;
    }
    // Every wait of the workload is 20-30 ms: none reaches 100 ms.
    let (evs, _, pid) = trace("timeline_threshold", &["--timeline-threshold", "100ms"]);
    for cat in ["off_cpu", "syscall"] {
        let short: Vec<&Value> = slices(&evs, pid, cat)
            .into_iter()
            .filter(|e| ms(e) < 100.0)
            .collect();
        assert!(short.is_empty(), "{cat} under the threshold: {short:#?}");
    }
    // CUDA syncs do not depend on the off-CPU threshold.
    let syncs = slices(&evs, pid, "cuda")
        .into_iter()
        .filter(|e| e["name"] == "cudaDeviceSynchronize")
        .count();
    assert_eq!(syncs, SYNCS);
}

/// A job stopped (SIGSTOP) for the whole trace, and a sleeper whose sleep began before the
/// attach and ends inside the window: each wait is on the thread's track. Neither was (the
/// stop has no switch-out or switch-in in the window; the seeded sleep no switch-out), so a
/// hung or stopped job, the one being looked at, had an empty timeline.
#[test]
fn waits_under_way_at_the_attach_or_the_end_are_drawn() {
    use std::process::{Command, Stdio};
    let _g = serial();
    if !require_root("waits_under_way_at_the_attach_or_the_end_are_drawn") {
        return;
    }
    let spin = build_c("spin", &[]);
    let mut stopped = Command::new(&spin)
        .arg("30")
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn spin");
    unsafe { libc::kill(stopped.id() as i32, libc::SIGSTOP) };
    let mut sleeper = Command::new("sleep")
        .arg("1.5")
        .spawn()
        .expect("spawn sleep");
    let (sp, sl) = (stopped.id(), sleeper.id());
    let dir = out_dir("timeline-open-waits");
    let run = gputrace(&[
        "-d",
        "3s",
        "-o",
        dir.to_str().unwrap(),
        "--pid",
        &sp.to_string(),
        "--pid",
        &sl.to_string(),
    ]);
    unsafe { libc::kill(sp as i32, libc::SIGCONT) };
    let _ = stopped.kill();
    let _ = stopped.wait();
    let _ = sleeper.wait();
    assert_eq!(run.code(), 0, "{}", run.stderr);
    let text = std::fs::read_to_string(dir.join("trace.json")).expect("trace.json");
    let evs = validate(&text);
    let off = |pid: u32| -> Vec<&Value> {
        evs.iter()
            .filter(|e| e["cat"] == "off_cpu" && e["pid"] == pid)
            .collect()
    };
    let window_us = run.report(&dir)["window"]["duration_ns"].as_f64().unwrap() / 1e3;
    let stop: f64 = off(sp)
        .iter()
        .filter(|e| e["name"].as_str().unwrap().contains("stopped"))
        .map(|e| e["dur"].as_f64().unwrap())
        .sum();
    assert!(
        stop > 0.9 * window_us && stop <= window_us * 1.01,
        "stopped {stop} us of a {window_us} us window: {:#?}",
        off(sp)
    );
    // The sleep began ~0.3 s before the window and ends ~1.2 s into it.
    let slept: Vec<&Value> = off(sl)
        .into_iter()
        .filter(|e| e["name"].as_str().unwrap().starts_with("sleep"))
        .collect();
    assert!(
        slept.iter().any(|e| e["ts"].as_f64().unwrap() < 50_000.0
            && e["dur"].as_f64().unwrap() > 500_000.0),
        "{:#?}",
        off(sl)
    );
}

/// A fast run of pipe reads (a byte every ~60 µs) is timed 1 call in 8, and the few reads
/// that waited 60 ms for a stalled writer must not be missed 7 times in 8: an untimed call
/// that left the CPU reads the clock at its exit, and its wait is drawn on the timeline and
/// counted in the read's max (not in its estimated sums).
#[test]
fn the_slow_calls_of_a_fast_run_are_drawn_though_untimed() {
    let _g = serial();
    if !require_root("the_slow_calls_of_a_fast_run_are_drawn_though_untimed") {
        return;
    }
    const PAUSES: usize = 5;
    let bin = build_c("pipe_pauses", &[]);
    let dir = out_dir("pipe-pauses");
    let run = gputrace(&[
        "-o",
        dir.to_str().unwrap(),
        "--",
        bin.to_str().unwrap(),
        &PAUSES.to_string(),
    ]);
    assert_eq!(run.code(), 0, "{}", run.stderr);
    let report = run.report(&dir);
    let pid = report["target"]["pids"][0].as_u64().unwrap();
    let reader = report["processes"][0]["threads"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["tid"] == pid)
        .cloned()
        .expect("the reader");
    let read = reader["syscalls"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "read")
        .cloned()
        .unwrap_or_else(|| panic!("no read row: {reader:#}"));
    let count = read["count"].as_u64().unwrap();
    let timed = read["timed"].as_u64().unwrap_or(count);
    // Sampled: most of the reads went untimed, the slow ones among them.
    assert!(timed * 2 < count, "{read:#}");
    assert!(read["max_ns"].as_u64().unwrap() >= 50_000_000, "{read:#}");
    let text = std::fs::read_to_string(dir.join("trace.json")).unwrap();
    let evs = validate(&text);
    let slow: Vec<f64> = slices(&evs, pid, "syscall")
        .into_iter()
        .filter(|e| e["name"] == "read")
        .map(ms)
        .filter(|ms| *ms >= 50.0)
        .collect();
    // Each pause, and perhaps a read the host's load kept waiting as long.
    assert!(slow.len() >= PAUSES, "{slow:?}\n{read:#}");
}
