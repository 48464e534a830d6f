//! Issue 3: every thread of a ground-truth workload spends its life in one known way, and at its
//! end writes what the kernel says it did (schedstat on-CPU and runqueue time) and how many
//! syscalls it made. gputrace's per-thread categories must match within 5 points, sum to the
//! alive time within 1%, count the syscalls exactly and see the O_DIRECT bytes at the block
//! layer within 1%.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::common::*;

struct Truth {
    name: String,
    tid: u64,
    alive_ns: f64,
    cpu_ns: f64,
    rq_ns: f64,
    calls: u64,
    bytes: u64,
}

fn truths(text: &str) -> Vec<Truth> {
    text.lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 7, "bad truth line {l:?}");
            Truth {
                name: f[0].into(),
                tid: f[1].parse().unwrap(),
                alive_ns: f[2].parse().unwrap(),
                cpu_ns: f[3].parse().unwrap(),
                rq_ns: f[4].parse().unwrap(),
                calls: f[5].parse().unwrap(),
                bytes: f[6].parse().unwrap(),
            }
        })
        .collect()
}

fn categories(time: &Value) -> BTreeMap<String, f64> {
    time["categories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["category"].as_str().unwrap().to_string(),
                c["percent"].as_f64().unwrap(),
            )
        })
        .collect()
}

fn syscall_count(thread: &Value, name: &str) -> u64 {
    thread["syscalls"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|s| s["name"] == name)
                .map(|s| s["count"].as_u64().unwrap())
                .sum()
        })
        .unwrap_or(0)
}

#[test]
fn ground_truth_time_split() {
    ground_truth("ground_truth_time_split", &[]);
}

/// The scheduler programs' classic-tracepoint versions, which kernels without the raw
/// tracepoints' expected arguments get, keep the same books.
#[test]
fn ground_truth_time_split_on_classic_tracepoints() {
    ground_truth(
        "ground_truth_time_split_on_classic_tracepoints",
        &[("GPUTRACE_RAW_TRACEPOINTS", "0")],
    );
}

/// A kernel that refuses the BTF programs and then the raw ones (the raw `sched_switch` took
/// 87% of the verifier's limit here before its rare paths became global functions, 9% now;
/// another kernel's verifier may still refuse it) gets the
/// classic ones, which keep the same books, where the trace failed before. The last program
/// of each raw set is refused, so the ones loaded before it must go.
#[test]
fn ground_truth_time_split_when_the_raw_programs_are_refused() {
    ground_truth(
        "ground_truth_time_split_when_the_raw_programs_are_refused",
        &[
            ("GPUTRACE_BTF_TRACEPOINTS", "0"),
            (
                "GPUTRACE_REFUSE_PROGRAMS",
                "sched_wakeup_new,block_rq_complete",
            ),
        ],
    );
}

/// A kernel that refuses a BTF program as it is loaded ahead (`bpf::preload`: the programs
/// are verified on every CPU before the families attach them) gets that program's set on raw
/// tracepoints, and the refusal told as it was met there, without the verifier run for it
/// again: the scheduler's switch here. The syscall programs keep their BTF tracepoint.
#[test]
fn a_btf_program_refused_as_it_is_loaded_ahead_leaves_its_set_on_raw_tracepoints() {
    let _g = serial();
    if !require_root(
        "a_btf_program_refused_as_it_is_loaded_ahead_leaves_its_set_on_raw_tracepoints",
    ) {
        return;
    }
    let out = out_dir("refused-ahead");
    let run = gputrace_env(
        &[
            "-v",
            "-o",
            out.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "sleep 0.2; cat /proc/self/stat > /dev/null",
        ],
        &[("GPUTRACE_REFUSE_PROGRAMS", "sched_switch_btf")],
    );
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr);
    assert!(
        run.stderr
            .contains("scheduler programs on raw tracepoints: ")
            && run.stderr.contains(
                "program sched_switch_btf: refused as GPUTRACE_REFUSE_PROGRAMS asks (a \
                 kernel's verifier walking it past its limit), as it was loaded ahead"
            ),
        "stderr:\n{}",
        run.stderr
    );
    let r = run.report(&out);
    let programs: Vec<&str> = r["overhead"]["programs"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["program"].as_str())
        .collect();
    assert!(
        programs.contains(&"sched_switch") && !programs.contains(&"sched_switch_btf"),
        "{programs:?}"
    );
    assert!(programs.contains(&"sys_enter_btf"), "{programs:?}");
    // The fallback was not loaded ahead: its verifier runs at its attach, and `-v` says so.
    let late = verified_at_attach(&run.stderr);
    assert!(late.contains(&"sched_switch".to_string()), "{late:?}");
    // The books still balance on the raw set.
    let p = &r["processes"][0];
    let t = &p["threads"][0]["time"];
    let (alive, accounted) = (
        t["alive_ns"].as_f64().unwrap(),
        t["accounted_ns"].as_f64().unwrap(),
    );
    assert!((alive - accounted).abs() <= 0.01 * alive, "{t:#}");
}

/// The programs `-v` says were verified at their own attach, not loaded ahead.
fn verified_at_attach(stderr: &str) -> Vec<String> {
    stderr
        .lines()
        .filter(|l| l.contains("programs verified at their attach, not ahead: "))
        .flat_map(|l| l.rsplit(": ").next().unwrap_or("").split(", "))
        .map(str::to_string)
        .collect()
}

/// Every program a plain trace attaches is loaded ahead, on every CPU, before the families
/// attach: the loads-ahead lists are written beside each family's attach, and a program left
/// off them is verified alone at its attach (the scheduler's switch ~170 ms here), which no
/// result shows but the time to start. The BTF and the raw sets, the block layer's issue
/// program and the wake-up program each take a list of their own.
#[test]
fn a_plain_trace_verifies_every_program_ahead_of_its_attach() {
    let _g = serial();
    if !require_root("a_plain_trace_verifies_every_program_ahead_of_its_attach") {
        return;
    }
    for env in [
        vec![],
        vec![("GPUTRACE_BTF_TRACEPOINTS", "0")],
        vec![
            ("GPUTRACE_BLOCK_ISSUE", "1"),
            ("GPUTRACE_SCHED_WAKEUP", "1"),
        ],
    ] {
        let run = gputrace_env(&["-v", "--", "sleep", "0.1"], &env);
        assert_eq!(run.code(), 0, "{env:?} stderr:\n{}", run.stderr);
        assert!(
            run.stderr.contains("programs loaded ahead in "),
            "{env:?} stderr:\n{}",
            run.stderr
        );
        let late = verified_at_attach(&run.stderr);
        assert!(
            late.is_empty(),
            "{env:?}: {late:?}\nstderr:\n{}",
            run.stderr
        );
    }
}

/// The scheduler, syscall and block programs read the kernel's structs with plain loads on BTF
/// tracepoints; the same code on raw tracepoints (through `bpf_probe_read_kernel`), for kernels
/// that refuse the BTF ones, keeps the same books.
#[test]
fn ground_truth_time_split_on_raw_tracepoints() {
    ground_truth(
        "ground_truth_time_split_on_raw_tracepoints",
        &[("GPUTRACE_BTF_TRACEPOINTS", "0")],
    );
}

/// The BTF scheduler set with its `sched_wakeup` program, which times the runqueue wait after
/// a wake-up where the switch program cannot (a kernel whose BTF lacks `sched_info` or the
/// task's runqueue clock), keeps the same books. With the block set's issue program too, which
/// times the requests where a disk's queue does not stamp its issues (the other variants
/// read the stamps where this machine's disks have them).
#[test]
fn ground_truth_time_split_with_the_wakeup_program() {
    ground_truth(
        "ground_truth_time_split_with_the_wakeup_program",
        &[
            ("GPUTRACE_SCHED_WAKEUP", "1"),
            ("GPUTRACE_BLOCK_ISSUE", "1"),
        ],
    );
}

/// A switch onto a CPU that ran no program (on the development VM, any switch from a thread
/// of the sandbox's agent: the kernel runs no BPF program while one is current) is closed by
/// the thread's own next program, dated by the scheduler's `sched_info.last_arrival`. Here
/// every traced switch-in goes unseen (a test hook), and the books still hold: the spinner,
/// the victim and the hog, which make no syscalls, are closed at their switch-outs and CPU
/// samples. Dated at the closing instead, they read 5-10% on CPU where 45-91% is true (and
/// where the BTF lacks the scheduler's fields, they still do).
#[test]
fn ground_truth_time_split_with_every_switch_in_unseen() {
    ground_truth(
        "ground_truth_time_split_with_every_switch_in_unseen",
        &[("GPUTRACE_TEST_UNSEEN_SWITCH_INS", "1")],
    );
}

/// Without the stack walks at switch-out (`GPUTRACE_OFFCPU_STACKS=0`, and as for a wait whose
/// kernel stack lost its stack-map slot to another: once in a local run every one of the pipe
/// reader's waits did, and its pipe reads were told as disk reads by their syscall), a wait
/// in a syscall on an fd is told by the file: the pipe reader waits on a pipe.
#[test]
fn ground_truth_time_split_without_the_stack_walks() {
    ground_truth(
        "ground_truth_time_split_without_the_stack_walks",
        &[("GPUTRACE_OFFCPU_STACKS", "0")],
    );
}

