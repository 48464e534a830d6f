//! CUDA tracing against fake libcudart/libcuda/libnvidia-ml built from tests/workloads/fake_cuda
//! (real symbol names, `push %rbp` prologues) and against the real libcudart.so.12.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::Mutex,
};

use serde_json::Value;

use crate::common::{
    self, gputrace, out_dir, repo_root, require_root, serial, tmp_dir, Run, GPUTRACE,
};

/// Builds the fake libraries and the workload once; returns their directory.
pub(crate) fn fake_cuda() -> PathBuf {
    static BUILT: Mutex<bool> = Mutex::new(false);
    let dir = tmp_dir().join("fake_cuda");
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if *built {
        return dir;
    }
    std::fs::create_dir_all(&dir).unwrap();
    let src = repo_root().join("tests/workloads/fake_cuda");
    let rpath = format!("-Wl,-rpath,{}", dir.display());
    // -O0: every function keeps its `push %rbp` prologue (at -O1 gcc drops it in leaf
    // functions), like the real library's exported functions.
    let cc = |out: &str, args: &[&str]| {
        let st = Command::new("gcc")
            .args(["-O0", "-g", "-fno-omit-frame-pointer", "-o"])
            .arg(dir.join(out))
            .args(args)
            .status()
            .expect("run gcc");
        assert!(st.success(), "gcc failed building {out}");
    };
    let s = |n: &str| src.join(n).display().to_string();
    cc("libcuda.so.1", &["-shared", "-fPIC", &s("cuda.c")]);
    cc(
        "libcudart.so.12",
        &["-shared", "-fPIC", &s("cudart.c"), "-ldl", &rpath],
    );
    cc("libnvidia-ml.so.1", &["-shared", "-fPIC", &s("nvml.c")]);
    let cudart = dir.join("libcudart.so.12").display().to_string();
    cc("workload", &[&s("workload.c"), &cudart, "-ldl", &rpath]);
    // The runtime linked into the executable, as nvcc's default `-cudart static` does.
    cc(
        "workload_static",
        &[&s("workload.c"), &s("cudart.c"), "-ldl", &rpath],
    );
    *built = true;
    dir
}

fn run_traced(args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = Command::new(GPUTRACE);
    cmd.args(args).stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let output = cmd.output().expect("run gputrace");
    Run {
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        output,
    }
}

pub(crate) fn cuda_of(report: &Value, comm: &str) -> Value {
    report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["comm"] == comm && !p["cuda"].is_null())
        .unwrap_or_else(|| panic!("no process {comm} with a CUDA section in {report:#}"))["cuda"]
        .clone()
}

fn api<'a>(cuda: &'a Value, function: &str) -> Option<&'a Value> {
    cuda["api"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["function"] == function)
}

pub(crate) fn count(cuda: &Value, function: &str) -> u64 {
    api(cuda, function).map_or(0, |a| a["count"].as_u64().unwrap())
}