/// Thread states live in direct-mapped slots, spilling to a hash map when a slot is taken.
/// With two slots the workload's seven threads (and its child) must share them, so most
/// states go through the spill: found, written out at death and read at the end the same way.
#[test]
fn ground_truth_time_split_with_shared_thread_slots() {
    ground_truth(
        "ground_truth_time_split_with_shared_thread_slots",
        &[("GPUTRACE_THREAD_SLOTS", "2")],
    );
}

/// Whether a line of the report's blind spots is about process `pid` (block I/O it submitted
/// and never saw complete).
fn blind_spot_names(report: &Value, pid: &Value) -> bool {
    report["blind_spots"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .any(|b| b.starts_with(&format!("pid {pid} ")))
}

/// The programs the report says ran.
fn programs_that_ran(report: &Value) -> Vec<&str> {
    report["overhead"]["programs"]
        .as_array()
        .map(|a| a.iter().filter_map(|p| p["program"].as_str()).collect())
        .unwrap_or_default()
}

/// Whether `-v` said the BTF scheduler set runs `sched_wakeup` (a kernel whose BTF lacks the
/// scheduler's delay accounting, or GPUTRACE_SCHED_WAKEUP=1).
fn told_by_wakeup(stderr: &str) -> bool {
    stderr.contains("runqueue waits told by sched_wakeup")
}

/// Per CPU (`cpuN` lines of /proc/stat): (all ticks, steal ticks).
fn cpu_ticks() -> Vec<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    stat.lines()
        .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
        .map(|l| {
            let v: Vec<u64> = l
                .split_whitespace()
                .skip(1)
                .filter_map(|x| x.parse().ok())
                .collect();
            // user nice system idle iowait irq softirq steal guest guest_nice: guest time is
            // already in user.
            let total = v.iter().take(8).sum();
            (total, v.get(7).copied().unwrap_or(0))
        })
        .collect()
}

/// The largest share of its time (in points) any CPU lost to steal between two readings.
fn steal_points(before: &[(u64, u64)], after: &[(u64, u64)]) -> f64 {
    before
        .iter()
        .zip(after)
        .map(|(b, a)| {
            let total = a.0.saturating_sub(b.0);
            let steal = a.1.saturating_sub(b.1);
            if total == 0 {
                0.0
            } else {
                100.0 * steal as f64 / total as f64
            }
        })
        .fold(0.0, f64::max)
}

/// The largest relative error at 95% of a sampled block I/O row's request count (its
/// `sampled.requests_error` over its `requests`), 0 where every request was counted.
fn sampled_error(rows: &serde_json::Value) -> f64 {
    rows.as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| {
            let err = r["sampled"]["requests_error"].as_f64()?;
            Some(err / r["requests"].as_f64()?.max(1.0))
        })
        .fold(0.0, f64::max)
}

fn ground_truth(name: &str, env: &[(&str, &str)]) {
    let _g = serial();
    if !require_root(name) {
        return;
    }
    let bin = build_c("ground_truth", &[]);
    // The O_DIRECT file must be on a real block device: the target dir is on the root disk.
    let work = tmp_dir().join(format!("gt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    let out = out_dir("time");
    let stat_before = cpu_ticks();
    let run = gputrace_env(
        &[
            "-o",
            out.to_str().unwrap(),
            "-v",
            "--",
            bin.to_str().unwrap(),
            work.to_str().unwrap(),
        ],
        env,
    );
    // The kernel's own figures (schedstat) leave out time the hypervisor stole from the vCPU
    // (CONFIG_PARAVIRT_TIME_ACCOUNTING), which gputrace, timing a thread between its switches,
    // counts where the thread was: on a busy host a spinner's on-CPU share differs from
    // schedstat's by up to the steal. The tolerance grows by the largest share any CPU lost.
    let steal = steal_points(&stat_before, &cpu_ticks());
    let tolerance = 5.0 + steal;
    let classic = run
        .stderr
        .contains("scheduler programs on classic tracepoints");
    // Asked for, or left as the raw programs' loads fail.
    let refused_raw = env.iter().any(|(k, _)| *k == "GPUTRACE_REFUSE_PROGRAMS");
    let asked_classic = env.contains(&("GPUTRACE_RAW_TRACEPOINTS", "0")) || refused_raw;
    let asked_wakeup = env.contains(&("GPUTRACE_SCHED_WAKEUP", "1"));
    // A kernel whose BTF lacks the scheduler's delay accounting keeps the wake-up program.
    let told_by_wakeup = told_by_wakeup(&run.stderr);
    assert_eq!(classic, asked_classic, "stderr:\n{}", run.stderr);
    assert_eq!(
        run.code(),
        0,
        "stdout:\n{}\nstderr:\n{}",
        run.stdout,
        run.stderr
    );
    let truth = truths(&std::fs::read_to_string(work.join("truth.txt")).expect("truth.txt"));
    assert_eq!(truth.len(), 7, "every workload thread reported");
    let report = run.report(&out);
    let procs = report["processes"].as_array().unwrap();
    let main = process_named(&report, "ground_truth");
    if env.contains(&("GPUTRACE_TEST_UNSEEN_SWITCH_INS", "1")) {
        let drops = report["drops"].to_string();
        assert!(drops.contains("SwitchInUnseen"), "{drops}");
    }

    // The invariant, for every thread gputrace saw, in every process.
    for p in procs {
        for t in p["threads"].as_array().unwrap() {
            let Some(time) = t.get("time") else { continue };
            let alive = time["alive_ns"].as_f64().unwrap();
            let accounted = time["accounted_ns"].as_f64().unwrap();
            assert!(
                (alive - accounted).abs() <= 0.01 * alive,
                "thread {} of pid {}: {accounted} ns accounted of {alive} ns alive",
                t["tid"],
                p["pid"]
            );
        }
    }
    assert!(
        !run.stdout.contains("time accounting of thread"),
        "invariant warning:\n{}",
        run.stdout
    );

    let threads = main["threads"].as_array().unwrap();
    let mut failures = Vec::new();
    for t in &truth {
        let th = threads
            .iter()
            .find(|x| x["tid"].as_u64() == Some(t.tid))
            .unwrap_or_else(|| panic!("no thread {} ({}) in the report", t.tid, t.name));
        let cats = categories(&th["time"]);
        let got = |c: &str| cats.get(c).copied().unwrap_or(0.0);
        let cpu = 100.0 * t.cpu_ns / t.alive_ns;
        let rq = 100.0 * t.rq_ns / t.alive_ns;
        let blocked = 100.0 - cpu - rq;
        let mut expect = vec![("cpu", cpu), ("runqueue", rq)];
        match t.name.as_str() {
            "sleeper" => expect.push(("sleep", blocked)),
            "futex" => expect.push(("lock", blocked)),
            "direct" => expect.push(("io", blocked)),
            "pipe" => expect.push(("ipc", blocked)),
            _ => {}
        }
        for (c, want) in expect {
            if (got(c) - want).abs() > tolerance {
                failures.push(format!(
                    "{} {c}: {:.1}% measured, {want:.1}% by construction ({cats:?}; \
                     tolerance {tolerance:.1} points, {steal:.1} of them steal)",
                    t.name,
                    got(c)
                ));
            }
        }
        let calls = match t.name.as_str() {
            "sleeper" => Some(syscall_count(th, "clock_nanosleep")),
            "direct" => Some(syscall_count(th, "pread64")),
            "pipe" => Some(syscall_count(th, "read")),
            _ => None,
        };
        if let Some(n) = calls {
            if n != t.calls {
                failures.push(format!(
                    "{}: {n} syscalls counted, {} made",
                    t.name, t.calls
                ));
            }
        }
        if t.name == "victim" && rq < 10.0 {
            failures.push(format!(
                "victim was hardly preempted ({rq:.1}%): no contention built"
            ));
        }
    }

    let direct_bytes = truth.iter().find(|t| t.name == "direct").unwrap().bytes as f64;
    let block_read: f64 = main["block_io"]
        .as_array()
        .map(|a| a.iter().map(|d| d["read_bytes"].as_f64().unwrap()).sum())
        .unwrap_or(0.0);
    // Block requests come fast enough here to be sampled on a fast disk (past 4,000 a
    // second): the rows are then estimates, each with its error.
    let rel = sampled_error(&main["block_io"]);
    if (block_read - direct_bytes).abs() > (0.01f64).max(1.5 * rel) * direct_bytes {
        failures.push(format!(
            "block layer read {block_read} bytes, the workload read {direct_bytes} with O_DIRECT"
        ));
    }
    // Each 1 MiB pread is one request or more, each timed from issue to completion (a few
    // completions the kernel does not trace are allowed: Drop::BlockNoCompletion).
    let direct_calls = truth.iter().find(|t| t.name == "direct").unwrap().calls as f64;
    let sum = |f: &str| -> f64 {
        main["block_io"]
            .as_array()
            .map(|a| a.iter().map(|d| d[f].as_f64().unwrap()).sum())
            .unwrap_or(0.0)
    };
    // The requests seen completing carry what the process submitted: none of another's (a
    // request no traced bio owns is nobody's). Completions that ran no program (0-0.2% of a
    // loader's a run here, once a fifth of `dd`'s 128 in CI) are said in the blind spots past
    // 0.1% (the process has exited: nothing was in flight), and never most of them.
    let submitted = sum("read_bytes") + sum("write_bytes");
    let completed = sum("completed_bytes");
    let told = blind_spot_names(&report, &main["pid"]);
    let short = submitted - completed;
    let over = if rel > 0.0 {
        submitted * 1.5 * rel
    } else {
        0.0
    };
    if completed > submitted + over
        || (short * 1000.0 > submitted && short > over && !told)
        || short * 4.0 > submitted
    {
        failures.push(format!(
            "{completed} bytes seen completing of {submitted} submitted: {:#}",
            main["block_io"]
        ));
    }
    let (requests, total_ns) = (sum("requests"), sum("total_ns"));
    if requests < 0.5 * direct_calls
        || (requests < (0.95 - 1.5 * rel) * direct_calls && !told)
        || total_ns <= 0.0
    {
        failures.push(format!(
            "{requests} block requests taking {total_ns} ns for {direct_calls} O_DIRECT preads"
        ));
    }
    // Which sets of programs ran: the BTF ones by default, the raw ones with
    // GPUTRACE_BTF_TRACEPOINTS=0, the classic ones with GPUTRACE_RAW_TRACEPOINTS=0.
    let programs = programs_that_ran(&report);
    // The raw and BTF block sets time their requests from the kernel's issue stamps where every
    // disk's queue stamps them (no issue program), else, or when asked, from their own.
    let issue_program = run
        .stderr
        .contains("block requests timed from a block_rq_issue program");
    let stamped = run
        .stderr
        .contains("block requests timed from the kernel's issue stamps");
    if !asked_classic && issue_program == stamped {
        failures.push(format!(
            "-v did not say how block requests are timed:\n{}",
            run.stderr
        ));
    }
    if env.contains(&("GPUTRACE_BLOCK_ISSUE", "1")) && !issue_program {
        failures.push("GPUTRACE_BLOCK_ISSUE=1 ran no issue program".to_string());
    }
    let suffix = if env.contains(&("GPUTRACE_BTF_TRACEPOINTS", "0")) {
        ""
    } else {
        "_btf"
    };
    let issue = format!("block_rq_issue{suffix}");
    if stamped && programs.contains(&issue.as_str()) {
        failures.push(format!("{issue} ran beside the issue stamps: {programs:?}"));
    }
    let block = if issue_program {
        issue
    } else {
        format!("block_rq_complete{suffix}")
    };
    let want: Vec<&str> = if asked_classic {
        vec![
            "block_rq_insert_tp",
            "sched_switch_tp",
            "sched_wakeup_tp",
            "sys_enter",
        ]
    } else if suffix.is_empty() {
        vec![&block, "sched_switch", "sched_wakeup", "sys_enter"]
    } else if asked_wakeup || told_by_wakeup {
        vec![
            &block,
            "sched_switch_btf",
            "sched_wakeup_btf",
            "sys_enter_btf",
        ]
    } else {
        // sched_switch_btf tells the runqueue waits after wake-ups itself.
        vec![&block, "sched_switch_btf", "sys_enter_btf"]
    };
    for want in want {
        if !programs.contains(&want) {
            failures.push(format!(
                "no {want} among the programs that ran: {programs:?}"
            ));
        }
    }
    // A set is all or none: the raw programs loaded before the refused one (the last of
    // each set) are gone.
    if refused_raw {
        for raw in [
            "sched_switch",
            "sched_wakeup",
            "block_bio_queue",
            "block_split",
            "block_rq_issue",
        ] {
            if programs.contains(&raw) {
                failures.push(format!("{raw} ran beside the classic set: {programs:?}"));
            }
        }
    }
    let btf_set = !asked_classic && !env.contains(&("GPUTRACE_BTF_TRACEPOINTS", "0"));
    if btf_set && !told_by_wakeup && programs.contains(&"sched_wakeup_btf") {
        failures.push(format!(
            "sched_wakeup_btf ran beside sched_switch_btf: {programs:?}"
        ));
    }

    // The pipe's fd number was used by another file before: per-open accounting keeps them apart.
    let files = main["files"].as_array().expect("files");
    let pipe = files
        .iter()
        .find(|f| f["file"].as_str().is_some_and(|n| n.starts_with("pipe:")))
        .unwrap_or_else(|| panic!("no pipe among the files: {files:#?}"));
    if pipe["bytes"].as_u64() != Some(60) || pipe["calls"].as_u64() != Some(60) {
        failures.push(format!(
            "pipe I/O {pipe}, the reader made 60 one-byte reads"
        ));
    }

    let offcpu = std::fs::read_to_string(out.join("offcpu.folded")).expect("offcpu.folded");
    for (thread, cat) in [
        ("gt_pipe", "[ipc]"),
        ("gt_futex", "[lock]"),
        ("gt_sleeper", "[sleep]"),
    ] {
        if !offcpu
            .lines()
            .any(|l| l.starts_with(thread) && l.contains(cat))
        {
            failures.push(format!("offcpu.folded has no {cat} stack for {thread}"));
        }
    }
    let wall = std::fs::read_to_string(out.join("wall.svg")).expect("wall.svg");
    if !(wall.contains("[cpu]") && wall.contains("[sleep]")) {
        failures.push("wall.svg lacks the category frames".into());
    }
    assert!(
        run.stdout.contains("wall time of"),
        "no time section in the summary:\n{}",
        run.stdout
    );
    let _ = std::fs::remove_dir_all(&work);
    assert!(
        failures.is_empty(),
        "{}\nstdout:\n{}",
        failures.join("\n"),
        run.stdout
    );
}

/// A thread already blocked when gputrace attaches (`--pid`) is seeded from /proc: its interval
/// straddles the window start and the end, and it is charged from the attach to the end.
#[test]
fn attached_sleeper_straddles_the_window() {
    let _g = serial();
    if !require_root("attached_sleeper_straddles_the_window") {
        return;
    }
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .expect("spawn sleep");
    // Let it reach its clock_nanosleep before we attach.
    std::thread::sleep(std::time::Duration::from_millis(200));
    let out = out_dir("time-pid");
    let pid = child.id();
    let run = gputrace(&[
        "-p",
        &pid.to_string(),
        "-d",
        "1s",
        "-o",
        out.to_str().unwrap(),
    ]);
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        run.code(),
        0,
        "stdout:\n{}\nstderr:\n{}",
        run.stdout,
        run.stderr
    );
    let report = run.report(&out);
    let p = report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"].as_u64() == Some(pid as u64))
        .unwrap_or_else(|| panic!("no process {pid}: {report:#}"));
    let time = &p["time"];
    let alive = time["alive_ns"].as_f64().unwrap();
    let accounted = time["accounted_ns"].as_f64().unwrap();
    assert!(
        (0.9e9..2.0e9).contains(&alive),
        "alive {alive} ns for a 1 s window"
    );
    assert!((alive - accounted).abs() <= 0.01 * alive, "{time:#}");
    let sleep = categories(time).get("sleep").copied().unwrap_or(0.0);
    assert!(
        sleep >= 99.0,
        "sleep {sleep:.1}% for a thread asleep all along: {time:#}"
    );
    let reason = &time["reasons"][0];
    assert_eq!(reason["reason"], "clock_nanosleep", "{time:#}");
}

/// Readers blocked since before the attach, which the kernel never shows switching out: their
/// waits are told by the kernel stack /proc gives at seeding, not by the syscall alone (a
/// `read` of anything would be disk I/O): a read of a pipe is `ipc`, of a TCP socket
/// `net`, and the off-CPU flame graph shows the stack.
#[test]
fn readers_blocked_since_before_the_attach_are_told_by_their_stacks() {
    let _g = serial();
    if !require_root("readers_blocked_since_before_the_attach_are_told_by_their_stacks") {
        return;
    }
    // `cat` reading a pipe nobody writes; python reading a connected TCP socket.
    let mut pipe = std::process::Command::new("sh")
        .args(["-c", "sleep 30 | cat"])
        .spawn()
        .expect("spawn sh");
    let py = "import os, socket, time\n\
              srv = socket.socket(); srv.bind(('127.0.0.1', 0)); srv.listen(1)\n\
              c = socket.create_connection(srv.getsockname()); s, _ = srv.accept()\n\
              if os.fork() == 0:\n    os.read(c.fileno(), 1); os._exit(0)\n\
              time.sleep(30)\n";
    let mut sock = std::process::Command::new("python3")
        .args(["-c", py])
        .spawn()
        .expect("spawn python3");
    std::thread::sleep(std::time::Duration::from_millis(500));
    let cat = descendants_named(pipe.id(), "cat");
    let recv = descendants_named(sock.id(), "python3");
    let out = out_dir("seeded-stacks");
    let mut args = vec!["-d", "1s", "-o", out.to_str().unwrap()];
    let pids: Vec<String> = cat.iter().chain(&recv).map(u32::to_string).collect();
    for p in &pids {
        args.push("-p");
        args.push(p);
    }
    let run = gputrace(&args);
    let sleeps = descendants_named(pipe.id(), "sleep");
    for c in [&mut pipe, &mut sock] {
        let _ = c.kill();
        let _ = c.wait();
    }
    for p in cat.iter().chain(&recv).chain(&sleeps) {
        unsafe { libc::kill(*p as i32, libc::SIGKILL) };
    }
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr);
    let report = run.report(&out);
    let main_time = |pid: u32| -> BTreeMap<String, f64> {
        let p = report["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["pid"].as_u64() == Some(pid as u64))
            .unwrap_or_else(|| panic!("no process {pid}: {report:#}"));
        categories(&p["time"])
    };
    assert_eq!(cat.len(), 1, "cat: {cat:?}");
    let c = main_time(cat[0]);
    assert!(
        c.get("ipc").copied().unwrap_or(0.0) >= 99.0,
        "cat reading a pipe: {c:?}"
    );
    // The forked child blocked in a read of the socket (the parent sleeps).
    let child = recv
        .iter()
        .copied()
        .find(|&p| p != sock.id())
        .expect("the python child");
    let n = main_time(child);
    assert!(
        n.get("net").copied().unwrap_or(0.0) >= 99.0,
        "a read of a TCP socket: {n:?}"
    );
    // Nothing else to report: the lead is what `cat` waits in, not a disk.
    let findings = report["findings"].as_array().unwrap();
    let f = findings
        .iter()
        .find(|f| f["rule"] == "waiting" && f["pid"].as_u64() == Some(cat[0] as u64))
        .unwrap_or_else(|| panic!("no waiting finding for cat: {findings:#?}"));
    assert!(
        f["title"].as_str().unwrap().contains("in `read` (ipc)"),
        "{f:#}"
    );
    let folded = std::fs::read_to_string(out.join("offcpu.folded")).unwrap();
    assert!(
        folded
            .lines()
            .any(|l| l.starts_with(&format!("cat-{}/", cat[0])) && l.contains("pipe_read")),
        "{folded}"
    );
}

/// A thread cycling through three waits (a read of pipe A, a nap, a read of pipe B, a nap):
/// the stacks walked at switch-out are reused per wait, and each wait's off-CPU time must land
/// under the function that waited, never under another wait's stack.
#[test]
fn three_cycling_waits_keep_their_own_stacks() {
    let _g = serial();
    if !require_root("three_cycling_waits_keep_their_own_stacks") {
        return;
    }
    let (out, run) = trace_workload("cycling_waits", &["300"]);
    cycling_waits_in_place(&out, &run);
}

/// The same while another thread's syscall storm has the syscall tracepoints off: the reader's
/// waits are then told apart by nothing but their stacks, and none may reuse another's.
#[test]
fn cycling_waits_keep_their_own_stacks_with_the_syscall_tracepoints_off() {
    let _g = serial();
    if !require_root("cycling_waits_keep_their_own_stacks_with_the_syscall_tracepoints_off") {
        return;
    }
    let (out, run) = trace_workload("cycling_waits", &["300", "storm"]);
    let report = run.report(&out);
    let off = &report["overhead"]["syscalls_off"];
    assert_eq!(off["threads"][0]["comm"], "cw_storm", "{off:#}");
    // Off from before the reader starts (0.3 s in) until the first window 2 s later.
    assert!(off["first_off_s"].as_f64().unwrap() < 0.3, "{off:#}");
    cycling_waits_in_place(&out, &run);
}

/// Each of `cycling_waits`' waits under the function that waited.
fn cycling_waits_in_place(out: &std::path::Path, run: &Run) {
    assert!(run.stdout.contains("done 300 waits 2400"), "{}", run.stdout);
    let offcpu = std::fs::read_to_string(out.join("offcpu.folded")).expect("offcpu.folded");
    // Microseconds per (category, function that waited), from the reader's stacks in main.
    let mut us: BTreeMap<(String, String), u64> = BTreeMap::new();
    for line in offcpu.lines().filter(|l| l.starts_with("cw_reader")) {
        let Some((stack, n)) = line.rsplit_once(' ') else {
            continue;
        };
        let frames: Vec<&str> = stack.split(';').collect();
        let Some(main) = frames.iter().position(|f| *f == "main") else {
            continue;
        };
        let (cat, waiter) = (frames[1], frames.get(main + 1).copied().unwrap_or(""));
        *us.entry((cat.into(), waiter.into())).or_default() += n.parse::<u64>().unwrap();
    }
    let get = |cat: &str, f: &str| us.get(&(cat.into(), f.into())).copied().unwrap_or(0);
    // 300 reads of each pipe, ~1 ms each (the writer writes every 1.5 ms, in turn); 600 naps
    // of 0.5 ms or more.
    for f in ["wait_on_a", "wait_on_b"] {
        assert!(get("[ipc]", f) >= 100_000, "{f}: {us:?}\n{offcpu}");
    }
    assert!(get("[sleep]", "nap") >= 200_000, "{us:?}\n{offcpu}");
    for ((cat, f), n) in &us {
        let right = match cat.as_str() {
            "[ipc]" => f == "wait_on_a" || f == "wait_on_b",
            "[sleep]" => f == "nap",
            _ => true,
        };
        assert!(right, "{n} us of {cat} under {f}: {us:?}\n{offcpu}");
    }
}

/// Thread names are read again only after a rename (the task_rename tracepoint counts them),
/// not at every look: a thread that renames itself, and one renamed by another through /proc,
/// both after gputrace has read their first names, must be reported under the new ones.
#[test]
fn threads_renamed_while_traced_get_their_new_names() {
    let _g = serial();
    if !require_root("threads_renamed_while_traced_get_their_new_names") {
        return;
    }
    let (out, run) = trace_workload("renames", &[]);
    assert!(run.stdout.contains("renamed"), "{}", run.stdout);
    let report = run.report(&out);
    let names: Vec<String> = report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["threads"].as_array().unwrap().iter())
        .filter_map(|t| t["comm"].as_str().map(str::to_string))
        .collect();
    for want in ["late_name", "named_by_main"] {
        assert!(names.iter().any(|n| n == want), "no {want} in {names:?}");
    }
    for stale in ["early_name", "sleeper"] {
        assert!(!names.iter().any(|n| n == stale), "{stale} in {names:?}");
    }
    // The rename program ran (and is counted among gputrace's own).
    let programs = report["overhead"]["programs"].to_string();
    assert!(programs.contains("task_rename"), "{programs}");
}