/// (code, count) of a function's errors.
fn errors(cuda: &Value, function: &str) -> Vec<(i64, u64)> {
    api(cuda, function)
        .map(|a| {
            a["errors"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| (e["code"].as_i64().unwrap(), e["count"].as_u64().unwrap()))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn fake_cuda_calls_are_counted_exactly() {
    let _g = serial();
    if !require_root("fake_cuda_calls_are_counted_exactly") {
        return;
    }
    let run = counted_exactly("cuda-fake", &[]);
    // Linux 6.6+ has uprobe_multi links, and this one is what the tests run on: the default
    // path must be the one taken.
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    if gputrace::check::parse_kernel_release(release.trim()) >= Some((6, 6)) {
        assert!(
            run.stderr.contains("uprobes on uprobe_multi links"),
            "{}",
            run.stderr
        );
    }
}

/// A library comes in while the trace runs and is called at once: the kernel reports the
/// executable mapping and the probes go on within milliseconds, not at the next scan of the
/// maps (every 0.5 s), so the calls 50 ms after the loader mapped the runtime and `dlopen`
/// mapped the driver are all counted. Before that a process calling 50 ms after its start had
/// no CUDA figures at all; on an H100 a 1M-launch storm lost its first ~21,000 launches.
#[test]
fn calls_right_after_a_library_loads_are_counted_exactly() {
    let _g = serial();
    if !require_root("calls_right_after_a_library_loads_are_counted_exactly") {
        return;
    }
    let run = counted_exactly_after("cuda-fake-at-once", &[], 50);
    for lib in ["libcudart.so.12", "libcuda.so.1"] {
        assert!(
            run.stderr
                .lines()
                .any(|l| l.contains("gputrace: probes on") && l.contains(lib)),
            "{lib} was not probed on its mapping:\n{}",
            run.stderr
        );
    }
}

/// The same calls through aya's perf-event links, the path of kernels without uprobe_multi.
#[test]
fn fake_cuda_calls_are_counted_exactly_on_perf_links() {
    let _g = serial();
    if !require_root("fake_cuda_calls_are_counted_exactly_on_perf_links") {
        return;
    }
    let run = counted_exactly("cuda-fake-perf", &[("GPUTRACE_UPROBE_MULTI", "0")]);
    assert!(
        run.stderr.contains("uprobes on perf-event links"),
        "{}",
        run.stderr
    );
}

/// `--cuda-entry-only` counts every probed entry, nested ones included (no return probe tells
/// the levels apart). A thread with an accounting state sums its calls of one function in that
/// state, written out when it calls another function and when it dies (what a live thread still
/// holds at the end is added by user space: `add_held_calls`' unit test). The workload goes
/// back and forth between functions, so most of its calls pass through a write-out here.
#[test]
fn fake_cuda_entries_are_counted_exactly() {
    let _g = serial();
    if !require_root("fake_cuda_entries_are_counted_exactly") {
        return;
    }
    let dir = fake_cuda();
    let out = common::out_dir("cuda-fake-entry");
    let workload = dir.join("workload").display().to_string();
    let run = run_traced(
        &[
            "--cuda-entry-only",
            "--max-overhead",
            "100%",
            "-o",
            out.to_str().unwrap(),
            "--",
            &workload,
            "1500",
        ],
        &[(nvml_env(), "/nonexistent/libnvidia-ml.so.1")],
    );
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr);
    let c = cuda_of(&run.report(&out), "workload");
    // 153 direct runtime launches and the 7 that cudaLaunchKernelExC makes inside the runtime;
    // every runtime launch enters cuLaunchKernel, beside the 25 direct driver launches.
    assert_eq!(count(&c, "cudaLaunchKernel"), 160);
    assert_eq!(count(&c, "cudaLaunchKernelExC"), 7);
    assert_eq!(count(&c, "cuLaunchKernel"), 182);
    assert_eq!(count(&c, "cudaMalloc"), 4);
    assert_eq!(count(&c, "cuMemAlloc_v2"), 4, "nested in cudaMalloc");
    assert_eq!(count(&c, "cudaMemcpy"), 17);
    assert_eq!(count(&c, "cudaDeviceSynchronize"), 5);
    // Per thread, the same sums.
    let threads = c["threads"].as_array().unwrap();
    let launches: u64 = threads
        .iter()
        .flat_map(|t| t["api"].as_array().unwrap())
        .filter(|a| a["function"] == "cudaLaunchKernel")
        .map(|a| a["count"].as_u64().unwrap())
        .sum();
    assert_eq!(launches, 160);
}

fn counted_exactly(name: &str, env: &[(&str, &str)]) -> Run {
    // The workload waits 1.5 s before its first call, so even the periodic scan of the maps
    // (every 0.5 s) has found both libraries by then.
    counted_exactly_after(name, env, 1500)
}

/// The workload's calls begin `delay_ms` after it loaded both libraries.
fn counted_exactly_after(name: &str, env: &[(&str, &str)], delay_ms: u32) -> Run {
    let dir = fake_cuda();
    let out = common::out_dir(name);
    let workload = dir.join("workload").display().to_string();
    let mut env = env.to_vec();
    env.push((nvml_env(), "/nonexistent/libnvidia-ml.so.1"));
    let delay = delay_ms.to_string();
    let run = run_traced(
        &["-v", "-o", out.to_str().unwrap(), "--", &workload, &delay],
        &env,
    );
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr);
    assert!(run.stdout.contains("workload done"), "{}", run.stdout);
    let report = run.report(&out);
    let c = cuda_of(&report, "workload");

    let kinds: Vec<&str> = c["libraries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["kind"].as_str().unwrap())
        .collect();
    assert!(
        kinds.contains(&"runtime") && kinds.contains(&"driver"),
        "{kinds:?}"
    );

    // Runtime launches: 100 + 50 + 3 failing; the 7 ExC launches call cudaLaunchKernel inside
    // the runtime, and every runtime launch calls cuLaunchKernel through a pointer: each is
    // counted once, at the outermost call.
    assert_eq!(count(&c, "cudaLaunchKernel"), 153);
    assert_eq!(errors(&c, "cudaLaunchKernel"), vec![(98, 3)]);
    assert_eq!(count(&c, "cudaLaunchKernelExC"), 7);
    assert_eq!(
        count(&c, "cuLaunchKernel"),
        25,
        "only the direct driver launches"
    );
    assert_eq!(errors(&c, "cuLaunchKernel"), vec![(400, 1)]);
    assert_eq!(count(&c, "cuMemAlloc_v2"), 0, "nested in cudaMalloc");
    assert_eq!(count(&c, "cudaMalloc"), 4);
    assert_eq!(count(&c, "cudaFree"), 2);
    assert_eq!(count(&c, "cudaMemcpy"), 17);
    assert_eq!(errors(&c, "cudaMemcpy"), vec![(21, 2)]);
    let err_name = &api(&c, "cudaMemcpy").unwrap()["errors"][0]["name"];
    assert_eq!(err_name, "cudaErrorInvalidMemcpyDirection");
    assert_eq!(count(&c, "cudaMemcpyAsync"), 4);
    assert_eq!(count(&c, "cudaMemcpy2D"), 1);
    assert_eq!(count(&c, "cudaMemcpy3D"), 1);
    assert_eq!(count(&c, "cuMemcpyHtoD_v2"), 3);
    assert_eq!(count(&c, "cuModuleGetFunction"), 1);
    assert_eq!(count(&c, "__cudaRegisterFunction"), 1);

    // Syncs sleep 20 ms (device) and 10 ms (stream).
    let sync = api(&c, "cudaDeviceSynchronize").unwrap();
    assert_eq!(sync["count"], 5);
    assert!(sync["min_ns"].as_u64().unwrap() >= 20_000_000, "{sync}");
    assert!(sync["total_ns"].as_u64().unwrap() >= 100_000_000, "{sync}");
    let hist: u64 = sync["hist_log2_ns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(hist, 5);
    let ssync = api(&c, "cudaStreamSynchronize").unwrap();
    assert_eq!(ssync["count"], 2);
    assert!(ssync["min_ns"].as_u64().unwrap() >= 10_000_000);
    // The thread's wall time in syncs is the calls' own time: the time sums and the call
    // timings share their entry and return instants, though the thread slept (was switched
    // out and in) inside every sync and its time in one call site is held across switches.
    let sync_calls: u64 = c["api"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["function"].as_str().unwrap().contains("Synchronize"))
        .map(|a| a["total_ns"].as_u64().unwrap())
        .sum();
    let sync_wall: u64 = report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["comm"] == "workload")
        .flat_map(|p| p["threads"].as_array().unwrap())
        .flat_map(|t| t["time"]["categories"].as_array().unwrap())
        .filter(|k| k["category"] == "cuda_sync")
        .map(|k| k["ns"].as_u64().unwrap())
        .sum();
    assert!(
        sync_calls >= 120_000_000 && sync_wall.abs_diff(sync_calls) <= sync_calls / 100,
        "cuda_sync wall time {sync_wall} ns, sync calls {sync_calls} ns"
    );

    // Copies: H2D = 10 x 1 MiB + 2D 64 x 32 + 3 x 1000 (driver); D2H 5 x 4096 + 3D 16 x 8 x 4;
    // D2D async 4 x 512.
    let copy = |dir: &str, mode: &str| -> (u64, u64) {
        c["copies"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["direction"] == dir && x["mode"] == mode)
            .map(|x| (x["count"].as_u64().unwrap(), x["bytes"].as_u64().unwrap()))
            .unwrap_or((0, 0))
    };
    assert_eq!(copy("H2D", "sync"), (14, 10 * 1048576 + 64 * 32 + 3 * 1000));
    assert_eq!(copy("D2H", "sync"), (6, 5 * 4096 + 16 * 8 * 4));
    assert_eq!(copy("D2D", "async"), (4, 4 * 512));
    assert_eq!(
        c["copies"].as_array().unwrap().len(),
        3,
        "{:#}",
        c["copies"]
    );

    // Kernels: named by symbolising the host stub, by __cudaRegisterFunction, by
    // cuModuleGetFunction, and by cuLibraryGetKernel through cuKernelGetFunction's alias.
    let kernel = |name: &str| -> Value {
        c["kernels"]
            .as_array()
            .unwrap()
            .iter()
            .find(|k| k["name"] == name)
            .unwrap_or_else(|| panic!("no kernel {name} in {:#}", c["kernels"]))
            .clone()
    };
    let va = kernel("vectorAdd(float const*, float const*, float*, int)");
    assert_eq!(va["launches"], 107);
    assert_eq!(va["grid"], serde_json::json!([256, 1, 1]));
    assert_eq!(va["block"], serde_json::json!([128, 1, 1]));
    let sc = kernel("scale(float*, int, float)");
    assert_eq!(sc["launches"], 50);
    assert_eq!(sc["grid"], serde_json::json!([64, 2, 1]));
    assert_eq!(sc["block"], serde_json::json!([32, 4, 1]));
    let rd = kernel("reduce(int*, int)");
    assert_eq!(rd["launches"], 20);
    assert_eq!(rd["block"], serde_json::json!([256, 1, 1]));
    assert_eq!(kernel("softmax(float*)")["launches"], 4);
    assert_eq!(
        kernel("softmax(float*)")["grid"],
        serde_json::json!([2, 2, 2])
    );
    assert_eq!(c["kernels"].as_array().unwrap().len(), 4);

    // Memory: 1+2+3+4 MiB allocated, 1 and 3 freed.
    let m = &c["memory"];
    assert_eq!(m["allocs"], 4);
    assert_eq!(m["frees"], 2);
    assert_eq!(m["alloc_bytes"], 10 << 20);
    assert_eq!(m["peak_live_bytes"], 10 << 20);
    assert_eq!(m["live_bytes_at_end"], 6 << 20);
    let leaked: Vec<u64> = m["never_freed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["bytes"].as_u64().unwrap())
        .collect();
    assert_eq!(leaked, vec![4 << 20, 2 << 20]);

    // One thread made every call.
    let threads = c["threads"].as_array().unwrap();
    assert_eq!(threads.len(), 1, "{threads:#?}");
    assert_eq!(
        common::sum_of(&threads[0]["api"], "count"),
        common::sum_of(&c["api"], "count")
    );

    assert!(run.stdout.contains("CUDA calls"), "{}", run.stdout);
    assert!(run.stdout.contains("vectorAdd"), "{}", run.stdout);
    // Nothing of the CUDA data lost. (A stack the stack map could not take costs a sample or a
    // wait its stack, not a CUDA count; those drops are counted and shown on their own, as are
    // runs of other programs the kernel skipped and switch-ins closed late.)
    assert!(
        report["drops"].as_array().unwrap().iter().all(|d| {
            let reason = d["reason"].as_str().unwrap_or("");
            reason.starts_with("Stack")
                || reason.ends_with("StackCollision")
                || reason == "SwitchInUnseen"
                || (reason == "KernelSkipped"
                    && !d["programs"].as_str().unwrap_or("").starts_with("cuda"))
        }),
        "{}",
        report["drops"]
    );
    run
}

#[test]
fn runtime_linked_into_the_executable_is_found_and_probed() {
    let _g = serial();
    if !require_root("runtime_linked_into_the_executable_is_found_and_probed") {
        return;
    }
    let dir = fake_cuda();
    let out = common::out_dir("cuda-static");
    let workload = dir.join("workload_static").display().to_string();
    let run = run_traced(
        &["-o", out.to_str().unwrap(), "--", &workload, "1500"],
        &[(nvml_env(), "/nonexistent/libnvidia-ml.so.1")],
    );
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr);
    let report = run.report(&out);
    let c = cuda_of(&report, "workload_static");
    let runtime = c["libraries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["kind"] == "runtime")
        .unwrap_or_else(|| panic!("no runtime found: {:#}", c["libraries"]));
    assert!(runtime["path"]
        .as_str()
        .unwrap()
        .ends_with("/workload_static"));
    assert_eq!(count(&c, "cudaLaunchKernel"), 153);
    assert_eq!(count(&c, "cuLaunchKernel"), 25);
    assert_eq!(count(&c, "cudaMalloc"), 4);
    let spots = report["blind_spots"].as_array().unwrap();
    assert!(
        spots
            .iter()
            .any(|s| s.as_str().unwrap().contains("carries its own CUDA runtime")),
        "{spots:#?}"
    );
}

#[test]
fn running_process_is_traced_by_pid() {
    let _g = serial();
    if !require_root("running_process_is_traced_by_pid") {
        return;
    }
    let dir = fake_cuda();
    // Started first: its libraries are already mapped when gputrace attaches.
    let mut child = Command::new(dir.join("workload"))
        // Its calls start after this many ms: past the attach (1.2-2 s under CI load).
        .arg("5000")
        .stdout(Stdio::null())
        .spawn()
        .expect("start the workload");
    let pid = child.id().to_string();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let out = common::out_dir("cuda-pid");
    let run = run_traced(
        &["-o", out.to_str().unwrap(), "--pid", &pid],
        &[(nvml_env(), "/nonexistent/libnvidia-ml.so.1")],
    );
    let status = child.wait().unwrap();
    assert!(status.success());
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr);
    let report = run.report(&out);
    let c = cuda_of(&report, "workload");
    assert_eq!(count(&c, "cudaLaunchKernel"), 153);
    assert_eq!(count(&c, "cuLaunchKernel"), 25);
    assert_eq!(count(&c, "cudaMemcpy"), 17);
    assert_eq!(c["memory"]["allocs"], 4);
}

/// A runtime launch entered before its entry probe went on, and held inside the runtime until
/// the driver's launch probe was on (a launch preempted there while a budget window opens, or
/// while gputrace attaches): its driver launch is nested in it, not a direct driver launch. It
/// counted as one `cuLaunchKernel` before the entry program looked at where the driver's
/// launch was called from (a CI run under CPU load failed on it).
#[test]
fn a_runtime_launch_entered_before_its_probe_is_no_driver_launch() {
    let _g = serial();
    if !require_root("a_runtime_launch_entered_before_its_probe_is_no_driver_launch") {
        return;
    }
    // With every probe on, and with the launch probes in the budget's windows (the first one
    // opens at the attach and stays open: the job launches nothing meanwhile).
    for budget in ["100%", "2%"] {
        held_launch_is_no_driver_launch(budget);
    }
}

fn held_launch_is_no_driver_launch(budget: &str) {
    let dir = fake_cuda();
    let hold = tmp_dir().join("cudart-hold");
    std::fs::write(&hold, b"").unwrap();
    let mut child = Command::new(dir.join("workload"))
        .args(["--held", "40"])
        .env("FAKE_CUDART_HOLD", &hold)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the workload");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "held");
    let pid = child.id().to_string();
    let out = common::out_dir("cuda-held");
    let mut live = crate::faults::Live::start(&[
        "-v",
        "--max-overhead",
        budget,
        "-o",
        out.to_str().unwrap(),
        "--pid",
        &pid,
    ]);
    live.wait_attached();
    std::fs::remove_file(&hold).unwrap();
    let status = crate::faults::wait_child(&mut child, std::time::Duration::from_secs(30));
    assert!(status.is_some_and(|s| s.success()), "the workload failed");
    let code = live.wait_for(std::time::Duration::from_secs(30));
    assert_eq!(
        code.and_then(|c| c.code()),
        Some(0),
        "stderr:\n{}",
        live.stderr()
    );
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    let c = cuda_of(&report, "workload");
    // The held launch's runtime call was not seen, so it is not counted at all; the 40 after
    // it are, each once.
    assert_eq!(count(&c, "cudaLaunchKernel"), 40, "at {budget}: {c:#}");
    assert_eq!(count(&c, "cuLaunchKernel"), 0, "at {budget}: {c:#}");
    // The held launch did reach the driver's probe: 40 runtime launches with their driver
    // launches inside, and the held driver launch.
    let entries = common::field_of(
        &report["overhead"]["programs"],
        "program",
        "cuda_entry",
        "hits",
    );
    assert_eq!(
        entries, 81,
        "at {budget}: {:#}",
        report["overhead"]["programs"]
    );
}

/// A library whose path no longer leads to the mapped file (replaced on disk after loading; the
/// same happens for a file in another mount namespace) is probed through /proc/PID/map_files.
#[test]
fn replaced_library_is_probed_through_map_files() {
    let _g = serial();
    if !require_root("replaced_library_is_probed_through_map_files") {
        return;
    }
    let fake = fake_cuda();
    let dir = tmp_dir().join("fake_cuda_replaced");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["libcudart.so.12", "libcuda.so.1"] {
        std::fs::copy(fake.join(f), dir.join(f)).unwrap();
    }
    let st = Command::new("gcc")
        .args(["-O0", "-g", "-fno-omit-frame-pointer", "-o"])
        .arg(dir.join("workload"))
        .arg(repo_root().join("tests/workloads/fake_cuda/workload.c"))
        .arg(dir.join("libcudart.so.12"))
        .arg("-ldl")
        .arg(format!("-Wl,-rpath,{}", dir.display()))
        .status()
        .unwrap();
    assert!(st.success());
    let mut child = Command::new(dir.join("workload"))
        // Its calls start after this many ms: past the attach (1.2-2 s under CI load).
        .arg("5000")
        .stdout(Stdio::null())
        .spawn()
        .expect("start the workload");
    std::thread::sleep(std::time::Duration::from_millis(300));
    // Another file renamed over the path: the process keeps the old, now deleted, inode.
    std::fs::copy(fake.join("libcuda.so.1"), dir.join("replacement.tmp")).unwrap();
    std::fs::rename(dir.join("replacement.tmp"), dir.join("libcudart.so.12")).unwrap();
    let out = common::out_dir("cuda-replaced");
    let pid = child.id().to_string();
    let run = run_traced(
        &["-o", out.to_str().unwrap(), "--pid", &pid],
        &[(nvml_env(), "/nonexistent/libnvidia-ml.so.1")],
    );
    assert!(child.wait().unwrap().success());
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr);
    let report = run.report(&out);
    let c = cuda_of(&report, "workload");
    let runtime = c["libraries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["kind"] == "runtime")
        .unwrap_or_else(|| panic!("{:#}", c["libraries"]));
    assert!(
        runtime["path"].as_str().unwrap().ends_with("(deleted)"),
        "{runtime}"
    );
    assert_eq!(count(&c, "cudaLaunchKernel"), 153);
    assert_eq!(count(&c, "cudaMalloc"), 4);
}

/// `--libcudart`/`--libcuda` attach before the command starts, so calls made from its first
/// instruction are counted, and a symlinked path is the same library as the mapped one.
#[test]
fn named_libraries_are_probed_from_the_start() {
    let _g = serial();
    if !require_root("named_libraries_are_probed_from_the_start") {
        return;
    }
    let dir = fake_cuda();
    let link = tmp_dir().join("libcudart.so");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(dir.join("libcudart.so.12"), &link).unwrap();
    let out = common::out_dir("cuda-named");
    let workload = dir.join("workload").display().to_string();
    let libcuda = dir.join("libcuda.so.1").display().to_string();
    let run = run_traced(
        &[
            "-o",
            out.to_str().unwrap(),
            "--libcudart",
            link.to_str().unwrap(),
            "--libcuda",
            &libcuda,
            "--",
            &workload,
            "0",
        ],
        &[(nvml_env(), "/nonexistent/libnvidia-ml.so.1")],
    );
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr);
    let report = run.report(&out);
    let c = cuda_of(&report, "workload");
    let runtimes = c["libraries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["kind"] == "runtime")
        .count();
    assert_eq!(runtimes, 1, "{:#}", c["libraries"]);
    assert_eq!(count(&c, "cudaLaunchKernel"), 153);
    assert_eq!(count(&c, "cuLaunchKernel"), 25);
    assert_eq!(count(&c, "__cudaRegisterFunction"), 1);
}

fn nvml_env() -> &'static str {
    "GPUTRACE_NVML_LIB"
}

fn real_libcudart() -> PathBuf {
    let p = repo_root().join("target/test-deps/nvidia/cuda_runtime/lib/libcudart.so.12");
    assert!(
        p.is_file(),
        "{} is missing: run `cargo xtask setup` (it fetches the nvidia-cuda-runtime-cu12 wheel)",
        p.display()
    );
    p
}

const CTYPES_SCRIPT: &str = r#"
import ctypes, sys, time
time.sleep(1.0)                      # gputrace is attached before the runtime is loaded
lib = ctypes.CDLL(sys.argv[1])
time.sleep(1.5)                      # discovery runs every 0.5 s
class dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]
p = ctypes.c_void_p()
codes = []
def alloc():
    codes.append(lib.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(1 << 20)))
def copy():
    codes.append(lib.cudaMemcpy(ctypes.byref(p), ctypes.byref(p), ctypes.c_size_t(8), 1))
def launch():
    codes.append(lib.cudaLaunchKernel(ctypes.c_void_p(0x1234), dim3(1, 1, 1), dim3(32, 1, 1),
                                      None, ctypes.c_size_t(0), None))
def train_step():
    codes.append(lib.cudaDeviceSynchronize())
for _ in range(3):
    alloc()
for _ in range(2):
    copy()
for _ in range(4):
    launch()
train_step()
print("codes", codes, flush=True)
time.sleep(0.5)                      # Python stacks are named while the process lives (100 ms ticks)
"#;

#[test]
fn real_libcudart_loaded_after_attach_is_counted_with_error_35() {
    let _g = serial();
    if !require_root("real_libcudart_loaded_after_attach_is_counted_with_error_35") {
        return;
    }
    let lib = real_libcudart();
    let script = tmp_dir().join("cudart_ctypes.py");
    std::fs::write(&script, CTYPES_SCRIPT).unwrap();
    let out = common::out_dir("cuda-real");
    let run = run_traced(
        &[
            "-o",
            out.to_str().unwrap(),
            "--",
            "python3",
            script.to_str().unwrap(),
            lib.to_str().unwrap(),
        ],
        &[(nvml_env(), "/nonexistent/libnvidia-ml.so.1")],
    );
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr);
    // Without a GPU driver every call fails with cudaErrorInsufficientDriver.
    assert!(
        run.stdout
            .contains("codes [35, 35, 35, 35, 35, 35, 35, 35, 35, 35]"),
        "{}",
        run.stdout
    );
    let report = run.report(&out);
    let c = cuda_of(&report, "python3");
    let lib_entry = c["libraries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["kind"] == "runtime")
        .unwrap_or_else(|| panic!("runtime not found: {:#}", c["libraries"]));
    assert!(lib_entry["path"]
        .as_str()
        .unwrap()
        .ends_with("libcudart.so.12"));
    assert!(
        lib_entry["failed"].as_array().unwrap().is_empty(),
        "{lib_entry}"
    );
    for (f, n) in [
        ("cudaMalloc", 3),
        ("cudaMemcpy", 2),
        ("cudaLaunchKernel", 4),
        ("cudaDeviceSynchronize", 1),
    ] {
        assert_eq!(count(&c, f), n, "{f}: {:#}", c["api"]);
        assert_eq!(errors(&c, f), vec![(35, n)], "{f}");
        assert_eq!(
            api(&c, f).unwrap()["errors"][0]["name"],
            "cudaErrorInsufficientDriver"
        );
    }
    // Failed launches and copies are not kernels or bytes.
    assert!(c["kernels"].as_array().unwrap().is_empty());
    assert!(c["copies"].as_array().unwrap().is_empty());
    // Each call's time is charged to the Python line that made it (issue 7).
    let script_lines: Vec<&str> = CTYPES_SCRIPT.lines().collect();
    let line_of = |needle: &str| {
        1 + script_lines
            .iter()
            .position(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("{needle} not in the script"))
    };
    let sites: Vec<&Value> = report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["threads"].as_array().unwrap())
        .flat_map(|t| t["python_sites"].as_array().into_iter().flatten())
        .collect();
    for (category, call, func, needle) in [
        ("cuda_malloc", "cudaMalloc", "alloc", "lib.cudaMalloc"),
        ("cuda_memcpy", "cudaMemcpy", "copy", "lib.cudaMemcpy"),
        (
            "cuda_launch",
            "cudaLaunchKernel",
            "launch",
            "lib.cudaLaunchKernel",
        ),
        (
            "cuda_sync",
            "cudaDeviceSynchronize",
            "train_step",
            "lib.cudaDeviceSynchronize",
        ),
    ] {
        let frame = format!("{func} (cudart_ctypes.py:{})", line_of(needle));
        assert!(
            sites.iter().any(|s| s["category"] == category
                && s["call"] == call
                && s["frame"] == frame.as_str()
                && s["ns"].as_u64().unwrap() > 0),
            "{call} not charged to {frame}: {sites:#?}\nwarnings {:#}\nblind spots {:#}\n\
             drops {:#}\ntop_python {:#}",
            report["warnings"],
            report["blind_spots"],
            report["drops"],
            report["processes"][0]["top_python"]
        );
    }
    let wall = std::fs::read_to_string(out.join("wall.folded")).unwrap_or_else(|_| {
        std::fs::read_to_string(out.join("offcpu.folded")).expect("offcpu.folded")
    });
    assert!(
        wall.lines().any(|l| l.contains(";[cuda_sync];")
            && l.contains(&format!(
                "train_step (cudart_ctypes.py:{})",
                line_of("lib.cudaDeviceSynchronize")
            ))
            && l.contains("cudaDeviceSynchronize")),
        "no cuda_sync stack under its Python line:\n{wall}"
    );
}