/// Traces `open_read_close` on `files` files read `rounds` times each (pausing `pause_ms` every
/// 1,000 opens) in a fresh directory; returns the directory (as /proc would spell it) and the
/// report.
fn open_read_close(
    name: &str,
    files: u64,
    rounds: u64,
    pause_ms: u64,
) -> (std::path::PathBuf, serde_json::Value) {
    let bin = build_c("open_read_close", &[]);
    let work = tmp_dir().join(format!("orc-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    let work = std::fs::canonicalize(&work).unwrap();
    let out = out_dir(name);
    // Every file counted: at the default budget the syscall tracepoints would come off this
    // open-read-close storm, as they should.
    let run = gputrace(&[
        "--max-overhead",
        "100%",
        "-o",
        out.to_str().unwrap(),
        "--",
        bin.to_str().unwrap(),
        work.to_str().unwrap(),
        &files.to_string(),
        &rounds.to_string(),
        &pause_ms.to_string(),
    ]);
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr);
    let report = run.report(&out);
    (work, report)
}

/// The report's process named `comm` (the first, if several).
/// The process named `comm`: the target if it is one of them (a workload's forked child
/// bears its name too, and past a pid wrap it comes first in the report), else the first.
fn process_named<'a>(report: &'a Value, comm: &str) -> &'a Value {
    let named = || {
        report["processes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["comm"] == comm)
    };
    let targets = report["target"]["pids"].as_array().unwrap();
    named()
        .find(|p| targets.contains(&p["pid"]))
        .or_else(|| named().next())
        .unwrap_or_else(|| panic!("no {comm} process: {report:#}"))
}

/// A loader opening files for an hour makes far more (fd, generation) rows than the kernel's
/// per-file map holds (16,384): closed files' rows are taken out and named as the trace runs,
/// so 24,000 opens at a loader's pace (~35,000 a second, a 20 ms pause every 1,000) lose no
/// byte and no row.
#[test]
fn many_short_lived_files_are_all_counted() {
    let _g = serial();
    if !require_root("many_short_lived_files_are_all_counted") {
        return;
    }
    let (files, rounds) = (6u64, 4000u64);
    let (work, report) = open_read_close("files-many", files, rounds, 20);
    let drops: Vec<&serde_json::Value> = report["drops"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["reason"] == "SyscallMapFull")
        .collect();
    assert!(drops.is_empty(), "{drops:#?}");
    let p = process_named(&report, "open_read_close");
    let listed = p["files"].as_array().expect("files");
    // Every byte, under a file's name or (a name lost to a burst of opens between two
    // passes) an fd number: the writes, the reads, f0's extra read and f1's through its dups;
    // and the byte of gputrace's release pipe when that read goes unnamed. (The dynamic
    // loader's reads of libc are not counted here.)
    let prefix = format!("{}/", work.display());
    let bytes: u64 = listed
        .iter()
        .filter(|f| {
            f["file"]
                .as_str()
                .is_some_and(|n| n.starts_with(&prefix) || n.starts_with("<closed fd"))
        })
        .filter_map(|f| f["bytes"].as_u64())
        .sum();
    let expected = (files * (1 + rounds) + 1) * 65536 + DUPS_BYTES;
    // The dynamic loader's reads of libc (its ELF headers: 2,400 bytes here), on the fd the
    // files take after it, are counted under libc's name, or, where that name was lost to the
    // burst of opens before the first pass (once in a fresh-clone CI run, a loaded host), under
    // that fd's number with the files' lost names. Less than one of the dups' 4 KiB reads.
    let libc_named = listed
        .iter()
        .any(|f| f["file"].as_str().is_some_and(|n| n.contains("/libc.so")));
    let extra = bytes.checked_sub(expected);
    assert!(
        extra.is_some_and(|e| e <= 1 || (!libc_named && e < 4096)),
        "{bytes} bytes counted, {expected} read: {listed:#?}"
    );
    for i in 0..files {
        let name = format!("{}/f{i}.bin", work.display());
        assert!(
            listed.iter().any(|f| f["file"] == name.as_str()),
            "{name} not named: {listed:#?}"
        );
    }
    let _ = std::fs::remove_dir_all(&work);
}

/// What `open_read_close` reads of f1 through copies of its fd at the end: 4 KiB each through
/// a `dup2` onto f0's fd, a `dup` and an fcntl `F_DUPFD_CLOEXEC`.
const DUPS_BYTES: u64 = 3 * 4096;

/// Files opened, read and closed between two of gputrace's looks at /proc (a data loader
/// reading one file per sample) are named by the path they were opened with, each file's
/// opens summed under its name, and an fd a dup (`dup2`, `dup`, fcntl `F_DUPFD_CLOEXEC`) put
/// a file on by the fd it copied.
#[test]
fn short_lived_files_are_named_by_their_open() {
    let _g = serial();
    if !require_root("short_lived_files_are_named_by_their_open") {
        return;
    }
    let (files, rounds) = (6u64, 20u64);
    let (work, report) = open_read_close("files", files, rounds, 0);
    let p = process_named(&report, "open_read_close");
    let listed = p["files"].as_array().expect("files");
    for i in 0..files {
        let name = format!("{}/f{i}.bin", work.display());
        let f = listed
            .iter()
            .find(|f| f["file"] == name.as_str())
            .unwrap_or_else(|| panic!("{name} not named: {listed:#?}"));
        // One 64 KiB write, then per round a 64 KiB read and the read that finds the end; f0
        // is read once more at the end, and the reads through f1's copies are f1's (a dup
        // names its fd after the fd it copied).
        let extra = u64::from(i == 0);
        let dups = if i == 1 { 3 } else { 0 };
        assert_eq!(
            f["bytes"].as_u64(),
            Some((1 + rounds + extra) * 65536 + dups * 4096),
            "{f}"
        );
        assert_eq!(
            f["calls"].as_u64(),
            Some(1 + 2 * (rounds + extra) + dups),
            "{f}"
        );
    }
    // Their directory sums them.
    let dir = p["dirs"]
        .as_array()
        .and_then(|d| d.iter().find(|d| d["dir"] == work.to_str().unwrap()))
        .unwrap_or_else(|| panic!("no {} in dirs: {:#}", work.display(), p["dirs"]));
    assert_eq!(dir["files"].as_u64(), Some(files), "{dir}");
    assert_eq!(
        dir["bytes"].as_u64(),
        Some((files * (1 + rounds) + 1) * 65536 + DUPS_BYTES),
        "{dir}"
    );
    // (The one byte the child reads from gputrace's release pipe before its exec is unnamed.)
    assert!(
        !listed.iter().any(
            |f| f["file"].as_str().is_some_and(|n| n.starts_with("<closed"))
                && f["bytes"].as_u64().unwrap() > 1
        ),
        "an unnamed file: {listed:#?}"
    );
    let _ = std::fs::remove_dir_all(&work);
}

/// A thread's syscalls in runs: the row it holds for a syscall made several times running
/// (`SysHeld`) is written out when it takes another and when the thread exits, read where it
/// is held when the trace ends first, and the report counts every call once, in the thread's
/// own rows, histograms included.
#[test]
fn syscalls_in_runs_are_counted_once_each() {
    let _g = serial();
    if !require_root("syscalls_in_runs_are_counted_once_each") {
        return;
    }
    const ROUNDS: u64 = 20_000;
    let bin = build_c("syscall_runs", &[]);
    let out = out_dir("syscall-runs");
    // Every call seen: at the default budget the syscall gate would take a storm's off. The
    // trace ends while the main thread sleeps, still holding a row.
    let run = gputrace(&[
        "--max-overhead",
        "100%",
        "--duration",
        "2",
        "-o",
        out.to_str().unwrap(),
        "--",
        bin.to_str().unwrap(),
        "20000",
        "4",
    ]);
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr);
    let r = run.report(&out);
    let p = &r["processes"][0];
    let threads = p["threads"].as_array().unwrap();
    assert_eq!(threads.len(), 2, "{threads:#?}");
    let main = threads
        .iter()
        .find(|t| t["tid"] == p["pid"])
        .expect("the main thread");
    let worker = threads
        .iter()
        .find(|t| t["tid"] != p["pid"])
        .expect("the worker");
    assert_eq!(syscall_count(main, "getppid"), 7 * ROUNDS);
    assert_eq!(syscall_count(main, "getuid"), 3 * ROUNDS);
    assert_eq!(syscall_count(main, "getpid"), 5 * ROUNDS);
    assert_eq!(syscall_count(worker, "getppid"), 9 * ROUNDS);
    for t in [main, worker] {
        for s in t["syscalls"].as_array().unwrap() {
            let hist: u64 = s["hist_log2_ns"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b.as_u64().unwrap())
                .sum();
            assert_eq!(hist, s["count"].as_u64().unwrap(), "{s:#}");
            assert!(s["min_ns"].as_u64() <= s["max_ns"].as_u64(), "{s:#}");
        }
    }
    let table = |name: &str| {
        p["syscalls"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == name)
            .and_then(|s| s["count"].as_u64())
    };
    assert_eq!(table("getppid"), Some(16 * ROUNDS));
}