fn trace_sleep(env_lib: &Path, name: &str) -> (Run, Value) {
    let out = common::out_dir(name);
    let run = run_traced(
        &[
            "--nvml-interval",
            "50ms",
            "-o",
            out.to_str().unwrap(),
            "--",
            "sleep",
            "0.6",
        ],
        &[(nvml_env(), env_lib.to_str().unwrap())],
    );
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr);
    let report = run.report(&out);
    (run, report)
}

#[test]
fn nvml_fake_library_is_sampled() {
    let _g = serial();
    if !require_root("nvml_fake_library_is_sampled") {
        return;
    }
    let dir = fake_cuda();
    let (run, report) = trace_sleep(&dir.join("libnvidia-ml.so.1"), "nvml-fake");
    let n = &report["nvml"];
    assert_eq!(n["available"], true, "{n:#}");
    assert_eq!(n["interval_ms"], 50);
    let g = &n["gpus"][0];
    assert_eq!(g["name"], "Fake GPU 9000");
    assert_eq!(n["gpus"].as_array().unwrap().len(), 1);
    let samples = g["samples"].as_array().unwrap();
    // 0.6 s at 50 ms: about 12; at least a handful however loaded the machine is.
    assert!(samples.len() >= 4, "{} samples", samples.len());
    let s = &samples[0];
    assert_eq!(s["util_gpu"], 42);
    assert_eq!(s["util_mem"], 17);
    assert_eq!(s["mem_total_bytes"], 16u64 << 30);
    assert_eq!(s["mem_used_bytes"], 3u64 << 30);
    assert_eq!(s["pcie_tx_kbps"], 1000);
    assert_eq!(s["pcie_rx_kbps"], 2000);
    assert_eq!(s["sm_clock_mhz"], 1410);
    assert_eq!(s["power_mw"], 250000);
    assert_eq!(g["mean_util_percent"], 42.0);
    assert!(run.stdout.contains("GPU 0 Fake GPU 9000"), "{}", run.stdout);
    assert!(!run.stderr.contains("NVML unavailable"), "{}", run.stderr);
}