/// Threads woken onto a busy CPU: their runqueue time, told at their switch-in from the
/// scheduler's own accounting where no `sched_wakeup` program runs (the default on a kernel
/// whose BTF shows `sched_info`), is the kernel's `run_delay` for them, most of it after
/// wake-ups; and the same with the `sched_wakeup` program that raw and classic tracepoints
/// get (GPUTRACE_SCHED_WAKEUP=1 puts it on the BTF set too), which times from the wake-up's
/// tracepoint instead of the enqueue, so within a few percent.
#[test]
fn woken_threads_runqueue_waits_match_the_kernels() {
    let _g = serial();
    if !require_root("woken_threads_runqueue_waits_match_the_kernels") {
        return;
    }
    let bin = build_c("woken_waits", &[]);
    // The third run misses every traced thread's switch-in (a test hook): each wait is closed
    // at the sleeper's next syscall, its runqueue part from the scheduler's run-delay sum
    // (see timeline::unseen_switch_ins_are_closed_by_the_threads_own_syscalls).
    for (wakeup, unseen) in [("0", "0"), ("1", "0"), ("0", "1")] {
        let out = out_dir(&format!("woken-waits-{wakeup}-{unseen}"));
        let run = gputrace_env(
            &[
                // Every syscall seen: the sleepers' are a storm to the default budget.
                "--max-overhead",
                "100%",
                "-v",
                "-o",
                out.to_str().unwrap(),
                "--",
                bin.to_str().unwrap(),
                "2000",
                "3",
            ],
            &[
                ("GPUTRACE_SCHED_WAKEUP", wakeup),
                ("GPUTRACE_TEST_UNSEEN_SWITCH_INS", unseen),
            ],
        );
        assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr);
        if unseen == "1" {
            let drops = run.report(&out)["drops"].to_string();
            assert!(drops.contains("SwitchInUnseen"), "{drops}");
        }
        let truth: BTreeMap<u64, f64> = run
            .stdout
            .lines()
            .filter_map(|l| {
                let mut f = l.strip_prefix("sleeper ")?.split_whitespace();
                Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
            })
            .collect();
        assert_eq!(truth.len(), 3, "stdout:\n{}", run.stdout);
        let r = run.report(&out);
        let programs = programs_that_ran(&r);
        assert!(programs.contains(&"sched_switch_btf"), "{programs:?}");
        // A kernel whose BTF lacks the scheduler's delay accounting keeps the wake-up program
        // (-v says so); CI's kernel has it, and there the switch program must tell the waits.
        let told_by_wakeup = told_by_wakeup(&run.stderr);
        if wakeup == "0" && told_by_wakeup {
            assert!(
                std::env::var_os("CI").is_none(),
                "the CI kernel shows sched_info: {}",
                run.stderr
            );
            eprintln!(
                "NOTE: this kernel keeps the sched_wakeup program: {}",
                run.stderr
            );
        }
        assert_eq!(
            programs.contains(&"sched_wakeup_btf"),
            told_by_wakeup,
            "GPUTRACE_SCHED_WAKEUP={wakeup}: {programs:?}"
        );
        if wakeup == "1" {
            assert!(
                told_by_wakeup,
                "no -v note of the wake-up program: {}",
                run.stderr
            );
        }
        let threads = r["processes"][0]["threads"].as_array().unwrap();
        for (tid, kernel) in &truth {
            let t = threads
                .iter()
                .find(|t| t["tid"].as_u64() == Some(*tid))
                .unwrap_or_else(|| panic!("no sleeper {tid} in {threads:#?}"));
            let runqueue = |reason: Option<&str>| -> f64 {
                t["time"]["reasons"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|x| x["category"] == "runqueue")
                    .filter(|x| reason.is_none_or(|r| x["reason"] == r))
                    .map(|x| x["ns"].as_f64().unwrap())
                    .sum()
            };
            let (all, woken) = (runqueue(None), runqueue(Some("woken, waiting for a CPU")));
            // Measured here: within 0.35 ms of the kernel's ~95-100 ms without the program
            // (the sleepers read the kernel's figure after the hog stops: read beside it, a
            // sleeper preempted after its read waited 0.2-3.4 ms that only gputrace saw, and
            // CI runs failed at 4.7 ms over), 6-7.5 ms over it with (~3.3 us a wake-up: the
            // program times from the wake-up's tracepoint; the fallback path, for kernels
            // without `sched_info` in their BTF, and busier hosts moved it more before).
            let slack = if wakeup == "1" { 0.20 } else { 0.05 };
            assert!(
                (all - kernel).abs() <= slack * kernel + 2e6,
                "GPUTRACE_SCHED_WAKEUP={wakeup}, unseen switch-ins {unseen}: sleeper {tid} \
                 waited {all} ns on a runqueue, the kernel says {kernel}: {:#}",
                t["time"]
            );
            assert!(
                woken >= 0.5 * kernel,
                "GPUTRACE_SCHED_WAKEUP={wakeup}: sleeper {tid} waited {woken} ns after \
                 wake-ups of {kernel} in all: {:#}",
                t["time"]
            );
        }
    }
}

/// Where no issue program runs, a completion reads the block layer's issue stamp. A request
/// without one (its queue's statistics went off during the trace; here a test hook makes every
/// stamp read as missing) is still counted, timed from its allocation with its queueing in its
/// latency, and the report says how many were (`BlockIssueUnstamped`).
#[test]
fn block_requests_without_issue_stamps_are_timed_from_their_allocation() {
    let _g = serial();
    if !require_root("block_requests_without_issue_stamps_are_timed_from_their_allocation") {
        return;
    }
    // On the root disk: O_DIRECT there reaches the block layer.
    let file = tmp_dir().join(format!("unstamped-{}.bin", std::process::id()));
    std::fs::write(&file, vec![7u8; 4 << 20]).unwrap();
    std::process::Command::new("sync").status().unwrap();
    let out = out_dir("unstamped");
    let reads = 128;
    let run = gputrace_env(
        &[
            "-v",
            "-o",
            out.to_str().unwrap(),
            "--",
            "/usr/bin/dd",
            &format!("if={}", file.display()),
            "of=/dev/null",
            "bs=32k",
            &format!("count={reads}"),
            "iflag=direct",
        ],
        &[("GPUTRACE_TEST_UNSTAMPED_ISSUES", "1")],
    );
    let _ = std::fs::remove_file(&file);
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr);
    let report = run.report(&out);
    let dd = &report["processes"][0];
    let rows = &dd["block_io"];
    let requests = sum_of(rows, "requests");
    // Completions may run no program (on the development VM 0-0.2% of a loader's a run, and
    // once in CI 24 of these 128: why is not established). What was not seen completing is
    // said in the blind spots, never lost silently.
    let told = blind_spot_names(&report, &dd["pid"]);
    // dd's own reads of other files (its libraries' or locale's pages, when another test's I/O
    // pushed them out of the cache: 9 of 4 KiB once in a whole e2e run) are its requests too.
    let others = sum_of(rows, "read_bytes").saturating_sub(reads * 32 * 1024) / 4096;
    assert!(
        requests >= reads / 2 && requests <= reads + others + 8 && (requests >= reads || told),
        "{requests} requests for {reads} direct reads: {rows:#}\ndrops: {:#}\nblind spots: {:#}",
        report["drops"],
        report["blind_spots"]
    );
    assert!(sum_of(rows, "total_ns") > 0, "{rows:#}");
    let unstamped = field_of(&report["drops"], "reason", "BlockIssueUnstamped", "count");
    if run
        .stderr
        .contains("block requests timed from a block_rq_issue program")
    {
        // A disk of this machine does not stamp its issues: the issue program times them all.
        assert_eq!(unstamped, 0, "{:#}", report["drops"]);
        eprintln!(
            "NOTE: this machine's disks do not all stamp their issues; the issue program ran"
        );
        return;
    }
    assert!(
        run.stderr
            .contains("block requests timed from the kernel's issue stamps"),
        "stderr:\n{}",
        run.stderr
    );
    assert!(
        unstamped >= requests,
        "{unstamped} unstamped of {requests}: {:#}",
        report["drops"]
    );
    assert_eq!(sum_of(rows, "queue_ns"), 0, "{rows:#}");
}

/// A loop device on a file of `mib` MiB, detached and its file removed when dropped (a failed
/// test leaves neither behind).
struct LoopDevice(String, std::path::PathBuf);

impl LoopDevice {
    /// None (after a loud message) where loop devices cannot be made (no `losetup`, no
    /// `/dev/loop-control` in a container); a failure when `CI` is set.
    fn new(name: &str, mib: usize) -> Option<LoopDevice> {
        let file = tmp_dir().join(format!("{name}-{}.img", std::process::id()));
        std::fs::write(&file, vec![1u8; mib << 20]).unwrap();
        let out = std::process::Command::new("losetup")
            .args(["--find", "--show"])
            .arg(&file)
            .output();
        match out {
            Ok(o) if o.status.success() => Some(LoopDevice(
                String::from_utf8_lossy(&o.stdout).trim().to_string(),
                file,
            )),
            other => {
                let _ = std::fs::remove_file(&file);
                let msg = format!("\n!!! SKIPPED: no loop device ({other:?}) !!!\n");
                assert!(std::env::var_os("CI").is_none(), "{msg}CI is set");
                eprintln!("{msg}");
                None
            }
        }
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup")
            .args(["--detach", &self.0])
            .status();
        let _ = std::fs::remove_file(&self.1);
    }
}

/// Two threads read the same sectors of two disks at once, each round starting together (an
/// md mirror's two copies of a write are such a pair). Each disk's requests are its reader's,
/// all of them: an owner remembered by sector alone went to whichever disk's request came
/// first, and the other disk's went uncounted (a quarter of each loop device's requests here
/// where no issue program runs, 1-3% where one does).
#[test]
fn block_requests_at_one_sector_of_two_disks_keep_their_owners() {
    let _g = serial();
    if !require_root("block_requests_at_one_sector_of_two_disks_keep_their_owners") {
        return;
    }
    let bin = build_c("mirror_reads", &[]);
    let Some(disks) = ["mirror-a", "mirror-b"]
        .iter()
        .map(|n| LoopDevice::new(n, 1))
        .collect::<Option<Vec<_>>>()
    else {
        return;
    };
    let rounds = 2000u64;
    // With the remap program too, which this machine's devices do not need (none is stacked):
    // it must load, and leave the owners as they are.
    let envs: [&[(&str, &str)]; 3] = [
        &[],
        &[("GPUTRACE_BLOCK_ISSUE", "1")],
        &[("GPUTRACE_BLOCK_REMAP", "1")],
    ];
    for env in envs {
        let out = out_dir("mirror");
        // Every request counted (none sampled on a machine fast enough to pass 4,000 a
        // second): this is about whose each one is.
        let run = gputrace_env(
            &[
                "-v",
                "--max-overhead",
                "100%",
                "-o",
                out.to_str().unwrap(),
                "--",
                bin.to_str().unwrap(),
                &disks[0].0,
                &disks[1].0,
                &rounds.to_string(),
            ],
            env,
        );
        assert_eq!(run.code(), 0, "{env:?} stderr:\n{}", run.stderr);
        let remap = env.contains(&("GPUTRACE_BLOCK_REMAP", "1"));
        assert!(
            !remap || run.stderr.contains("program block_bio_remap_btf:"),
            "block_bio_remap_btf not attached:\n{}",
            run.stderr
        );
        let report = run.report(&out);
        let p = &report["processes"][0];
        let told = blind_spot_names(&report, &p["pid"]);
        for disk in &disks {
            let name = disk.0.trim_start_matches("/dev/");
            let row = p["block_io"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["device"].as_str().unwrap().ends_with(&format!(" {name}")))
                .unwrap_or_else(|| panic!("{env:?}: no row for {name}: {:#}", p["block_io"]));
            let requests = row["requests"].as_u64().unwrap();
            let submitted = row["read_bytes"].as_u64().unwrap();
            let completed = row["completed_bytes"].as_u64().unwrap();
            // Completions that ran no program (one of 2,000 in CI run 56) are allowed only a
            // few, and past the blind spots' 0.1% only where they say so: the lost owners of
            // the sector-only key cost 1-3% and more.
            let said = told || submitted.saturating_sub(completed) * 1000 <= submitted;
            assert!(
                submitted == rounds * 4096
                    && requests * 1000 >= rounds * 995
                    && requests <= rounds
                    && completed <= submitted
                    && said,
                "{env:?} {name}: {requests} requests of {rounds}, {completed} of {submitted} \
                 bytes seen completing: {row:#}\nblind spots: {:#}",
                report["blind_spots"]
            );
        }
    }
}

/// A wait with no kernel stack (the walks off here) is told by the file under its fd. One
/// whose syscall never returns (an idle worker's read of its pipe, from after the attach to
/// the end) left no I/O row that /proc named during the trace: /proc names it at the end. It
/// read as disk I/O, the `read` syscall's own rule.
#[test]
fn a_read_that_never_returns_is_told_by_its_file() {
    let _g = serial();
    if !require_root("a_read_that_never_returns_is_told_by_its_file") {
        return;
    }
    // `cat` starts reading its stdin, a pipe the test holds and never writes, once the trace
    // is attached (a debug build attaches in 1-3 s; checked below): a read under way at the
    // attach is told by its kernel stack from /proc.
    let started = std::time::SystemTime::now();
    let mut sh = std::process::Command::new("sh")
        .args(["-c", "sleep 6; exec cat"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("spawn sh");
    let pid = sh.id().to_string();
    let out = out_dir("never-returns");
    let run = gputrace_env(
        &["-d", "9s", "-o", out.to_str().unwrap(), "-p", &pid],
        &[("GPUTRACE_OFFCPU_STACKS", "0")],
    );
    let _ = sh.kill();
    let _ = sh.wait();
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr);
    let report = run.report(&out);
    let w = &report["window"];
    let attached_ns =
        w["start_unix_ns"].as_u64().unwrap() as f64 + w["attach_ms"].as_f64().unwrap() * 1e6;
    let read_from = started
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as f64
        + 6e9;
    assert!(
        attached_ns < read_from,
        "attached {:.1} s after `cat` began to read: the test needs the read to begin in the trace",
        (attached_ns - read_from) / 1e9
    );
    let p = report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == sh.id())
        .unwrap_or_else(|| panic!("no process {pid}: {:#}", report["processes"]));
    let reasons = p["time"]["reasons"].as_array().unwrap();
    // cat's read of the pipe, seconds long, is ipc. The exec'd cat's loader also reads its
    // libraries with read(): a page-cache miss there is disk I/O (CI run 74 had one of
    // 0.28 ms), never a wait of the pipe's length.
    let read_ns: u64 = reasons
        .iter()
        .filter(|r| r["reason"] == "read")
        .filter(|r| {
            let ns = r["ns"].as_u64().unwrap();
            assert!(
                r["category"] == "ipc" || ns < 100_000_000,
                "a read of a pipe: {reasons:#?}"
            );
            r["category"] == "ipc"
        })
        .map(|r| r["ns"].as_u64().unwrap())
        .sum();
    assert!(read_ns >= 1_000_000_000, "cat's read: {reasons:#?}");
}

/// A `--pid` trace accounts each thread over the window, not beyond it: the threads were
/// seeded as the accounting attached, ~0.2 s before the window opened (the other families
/// attach after it), and the programs ran on until they were detached once the CPU profile
/// was symbolised; a 0.3 s trace of a sleeping process reported it alive for 0.42-0.48 s.
#[test]
fn a_pid_trace_accounts_threads_over_its_window_only() {
    let _g = serial();
    if !require_root("a_pid_trace_accounts_threads_over_its_window_only") {
        return;
    }
    let hot = build_c("hot_threads", &[]);
    let target = crate::faults::Bg::spawn(std::process::Command::new(&hot).arg("30"));
    let sleeper = crate::faults::Bg::spawn(std::process::Command::new("sleep").arg("30"));
    std::thread::sleep(std::time::Duration::from_millis(200));
    for pid in [target.pid(), sleeper.pid()] {
        let out = out_dir(&format!("pid-window-{pid}"));
        let run = gputrace(&[
            "--pid",
            &pid.to_string(),
            "-d",
            "300ms",
            "-o",
            out.to_str().unwrap(),
        ]);
        assert_eq!(run.code(), 0, "{}", run.stderr);
        let r = run.report(&out);
        let window = r["window"]["duration_ns"].as_f64().unwrap();
        let threads = r["processes"][0]["threads"].as_array().unwrap();
        assert!(!threads.is_empty(), "{r:#}");
        for t in threads {
            let alive = t["time"]["alive_ns"].as_f64().unwrap();
            // The seeding reads the clock just before the window opens, the stop just after
            // it closes: a few ms, not the attach or the report.
            assert!(
                alive <= window + 10e6 && alive >= window - 10e6,
                "tid {} alive {alive} ns in a {window} ns window",
                t["tid"]
            );
        }
    }
}

/// A parent in vfork waits on its child (which sleeps 300 ms before it execs, three times):
/// `ipc`, reason `vfork`, not the `io` an uninterruptible sleep outside a known wait is, and
/// no verdict takes it for data loading or disk I/O.
#[test]
fn a_vfork_parent_waits_on_its_child() {
    let _g = serial();
    if !require_root("a_vfork_parent_waits_on_its_child") {
        return;
    }
    let (out, run) = trace_workload("vfork_spawn", &["3", "300"]);
    let report = run.report(&out);
    let parent = process_named(&report, "vfork_spawn");
    let time = &parent["threads"][0]["time"];
    let cats = categories(time);
    assert!(
        cats.get("ipc").copied().unwrap_or(0.0) > 80.0,
        "{cats:?}\n{time:#}"
    );
    assert!(cats.get("io").copied().unwrap_or(0.0) < 5.0, "{cats:?}");
    let vfork_ns: u64 = time["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["category"] == "ipc" && r["reason"] == "vfork")
        .map(|r| r["ns"].as_u64().unwrap())
        .sum();
    assert!(vfork_ns > 800_000_000, "{time:#}");
    let findings = report["findings"].to_string();
    for wrong in ["data-loading-bound", "io-bound"] {
        assert!(!findings.contains(wrong), "{findings}");
    }
}

/// Threads that name themselves and end between two looks at /proc keep the names they died
/// with, in the JSON and the off-CPU stacks alike (they were nameless, and `?` in the folded
/// stacks beside their CPU samples' names).
#[test]
fn threads_that_end_between_looks_at_proc_keep_their_names() {
    let _g = serial();
    if !require_root("threads_that_end_between_looks_at_proc_keep_their_names") {
        return;
    }
    let (out, run) = trace_workload("short_named", &["4"]);
    let report = run.report(&out);
    let p = process_named(&report, "short_named");
    let names: Vec<&str> = p["threads"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["comm"].as_str())
        .collect();
    for i in 0..4 {
        let want = format!("short_{i}");
        assert!(names.contains(&want.as_str()), "no {want} in {names:?}");
    }
    let folded = std::fs::read_to_string(out.join("offcpu.folded")).unwrap();
    assert!(!folded.lines().any(|l| l.starts_with("?-")), "{folded}");
}

/// A thread other than the leader burns 300 ms and execs `sleep 1.5`: its old id's life ends
/// at the exec, and the sleeping image runs on under the leader's id. Its old id never
/// switched out again and stayed on a CPU to the window's end (~1.8 s of CPU for 0.3 s
/// burned), and a CRITICAL CPU finding blamed it.
#[test]
fn a_thread_that_execs_ends_its_old_life_there() {
    let _g = serial();
    if !require_root("a_thread_that_execs_ends_its_old_life_there") {
        return;
    }
    let (out, run) = trace_workload("thread_exec", &["/bin/sleep", "1.5"]);
    let report = run.report(&out);
    let p = &report["processes"][0];
    let cpu_ns: f64 = p["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            t["time"]["categories"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|c| c["category"] == "cpu")
                .map(|c| c["ns"].as_f64().unwrap())
                .sum::<f64>()
        })
        .sum();
    // 300 ms burned, and a little more around the exec.
    assert!(
        (0.2e9..0.6e9).contains(&cpu_ns),
        "{cpu_ns} ns on CPU\n{:#}",
        p["threads"]
    );
    let window = report["window"]["duration_ns"].as_f64().unwrap();
    let alive: f64 = p["threads"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["time"]["alive_ns"].as_f64())
        .sum();
    // The leader until the exec, the worker until the exec, the image after it: about one
    // window and the worker's 0.3 s, not two windows.
    assert!(
        alive < 1.5 * window,
        "alive {alive} in a window of {window}"
    );
    let findings = report["findings"].to_string();
    assert!(!findings.contains("on CPU 9"), "{findings}");
}