#[test]
fn no_nvml_is_said_once_and_the_trace_goes_on() {
    let _g = serial();
    if !require_root("no_nvml_is_said_once_and_the_trace_goes_on") {
        return;
    }
    let (run, report) = trace_sleep(Path::new("/nonexistent/libnvidia-ml.so.1"), "nvml-none");
    let n = &report["nvml"];
    assert_eq!(n["available"], false);
    assert!(n["reason"].as_str().unwrap().contains("NVML"), "{n:#}");
    assert!(n["gpus"].as_array().unwrap().is_empty());
    // Said once, in the summary; stderr stays for errors.
    assert!(!run.stderr.contains("NVML"), "{}", run.stderr);
    assert_eq!(
        run.stdout.matches("GPU: not sampled").count(),
        1,
        "{}",
        run.stdout
    );
}

/// A `--pid` trace counts the calls of its window, not those made while the report is built
/// after it (the CPU profile's symbolisation alone takes ~0.1 s to seconds): a process that
/// makes at most 1,000 copies a second shows at most 1,000 a second of the window, which the
/// verdicts divide by. Before the CUDA probes stopped counting at the window's end, a 0.5 s
/// trace counted the copies of its report's build too.
#[test]
fn a_pid_trace_counts_the_calls_of_its_window() {
    let _g = serial();
    if !require_root("a_pid_trace_counts_the_calls_of_its_window") {
        return;
    }
    let dir = fake_cuda();
    let mut target = crate::faults::Bg::spawn(
        Command::new(dir.join("workload"))
            .args(["--paced", "20000"])
            .env("LD_LIBRARY_PATH", &dir),
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    for _ in 0..2 {
        let out = out_dir("pid-cuda-window");
        let run = gputrace(&[
            "--pid",
            &target.pid().to_string(),
            "-d",
            "500ms",
            "-o",
            out.to_str().unwrap(),
        ]);
        assert_eq!(run.code(), 0, "{}", run.stderr);
        let r = run.report(&out);
        let window_s = r["window"]["duration_ns"].as_f64().unwrap() / 1e9;
        let copies = count(&cuda_of(&r, "workload"), "cudaMemcpy") as f64;
        // Each copy is followed by a 1 ms sleep (and the wake-up's slack): 1,000 a second at
        // most, ~900 here. One in flight at each end may count.
        assert!(
            copies <= 1000.0 * window_s + 2.0 && copies >= 300.0 * window_s,
            "{copies} copies counted in a {window_s:.3} s window"
        );
    }
    let _ = target.0.kill();
    let _ = target.0.wait();
}

/// A CUDA library a launched command maps as it starts is probed only once it is seen mapped,
/// ~6-17 ms later: the calls in between are missing, and the report says so. (Probing a
/// preloaded library before the release was tried: the budget's first window then opened
/// before the job launched anything, and the launch demo's estimate went from 550,000 launches
/// to 0.66-2.0 million.)
#[test]
fn libraries_probed_after_their_mapping_are_named() {
    let _g = serial();
    if !require_root("libraries_probed_after_their_mapping_are_named") {
        return;
    }
    let dir = fake_cuda();
    let workload = dir.join("workload");
    // 300 copies 1 ms apart: a process that exits before its maps are read leaves nothing to
    // find.
    let out = out_dir("late-linked");
    let run = run_traced(
        &[
            "--max-overhead",
            "100%",
            "-o",
            out.to_str().unwrap(),
            "--",
            workload.to_str().unwrap(),
            "--paced",
            "300",
        ],
        &[("LD_LIBRARY_PATH", dir.to_str().unwrap())],
    );
    assert_eq!(run.code(), 0, "{}", run.stderr);
    let r = run.report(&out);
    let spots: Vec<&str> = r["blind_spots"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b.as_str())
        .filter(|b| b.contains("mapped it (found as it was mapped)"))
        .collect();
    assert!(
        spots
            .iter()
            .any(|b| b.contains("libcudart.so.12 was probed")),
        "{spots:?}"
    );
    // What was probed from then on is counted: the copies seen and the ones before sum to
    // the workload's 300 at most.
    let seen = count(&cuda_of(&r, "workload"), "cudaMemcpy");
    assert!(seen > 200 && seen <= 300, "{seen}");
}

/// Builds `tests/workloads/NAME.c` linked to the fake libcudart (found through its rpath):
/// the program and the runtime's path.
fn linked_to_fake_cudart(name: &str) -> (PathBuf, PathBuf) {
    let dir = fake_cuda();
    let bin = dir.join(name);
    let cudart = dir.join("libcudart.so.12");
    let st = Command::new("gcc")
        .args(["-O0", "-g", "-fno-omit-frame-pointer", "-o"])
        .arg(&bin)
        .arg(repo_root().join(format!("tests/workloads/{name}.c")))
        .arg(&cudart)
        .arg(format!("-Wl,-rpath,{}", dir.display()))
        .status()
        .expect("run gcc");
    assert!(st.success(), "gcc failed building {name}");
    (bin, cudart)
}

/// Two kernels whose names differ only past what the kernel side reads of a name (255
/// bytes): two rows with their own launch counts, named from their host stubs' symbols. They
/// were one row, the cut mangled name, with both kernels' launches.
#[test]
fn kernels_with_long_names_cut_alike_stay_apart() {
    let _g = serial();
    if !require_root("kernels_with_long_names_cut_alike_stay_apart") {
        return;
    }
    let (bin, cudart) = linked_to_fake_cudart("long_kernel_names");
    let out = out_dir("long-kernel-names");
    // Probed from the first call: the registrations come right at the start.
    let run = gputrace(&[
        "--max-overhead",
        "100%",
        "--libcudart",
        cudart.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--",
        bin.to_str().unwrap(),
    ]);
    assert_eq!(run.code(), 0, "{}", run.stderr);
    let r = run.report(&out);
    let kernels = &r["processes"][0]["cuda"]["kernels"];
    let launches = |name: &str| {
        kernels
            .as_array()
            .unwrap()
            .iter()
            .find(|k| k["name"] == name)
            .unwrap_or_else(|| panic!("no kernel {name} in {kernels:#}"))["launches"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(launches("long_stub_x"), 30, "{kernels:#}");
    assert_eq!(launches("long_stub_y"), 10, "{kernels:#}");
}

/// A CUDA program that exits within a millisecond, before gputrace reads its maps: its
/// library was never probed, and a blind spot says so and how to get its calls (it left no
/// trace at all).
#[test]
fn a_cuda_program_gone_before_its_maps_are_read_is_named() {
    let _g = serial();
    if !require_root("a_cuda_program_gone_before_its_maps_are_read_is_named") {
        return;
    }
    let (bin, _) = linked_to_fake_cudart("cuda_fail_fast");
    // Several tries: the process must be gone before its maps are read, which it is
    // nearly always (it lives well under a millisecond).
    for attempt in 0..5 {
        let out = out_dir("cuda-fail-fast");
        let run = gputrace(&["-o", out.to_str().unwrap(), "--", bin.to_str().unwrap()]);
        assert_eq!(run.code(), 0, "{}", run.stderr);
        let r = run.report(&out);
        let probed = r["processes"][0]["cuda"]["libraries"]
            .as_array()
            .is_some_and(|l| !l.is_empty());
        if probed {
            eprintln!("attempt {attempt}: its maps were read in time; again");
            continue;
        }
        let blind = r["blind_spots"].to_string();
        assert!(
            blind.contains("libcudart.so.12") && blind.contains("exited before gputrace saw it"),
            "{blind}"
        );
        return;
    }
    panic!("the process outlived the look at its maps 5 times in 5");
}