/// 20,000 short children, each closing an fd (one fd generation each, in a map of 16,384),
/// then the parent reads two files in turn on one fd number: each file keeps its own name and
/// figures. The generations of exited processes were never forgotten, so the map was full by
/// then, the parent's closes started no new generation, and both files' I/O went under one
/// row named `<closed fd 5>`, with no drop counted.
#[test]
fn files_keep_their_names_after_many_short_processes() {
    let _g = serial();
    if !require_root("files_keep_their_names_after_many_short_processes") {
        return;
    }
    short_processes_leave_the_files_named("fd-churn", &[]);
}

/// The same with the processes past what gputrace remembers: their file rows were forgotten
/// by the exits of the processes it remembered, so those of the processes it did not stayed
/// in the maps for good. A shell loop traced for 10 minutes (535,000 processes) lost 279,451
/// file rows to a full map (`FileMapFull`).
#[test]
fn files_keep_their_names_after_more_short_processes_than_are_remembered() {
    let _g = serial();
    if !require_root("files_keep_their_names_after_more_short_processes_than_are_remembered") {
        return;
    }
    short_processes_leave_the_files_named("fd-churn-untracked", &[("GPUTRACE_MAX_TRACKED", "200")]);
}

/// Traces `fd_churn 20000` and checks the parent's two files and that no file row was lost.
fn short_processes_leave_the_files_named(name: &str, env: &[(&str, &str)]) {
    let bin = build_c("fd_churn", &[]);
    let work = tmp_dir().join(format!("{name}-files"));
    std::fs::create_dir_all(&work).unwrap();
    let dir = out_dir(name);
    let run = gputrace_env(
        &[
            "--max-overhead",
            "100%",
            "-o",
            dir.to_str().unwrap(),
            "--",
            bin.to_str().unwrap(),
            "20000",
            work.to_str().unwrap(),
        ],
        env,
    );
    assert_eq!(run.code(), 0, "{}", run.stderr);
    let report = run.report(&dir);
    // The parent (its children have its name).
    let (_, p) = crate::faults::target_process(&report);
    let listed = p["files"].as_array().expect("files");
    // Each file: written once in 64 KiB writes, then read 10 times to its end.
    for (name, bytes, calls) in [
        ("a.dat", 100_000u64, 2 + 10 * 3),
        ("b.dat", 300_000, 5 + 10 * 6),
    ] {
        let path = format!("{}/{name}", work.display());
        let f = listed
            .iter()
            .find(|f| f["file"] == path.as_str())
            .unwrap_or_else(|| panic!("{path} not named: {listed:#?}"));
        assert_eq!(f["bytes"].as_u64(), Some(11 * bytes), "{f}");
        assert_eq!(f["calls"].as_u64(), Some(calls), "{f}");
    }
    let drops = report["drops"].to_string();
    assert!(!drops.contains("FileMapFull"), "{drops}");
}

/// `rt_sigreturn` returns the register it restored (here pause's -EINTR), not a result: it
/// never counts as failing. Every one of 40 did, under errno EINTR.
#[test]
fn signal_returns_are_not_errors() {
    let _g = serial();
    if !require_root("signal_returns_are_not_errors") {
        return;
    }
    let (dir, run) = trace_workload("signal_loop", &["40"]);
    assert_eq!(run.code(), 0, "{}", run.stderr);
    let report = run.report(&dir);
    let (_, p) = crate::faults::target_process(&report);
    let row = p["syscalls"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "rt_sigreturn")
        .unwrap_or_else(|| panic!("no rt_sigreturn row: {:#}", p["syscalls"]));
    assert!(row["count"].as_u64().unwrap() >= 40, "{row:#}");
    assert_eq!(row["errors"].as_u64(), Some(0), "{row:#}");
}

/// A program that writes to its stdout only as it exits (a trainer's summary line), after
/// living long enough for a look at /proc, has that stdout named: the look names a process's
/// standard fds before any I/O on them. Named by nothing else (gputrace, its parent, is not
/// traced, and /proc is gone by the end), it read `<closed fd 1>`. The shell's `echo err >&2`
/// writes to fd 1 after a `dup2(2, 1)`: named as its stderr, not `<closed fd 1>`.
#[test]
fn stdout_written_only_at_the_exit_is_named() {
    let _g = serial();
    if !require_root("stdout_written_only_at_the_exit_is_named") {
        return;
    }
    let dir = out_dir("stdout-at-exit");
    let run = gputrace(&[
        "-o",
        dir.to_str().unwrap(),
        "--",
        "/bin/sh",
        "-c",
        "sleep 1.2; echo done; echo err >&2",
    ]);
    assert_eq!(run.code(), 0, "{}", run.stderr);
    let report = run.report(&dir);
    let root = &report["target"]["pids"][0];
    let shell = report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == *root)
        .expect("the shell");
    let files = shell["files"].as_array().expect("files");
    // "done\n" on stdout, then "err\n" through the dup.
    for bytes in [5, 4] {
        let rows: Vec<&str> = files
            .iter()
            .filter(|f| f["bytes"].as_u64() == Some(bytes))
            .filter_map(|f| f["file"].as_str())
            .collect();
        assert_eq!(rows.len(), 1, "{bytes} B: {files:#?}");
        assert!(!rows[0].starts_with("<closed"), "{bytes} B: {files:#?}");
    }
}

/// A shell's children that write to the stdout they inherited and exit before gputrace can
/// read their /proc (`/bin/echo`, 20 of them) have that stdout named as the shell's is (here
/// the pipe gputrace's own stdout is), not `<closed fd 1>`. A child whose stdout its shell
/// replaced (`$(seq ...)`, a pipe put on fd 1 with dup2) stays unnamed: the fd it copied is
/// its parent's, under a generation the child's counts do not know.
#[test]
fn inherited_stdout_is_named_after_the_parent_it_came_from() {
    let _g = serial();
    if !require_root("inherited_stdout_is_named_after_the_parent_it_came_from") {
        return;
    }
    let dir = out_dir("inherited-stdout");
    let script = "for i in $(seq 20); do echo parent $i; sleep 0.1; /bin/echo child $i; done";
    let run = gputrace(&["-o", dir.to_str().unwrap(), "--", "bash", "-c", script]);
    assert_eq!(run.code(), 0, "{}", run.stderr);
    let report = run.report(&dir);
    let procs = report["processes"].as_array().unwrap();
    let stdout_of = |p: &serde_json::Value| -> Option<String> {
        // The only file an echo writes to; the shell's is the one it wrote its 20 lines to.
        p["files"].as_array()?.iter().find_map(|f| {
            let name = f["file"].as_str()?;
            let writes = f["calls"].as_u64()?;
            let own = !name.starts_with("/usr/") && !name.starts_with("/lib");
            (own && (p["comm"] != "bash" || writes == 20)).then(|| name.to_string())
        })
    };
    let root = &report["target"]["pids"][0];
    let shell = procs.iter().find(|p| p["pid"] == *root).expect("the shell");
    let theirs = stdout_of(shell).unwrap_or_else(|| panic!("{:#}", shell["files"]));
    assert!(!theirs.starts_with("<closed"), "{theirs}");
    let echoes: Vec<Option<String>> = procs
        .iter()
        .filter(|p| p["comm"] == "echo")
        .map(stdout_of)
        .collect();
    assert_eq!(echoes.len(), 20, "{echoes:?}");
    // What a CI run's one unnamed echo (in ~100 runs) had, to tell why next time.
    let unnamed: Vec<String> = procs
        .iter()
        .filter(|p| p["comm"] == "echo" && stdout_of(p).as_deref() != Some(theirs.as_str()))
        .map(|p| format!("pid {} ppid {} files {}", p["pid"], p["ppid"], p["files"]))
        .collect();
    assert!(
        unnamed.is_empty(),
        "{theirs}: {echoes:?}\n{unnamed:#?}\nshell {}\ndrops {:#}\nwarnings {:#}\nsyscalls off {}",
        shell["pid"],
        report["drops"],
        report["warnings"],
        report["overhead"]["syscalls_off"]
    );
    let seq = procs.iter().find(|p| p["comm"] == "seq").expect("seq");
    assert_eq!(
        stdout_of(seq).as_deref(),
        Some("<closed fd 1>"),
        "{:#}",
        seq["files"]
    );
}
