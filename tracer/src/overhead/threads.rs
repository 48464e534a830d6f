//! What each traced thread paid for all of gputrace's probes, not only the CUDA ones: the
//! budget promises a ceiling per thread, and a thread that makes 200k syscalls a second pays
//! for the syscall tracepoints whatever the gate does with the launch probes.
//!
//! Each thread's hits are read off what the report counts for it (its syscalls, CPU samples,
//! switches out, wakeups, CUDA calls seen, its process's block requests shared by the
//! threads' disk waits) and priced at what a traced hit of each program costs: the
//! scheduler, syscall and block programs split their mean by path (`super::paths`), as most
//! of a busy machine's runs are other tasks' early returns; the others at their mean.
//! Switches are counted from the thread's off-CPU intervals: a wait inside a CUDA call is
//! charged to the call's category, not counted as an interval of its own, so a thread that
//! blocks in cudaDeviceSynchronize has its switches under-counted.
//! A program whose paths were not timed often enough keeps its mean, which prices a traced
//! thread's switches low on a busy machine; the figure is marked as an estimate.

use std::collections::HashMap;

use crate::report::model::{
    overhead::{Overhead, ProgramCost, ShortLived, ThreadCost, ThreadCostPart, WAITED_PART},
    time::{ReasonTime, SyscallStat, TimeBreakdown},
    ProcessReport, Report, ThreadReport,
};

/// The costs of program `name`'s versions: itself, and its raw or classic tracepoint variant.
fn versions<'a>(o: &'a Overhead, name: &'a str) -> impl Iterator<Item = &'a ProgramCost> {
    o.programs.iter().filter(move |p| {
        p.program == name
            || p.program.strip_suffix("_tp") == Some(name)
            || p.program.strip_suffix("_btf") == Some(name)
    })
}

/// What an early return of program `name` (any of its versions) cost, at the dearest of them.
fn early_per_hit(o: &Overhead, name: &str) -> f64 {
    versions(o, name)
        .map(|p| p.early_ns_per_hit())
        .fold(0.0, f64::max)
}

/// Mean cost of one traced hit of `name` (its raw or classic tracepoint variant alike), in ns.
fn per_hit(o: &Overhead, name: &str) -> f64 {
    let (mut hits, mut ns) = (0u64, 0.0);
    for p in versions(o, name) {
        hits += p.traced_hits();
        ns += p.traced_hits() as f64 * p.traced_ns_per_hit();
    }
    if hits == 0 {
        0.0
    } else {
        ns / hits as f64
    }
}

/// (switches out, wakeups): every blocking wait begins with a switch out and ends with a
/// wakeup (the runqueue wait after it, "woken, waiting for a CPU", is the same switch); a
/// preemption is a switch out with no wakeup. Wakeups are priced at `sched_wakeup`'s cost, 0
/// where that program does not run (the switch program tells the wait itself).
fn switches(t: &TimeBreakdown) -> (u64, u64) {
    let (mut blocked, mut preempted) = (0, 0);
    for r in &t.reasons {
        if r.category == "runqueue" {
            if r.reason == "preempted" {
                preempted += r.count;
            }
        } else if r.category != "cpu" && !r.category.starts_with("cuda_") {
            blocked += r.count;
        }
    }
    (blocked + preempted, blocked)
}

/// Below this the contention is not worth a word (nor its noise a figure).
const CONTENTION_SHOWN: f64 = 1.05;
/// A thread that ran a tenth of the time it waited preempted is taken at this: past it, its
/// CPU time is too small a base to multiply.
const CONTENTION_MAX: f64 = 10.0;

/// How much wall time a ns of CPU costs the thread: 1 plus its preempted waits for a CPU per
/// ns it ran. The probes run on the thread's CPU time, and where runnable threads outnumber
/// the CPUs the scheduler makes it wait in proportion: two CPU hogs beside a launch storm
/// left its probes at 1.8% of its alive time but 4.5% of its CPU time, which is what it was
/// slowed by. Waits after a wake-up (`woken, waiting for a CPU`) are per wake-up, not per ns
/// of CPU, and are left out; time inside CUDA calls counts as CPU time, bar synchronisation.
fn contention(t: &TimeBreakdown) -> f64 {
    let on_cpu: u64 = t
        .categories
        .iter()
        .filter(|c| {
            c.category == "cpu" || (c.category.starts_with("cuda_") && c.category != "cuda_sync")
        })
        .map(|c| c.ns)
        .sum();
    let preempted: u64 = t
        .reasons
        .iter()
        .filter(|r| r.category == "runqueue" && r.reason == "preempted")
        .map(|r| r.ns)
        .sum();
    if on_cpu == 0 {
        return 1.0;
    }
    (1.0 + preempted as f64 / on_cpu as f64).min(CONTENTION_MAX)
}

/// CUDA calls the probes saw on a thread: launches, copies and syncs were scaled up when the
/// budget sampled them, and cost only what was seen.
fn cuda_calls_seen(r: &Report, o: &Overhead, pid: u32, tid: u32) -> f64 {
    let Some(c) = r
        .processes
        .iter()
        .find(|p| p.pid == pid)
        .and_then(|p| p.cuda.as_ref())
    else {
        return 0.0;
    };
    c.threads
        .iter()
        .filter(|t| t.tid == tid)
        .flat_map(|t| t.api.iter())
        .map(|a| a.count as f64 * o.seen_share(&a.function))
        .sum()
}

/// How long thread `t` was alive in the window (0 without a time breakdown).
fn alive_ns(t: &ThreadReport) -> u64 {
    t.time.as_ref().map_or(0, |tb| tb.alive_ns)
}

/// Blocking waits on disk I/O: how a process's block requests are shared among its threads.
fn io_waits(t: &ThreadReport) -> u64 {
    t.time.as_ref().map_or(0, |tb| {
        tb.reasons
            .iter()
            .filter(|r| r.category == "io")
            .map(|r| r.count)
            .sum()
    })
}

/// The syscalls thread `tid` made while the syscall programs had stopped themselves at a
/// storm and were still attached: all of them for the costliest storming thread, which made
/// most of them (the kernel counts them for every traced thread together), none for the rest.
fn stopped_syscalls(o: &Overhead, tid: u32) -> u64 {
    o.syscalls_off
        .as_ref()
        .filter(|s| s.threads.first().is_some_and(|t| t.tid == tid))
        .map_or(0, |s| s.halted_calls)
}

/// Calls of the syscalls `names` among `calls` that succeeded.
fn succeeded(calls: &[SyscallStat], names: &[&str]) -> u64 {
    calls
        .iter()
        .filter(|s| names.contains(&s.name.as_str()))
        .map(|s| s.count.saturating_sub(s.errors))
        .sum()
}

/// What the fork, exec and exit programs cost a thread, each run in the context it pays in:
/// a fork's (`task_newtask`, the accounting's `acct_newtask`, `sched_wakeup_new`) in the
/// thread that made the child, counted from its successful clone, clone3, fork and vfork
/// calls, threads too; an exec's (`sched_process_exec`, `task_rename`) in the thread that
/// exec'd; an exit's (`sched_process_exit`, the CUDA family's `cuda_thread_exit`) in the
/// thread that exited: every thread of a process that exited, and a thread of a live process
/// that called `exit`. A short child pays these once each, ~3-4 µs on this guest: part of
/// what a loop of them costs.
fn lifecycle_ns(o: &Overhead, calls: &[SyscallStat], process_exited: bool) -> f64 {
    let forks = succeeded(calls, &["clone", "clone3", "fork", "vfork"]) as f64;
    let execs = succeeded(calls, &["execve", "execveat"]) as f64;
    let exits = if process_exited || calls.iter().any(|s| s.name == "exit" && s.count > 0) {
        1.0
    } else {
        0.0
    };
    forks
        * (per_hit(o, "task_newtask") + per_hit(o, "acct_newtask") + per_hit(o, "sched_wakeup_new"))
        + execs * (per_hit(o, "sched_process_exec") + per_hit(o, "task_rename"))
        + exits * (per_hit(o, "sched_process_exit") + per_hit(o, "cuda_thread_exit"))
}

/// One thread's cost by what caused it (ns), largest first; parts with no cost are left out.
/// `calls`: its syscalls (its own table, or its share of its process's rows no thread lists,
/// see [`unplaced`]). `requests`: the block requests charged to it (submitted in its context,
/// bar the completion), and of them those `seen`, counted: while requests are sampled the
/// others ran the block programs' early returns only.
fn thread_parts(
    r: &Report,
    o: &Overhead,
    (pid, process_exited): (u32, bool),
    t: &ThreadReport,
    calls: &[SyscallStat],
    (requests, seen): (f64, f64),
) -> Vec<ThreadCostPart> {
    let syscalls: u64 = calls.iter().map(|s| s.count).sum();
    let (switches, wakeups) = t.time.as_ref().map_or((0, 0), switches);
    let mut cuda = cuda_calls_seen(r, o, pid, t.tid)
        * (per_hit(o, tracer_common::cuda::ENTRY_PROG) + per_hit(o, tracer_common::cuda::RET_PROG));
    // The window closes' traps, paid by the thread the gate charged them to.
    if let Some(w) = o.worst_thread.as_ref().filter(|w| w.tid == t.tid) {
        let alive = alive_ns(t) as f64;
        cuda = cuda.max(w.estimated * alive);
    }
    let mut parts: Vec<ThreadCostPart> = [
        (
            "syscall tracepoints",
            syscalls as f64 * (per_hit(o, "sys_enter") + per_hit(o, "sys_exit")),
        ),
        (
            "scheduler tracepoints",
            switches as f64 * per_hit(o, "sched_switch")
                + wakeups as f64 * per_hit(o, "sched_wakeup"),
        ),
        ("CPU sampler", t.samples as f64 * per_hit(o, "cpu_sample")),
        ("block I/O tracepoints", {
            let progs = [
                "block_bio_queue",
                "block_rq_insert",
                "block_rq_issue",
                "block_rq_complete",
            ];
            let counted: f64 = progs.iter().map(|n| per_hit(o, n)).sum();
            let passed: f64 = progs.iter().map(|n| early_per_hit(o, n)).sum();
            seen * counted + (requests - seen).max(0.0) * passed
        }),
        ("CUDA probes", cuda),
        (
            "fork, exec and exit tracepoints",
            lifecycle_ns(o, calls, process_exited),
        ),
        (
            "syscall tracepoints, stopped",
            stopped_syscalls(o, t.tid) as f64
                * (early_per_hit(o, "sys_enter") + early_per_hit(o, "sys_exit")),
        ),
    ]
    .into_iter()
    .filter(|(_, ns)| *ns >= 1.0)
    .map(|(what, ns)| ThreadCostPart {
        what: what.into(),
        ns: ns as u64,
    })
    .collect();
    parts.sort_by_key(|p| std::cmp::Reverse(p.ns));
    parts
}

/// A process's syscalls that no thread of it lists, by name (count and errors): the rows of
/// exited threads folded into the process's past the retired rows' cap (`accounting::retire`),
/// whose threads list none. Empty when the threads' tables hold every call.
fn unplaced(p: &ProcessReport) -> Vec<SyscallStat> {
    // Summed once: a thread storm's process lists thousands of threads before the report is
    // bounded.
    let mut listed: HashMap<&str, (u64, u64)> = Default::default();
    for x in p.threads.iter().flat_map(|t| &t.syscalls) {
        let e = listed.entry(x.name.as_str()).or_default();
        e.0 += x.count;
        e.1 += x.errors;
    }
    p.syscalls
        .iter()
        .filter_map(|s| {
            let (count, errors) = listed.get(s.name.as_str()).copied().unwrap_or_default();
            let left = s.count.saturating_sub(count);
            (left > 0).then(|| SyscallStat {
                name: s.name.clone(),
                count: left,
                errors: s.errors.saturating_sub(errors).min(left),
                ..Default::default()
            })
        })
        .collect()
}

/// `calls` scaled by `share` (rounded).
fn share_of(calls: &[SyscallStat], share: f64) -> Vec<SyscallStat> {
    calls
        .iter()
        .map(|s| SyscallStat {
            name: s.name.clone(),
            count: (s.count as f64 * share).round() as u64,
            errors: (s.errors as f64 * share).round() as u64,
            ..Default::default()
        })
        .collect()
}

/// Each traced thread that was alive in the window: its process's pid, the thread, what the
/// probes cost it (largest first), how much a ns of its CPU cost it (`contention`), its alive
/// time, and whether its syscalls are known: false for a thread that lists none in a process
/// with no rows to share out (its rows were not kept past the cap, or it made no syscall that
/// returned). A thread that lists no syscalls of its own is charged a share of its
/// process's rows that no thread lists, by its alive time among such threads: under process
/// churn, past 100,000 retired rows, a short child's rows are its process's only.
fn for_each_cost(
    r: &Report,
    o: &Overhead,
    mut f: impl FnMut(u32, &ThreadReport, Vec<ThreadCostPart>, f64, u64, bool),
) {
    for p in &r.processes {
        let left = unplaced(p);
        let takers: u64 = p
            .threads
            .iter()
            .filter(|t| t.syscalls.is_empty())
            .map(alive_ns)
            .sum();
        let requests: u64 = p.block_io.iter().map(|b| b.requests).sum();
        let seen: u64 = p
            .block_io
            .iter()
            .map(|b| b.sampled.as_ref().map_or(b.requests, |s| s.seen))
            .sum();
        let waits: u64 = p.threads.iter().map(io_waits).sum();
        for t in &p.threads {
            let alive = alive_ns(t);
            if alive == 0 {
                continue;
            }
            let share = if waits == 0 {
                0.0
            } else {
                io_waits(t) as f64 / waits as f64
            };
            let mine = (requests as f64 * share, seen as f64 * share);
            let shared;
            let calls: &[SyscallStat] = if t.syscalls.is_empty() && !left.is_empty() {
                shared = share_of(&left, alive as f64 / takers.max(1) as f64);
                &shared
            } else {
                &t.syscalls
            };
            let known = !calls.is_empty();
            let parts = thread_parts(r, o, (p.pid, p.exited), t, calls, mine);
            let stretch = t.time.as_ref().map_or(1.0, contention);
            f(p.pid, t, parts, stretch, alive, known);
        }
    }
}

/// The children `p` forked in the trace, as its syscalls tell: its successful clone-family
/// calls less the threads it made (each of its threads but the first came of one; fewer
/// children where some threads were there before the trace).
fn forked(p: &ProcessReport) -> u64 {
    let clones = succeeded(&p.syscalls, &["clone", "clone3", "fork", "vfork"]);
    clones.saturating_sub(p.threads.len().saturating_sub(1) as u64)
}

/// The syscalls a parent blocks in until a child ends.
const CHILD_WAITS: [&str; 3] = ["wait4", "waitid", "waitpid"];

/// How long thread `t` was off CPU for the reasons `keep` picks.
fn blocked_ns(t: &ThreadReport, keep: impl Fn(&ReasonTime) -> bool) -> u64 {
    t.time.as_ref().map_or(0, |tb| {
        tb.reasons.iter().filter(|r| keep(r)).map(|r| r.ns).sum()
    })
}

/// How long thread `t` was blocked waiting for a child to end.
fn child_waits(t: &ThreadReport) -> u64 {
    blocked_ns(t, |r| CHILD_WAITS.contains(&r.reason.as_str()))
}

/// How long thread `t` was blocked on another process through the kernel (a pipe, a unix
/// socket, a terminal, a vfork) other than in a wait for a child to end: a shell reading a
/// child's output (`$(cmd)`) waits as long as the child writes, and is in `wait4` only for
/// its exit. (A `poll` or `select` on the pipes, as Python's `communicate()` does with two,
/// is in the `poll` category: not counted.)
fn ipc_waits(t: &ThreadReport) -> u64 {
    blocked_ns(t, |r| {
        r.category == "ipc" && !CHILD_WAITS.contains(&r.reason.as_str())
    })
}

/// What the probes of the children each thread waited for added to its wait (ns), by (pid,
/// tid); `own`: what each thread's own probes added to its time (its parts times its
/// contention).
///
/// A parent blocked in `wait4` until a child ends waits as long as the child runs, probes
/// included: a shell loop of short children, whose shell is alive the whole loop, paid its
/// children's probes in its waits, 8% of its time here where its own probes were 1.3%. A
/// process delays its parent by its slowest thread's own and waited-for cost. The children's
/// delays are scaled by the parent's waits over their summed lives: 1 where it waited for them
/// one after another; less where they ran side by side (`make -j8`: an eighth), or where it
/// did not wait for all of them; more where it waited longer than the children the report
/// knows lived (the rest taken at the known ones' cost per ns), up to all of its waits.
///
/// Waits through a pipe or another kernel channel count too, but only up to the part of the
/// children's lives not waited in `wait4`: whom such a wait was on is not known, and a server
/// that ran one short child and then waited an hour on its sockets waited for the child its
/// life at most. That bounds the time, not whom it was spent on: a wait on a terminal or on
/// another process fills the room the children's lives leave (a pipeline's shell reading its
/// script from a pipe is charged each stage's probes, not the slowest stage's), at most at
/// the children's cost per ns of their lives. Children the report no longer holds (past the
/// tracker's cap, a loop's exited children are forgotten) are taken to have lived as the
/// known ones did, by the parent's forks.
fn waited_for_children(r: &Report, own: &HashMap<(u32, u32), f64>) -> HashMap<(u32, u32), f64> {
    let procs = &r.processes;
    let mut index: HashMap<u32, usize> = HashMap::with_capacity(procs.len());
    for (i, p) in procs.iter().enumerate() {
        index.entry(p.pid).or_insert(i);
    }
    let mut children: HashMap<usize, Vec<usize>> = HashMap::new();
    for (i, p) in procs.iter().enumerate() {
        if let Some(&parent) = p.ppid.and_then(|pp| index.get(&pp)) {
            if parent != i {
                children.entry(parent).or_default().push(i);
            }
        }
    }
    // Per process: the delay it adds to a parent that waits for it.
    let mut delay = vec![0.0; procs.len()];
    #[derive(Clone, Copy, PartialEq)]
    enum Seen {
        Not,
        Summing,
        Done,
    }
    let mut seen = vec![Seen::Not; procs.len()];
    let mut out = HashMap::new();
    let none = Vec::new();
    for root in 0..procs.len() {
        // Post-order without recursion: a chain of processes may be thousands deep.
        let mut stack = vec![(root, false)];
        while let Some((i, expanded)) = stack.pop() {
            let kids = children.get(&i).unwrap_or(&none);
            if !expanded {
                if seen[i] != Seen::Not {
                    continue;
                }
                seen[i] = Seen::Summing;
                stack.push((i, true));
                stack.extend(
                    kids.iter()
                        .filter(|&&c| seen[c] == Seen::Not)
                        .map(|&c| (c, false)),
                );
                continue;
            }
            seen[i] = Seen::Done;
            let p = &procs[i];
            let (mut sum, mut lives, mut known) = (0.0, 0u64, 0u64);
            // A child still being summed is an ancestor under a reused pid: it adds nothing.
            for &c in kids.iter().filter(|&&c| seen[c] == Seen::Done) {
                sum += delay[c];
                lives += procs[c].threads.iter().map(alive_ns).max().unwrap_or(0);
                known += 1;
            }
            let all_lives = lives as f64 * forked(p).max(known) as f64 / known.max(1) as f64;
            let in_wait: u64 = p.threads.iter().map(child_waits).sum();
            let in_ipc: u64 = p.threads.iter().map(ipc_waits).sum();
            let by_ipc = in_ipc.min((all_lives as u64).saturating_sub(in_wait));
            // Of each ns a thread waited through IPC, what counts.
            let ipc_part = by_ipc as f64 / in_ipc.max(1) as f64;
            let waits = in_wait + by_ipc;
            // Never more than it waited: a parent that waited 10 s for children the report
            // knows 1 ms of would otherwise multiply their cost by 10,000.
            let inherited = if waits == 0 || lives == 0 {
                0.0
            } else {
                (sum * waits as f64 / lives as f64).min(waits as f64)
            };
            let mut slowest: f64 = 0.0;
            for t in &p.threads {
                let waited = child_waits(t) as f64 + ipc_waits(t) as f64 * ipc_part;
                let mine = inherited * waited / waits.max(1) as f64;
                if mine >= 1.0 {
                    out.insert((p.pid, t.tid), mine);
                }
                slowest = slowest.max(own.get(&(p.pid, t.tid)).copied().unwrap_or(0.0) + mine);
            }
            delay[i] = slowest;
        }
    }
    out
}

/// The traced thread that paid the largest share of its time for the probes, its own and
/// those of the children it waited for. Threads alive for under `min_alive_ns` are passed
/// over: a thread that lived a millisecond and was caught by one sample is not what the
/// budget is about (they are [`short_lived`]).
pub fn costliest_thread(r: &Report, min_alive_ns: u64) -> Option<ThreadCost> {
    let o = r.overhead.as_ref()?;
    let mut own: HashMap<(u32, u32), f64> = HashMap::new();
    let mut candidates = Vec::new();
    for_each_cost(r, o, |pid, t, parts, stretch, alive, _| {
        let ns: u64 = parts.iter().map(|p| p.ns).sum();
        own.insert((pid, t.tid), ns as f64 * stretch);
        // The rows dead threads were folded into are no thread to name.
        if alive >= min_alive_ns && t.tid != crate::accounting::aggregate::FOLDED_TID {
            candidates.push((pid, t.tid, t.comm.clone(), parts, stretch, alive));
        }
    });
    let waited = waited_for_children(r, &own);
    let mut best: Option<(f64, ThreadCost)> = None;
    for (pid, tid, comm, mut parts, stretch, alive) in candidates {
        let ns: u64 = parts.iter().map(|p| p.ns).sum();
        let children = waited.get(&(pid, tid)).copied().unwrap_or(0.0);
        // Already time the thread waited: not stretched by its contention.
        let share = (ns as f64 * stretch + children) / alive as f64;
        if best.as_ref().is_some_and(|(s, _)| share <= *s) {
            continue;
        }
        if children >= 1.0 {
            parts.push(ThreadCostPart {
                what: WAITED_PART.into(),
                ns: children as u64,
            });
            parts.sort_by_key(|p| std::cmp::Reverse(p.ns));
        }
        best = Some((
            share,
            ThreadCost {
                pid,
                tid,
                comm,
                // The model stretches CPU time by the thread's preempted waits; where that
                // puts the probes past its whole life (a syscall storm beside CPU hogs), they
                // took at most all of it. Compared uncapped: of two such threads, the one
                // whose probes cost more is named.
                estimated: share.min(1.0),
                parts,
                contention: (stretch >= CONTENTION_SHOWN).then_some(stretch),
            },
        ));
    }
    best.map(|(_, c)| c)
}

/// The threads alive for under `min_alive_ns`, together: what they paid over their summed
/// lives. A thread's own share would be one CPU sample's noise in a millisecond's life; the
/// group's is what a loop of short processes pays, most of it its syscalls and switches,
/// which are counted, not sampled. The rows dead threads were folded into
/// ([`crate::accounting::aggregate::FOLDED_TID`]) are no thread's: left out.
pub fn short_lived(r: &Report, min_alive_ns: u64) -> Option<ShortLived> {
    let o = r.overhead.as_ref()?;
    let mut g = ShortLived {
        under_ns: min_alive_ns,
        ..Default::default()
    };
    let mut paid = 0.0;
    // While the syscall tracepoints were off, a thread's missing rows are what it paid: early
    // returns, charged to the storm.
    let off = o.syscalls_off.is_some();
    for_each_cost(r, o, |_, t, parts, stretch, alive, known| {
        if alive >= min_alive_ns || t.tid == crate::accounting::aggregate::FOLDED_TID {
            return;
        }
        // A share over threads whose syscalls are unknown would read low: they are left out.
        if !known && !off {
            g.unknown += 1;
            return;
        }
        g.threads += 1;
        g.alive_ns += alive;
        for part in parts {
            paid += part.ns as f64 * stretch;
            match g.parts.iter_mut().find(|p| p.what == part.what) {
                Some(p) => p.ns += part.ns,
                None => g.parts.push(part),
            }
        }
    });
    if g.threads == 0 {
        return None;
    }
    g.estimated = (paid / g.alive_ns.max(1) as f64).min(1.0);
    g.parts.sort_by_key(|p| std::cmp::Reverse(p.ns));
    Some(g)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::model::{
        cuda::{ApiStat, ProcessCuda, ThreadCuda},
        overhead::{ProbeSampling, ProgramCost, StormThread, SyscallsOff, ThreadOverhead},
        time::SyscallStat,
    };

    fn prog(name: &str, hits: u64, bpf: f64, trap: f64) -> ProgramCost {
        ProgramCost {
            program: name.into(),
            hits,
            bpf_ns_per_hit: bpf,
            trap_ns_per_hit: trap,
            timed: hits,
            ..Default::default()
        }
    }

    fn thread(tid: u32, alive_s: f64, syscalls: u64, blocked: u64, preempted: u64) -> ThreadReport {
        let reason = |c: &str, r: &str, count| ReasonTime {
            category: c.into(),
            reason: r.into(),
            ns: 1,
            count,
        };
        ThreadReport {
            tid,
            comm: format!("t{tid}"),
            samples: 100,
            kernel_samples: 0,
            top_self: vec![],
            top_python: vec![],
            time: Some(TimeBreakdown {
                alive_ns: (alive_s * 1e9) as u64,
                reasons: vec![
                    reason("cpu", "on-CPU", 10 * (blocked + preempted)),
                    reason("io", "read", blocked),
                    reason("runqueue", "woken, waiting for a CPU", blocked),
                    reason("runqueue", "preempted", preempted),
                    reason("cuda_sync", "cudaDeviceSynchronize", 1000),
                ],
                ..Default::default()
            }),
            syscalls: vec![SyscallStat {
                name: "read".into(),
                count: syscalls,
                ..Default::default()
            }],
            python_sites: vec![],
        }
    }

    /// A thread's breakdown with `cpu_s` on CPU, `launch_s` in launches, `preempted_s` waiting
    /// preempted and `woken_s` waiting after wake-ups.
    fn breakdown(cpu_s: f64, launch_s: f64, preempted_s: f64, woken_s: f64) -> TimeBreakdown {
        let ns = |s: f64| (s * 1e9) as u64;
        let cat = |c: &str, s: f64| crate::report::model::time::CategoryTime {
            category: c.into(),
            ns: ns(s),
            percent: 0.0,
        };
        let reason = |r: &str, s: f64| ReasonTime {
            category: "runqueue".into(),
            reason: r.into(),
            ns: ns(s),
            count: 1,
        };
        TimeBreakdown {
            alive_ns: ns(cpu_s + launch_s + preempted_s + woken_s + 1.0),
            categories: vec![
                cat("cpu", cpu_s),
                cat("cuda_launch", launch_s),
                cat("runqueue", preempted_s + woken_s),
                cat("cuda_sync", 1.0),
            ],
            reasons: vec![
                reason("preempted", preempted_s),
                reason("woken, waiting for a CPU", woken_s),
            ],
            ..Default::default()
        }
    }

    #[test]
    fn contention_is_the_preempted_wait_per_ns_on_cpu() {
        // An idle machine: a ns of CPU is a ns.
        assert_eq!(contention(&breakdown(4.0, 1.0, 0.0, 0.3)), 1.0);
        // Two hogs beside a storm: 5 s on CPU (launches included), 7.5 s preempted.
        assert_eq!(contention(&breakdown(4.0, 1.0, 7.5, 0.3)), 2.5);
        // Next to no CPU: capped.
        assert_eq!(contention(&breakdown(0.01, 0.0, 5.0, 0.0)), CONTENTION_MAX);
        assert_eq!(contention(&TimeBreakdown::default()), 1.0);
    }

    #[test]
    fn a_thread_kept_waiting_for_a_cpu_pays_its_probes_stretched() {
        let mut t = thread(1, 10.0, 1_000, 0, 0);
        // 4 s on CPU, 6 s preempted: each ns of probes cost it 2.5 ns.
        t.time = Some(breakdown(4.0, 0.0, 6.0, 0.0));
        let alive = t.time.as_ref().unwrap().alive_ns as f64;
        let r = report(vec![t]);
        let c = costliest_thread(&r, 1).unwrap();
        let ns: u64 = c.parts.iter().map(|p| p.ns).sum();
        assert_eq!(c.contention, Some(2.5));
        assert!(
            (c.estimated - ns as f64 * 2.5 / alive).abs() < 1e-12,
            "{c:?}"
        );
        // Probes that cost 7 s of its 11 s, stretched 2.5x: all of its time, not 159% of it.
        let mut t = thread(1, 10.0, 10_000_000, 0, 0);
        t.time = Some(breakdown(4.0, 0.0, 6.0, 0.0));
        let c = costliest_thread(&report(vec![t]), 1).unwrap();
        assert_eq!(c.estimated, 1.0, "{c:?}");
        // Without the wait: no figure, no stretch.
        let mut t = thread(1, 10.0, 1_000, 0, 0);
        t.time = Some(breakdown(4.0, 0.0, 0.1, 6.0));
        let c = costliest_thread(&report(vec![t]), 1).unwrap();
        assert_eq!(c.contention, None);
    }

    fn report(threads: Vec<ThreadReport>) -> Report {
        let mut r = crate::report::fixtures::report();
        r.processes = vec![crate::report::fixtures::process(10, None, "job", threads)];
        r.overhead = Some(Overhead {
            programs: vec![
                prog("sys_enter", 1_000_000, 130.0, 170.0),
                prog("sys_exit", 1_000_000, 230.0, 170.0),
                prog("sched_switch", 10_000, 1000.0, 30.0),
                prog("sched_switch_tp", 10_000, 3000.0, 30.0),
                prog("sched_wakeup", 5_000, 470.0, 30.0),
                prog("cpu_sample", 1_000, 4970.0, 30.0),
                prog("cuda_entry", 1_000, 500.0, 1000.0),
                prog("cuda_ret", 1_000, 500.0, 2000.0),
            ],
            ..Default::default()
        });
        r
    }

    #[test]
    fn short_lived_threads_are_summed_apart_from_the_costliest() {
        // A parent alive 10 s and forty children of 2 ms each, every one with 100 syscalls.
        let mut threads = vec![thread(1, 10.0, 100, 0, 0)];
        threads.extend((2..42).map(|tid| ThreadReport {
            samples: 0,
            ..thread(tid, 0.002, 100, 0, 0)
        }));
        // A row dead threads were folded into is no thread.
        threads.push(ThreadReport {
            samples: 0,
            ..thread(crate::accounting::aggregate::FOLDED_TID, 0.002, 100, 0, 0)
        });
        let r = report(threads);
        assert_eq!(costliest_thread(&r, 100_000_000).unwrap().tid, 1);
        let g = short_lived(&r, 100_000_000).unwrap();
        assert_eq!((g.threads, g.alive_ns), (40, 80_000_000));
        let paid: u64 = g.parts.iter().map(|p| p.ns).sum();
        let one = thread_parts(
            &r,
            r.overhead.as_ref().unwrap(),
            (10, false),
            &r.processes[0].threads[1],
            &r.processes[0].threads[1].syscalls,
            (0.0, 0.0),
        );
        assert_eq!(paid, 40 * one.iter().map(|p| p.ns).sum::<u64>());
        assert!((g.estimated - paid as f64 / 80e6).abs() < 1e-12);
        assert_eq!(g.parts[0].what, "syscall tracepoints");
        // Together they lived under the floor: their share is counted, not shown or warned of.
        let mut o = r.overhead.clone().unwrap();
        o.budget = 0.0001;
        o.short_lived = Some(g.clone());
        assert_eq!(o.short_lived_line(), None);
        assert!(!o.summary().contains("alive under"));
        o.short_lived = Some(ShortLived {
            under_ns: 50_000_000,
            ..g
        });
        assert!(o.summary().contains("40 threads alive under 50 ms"));
        let line = o.short_lived_line().unwrap();
        assert!(
            line.starts_with("over budget: 40 threads that lived under 50 ms each (80 ms in all"),
            "{line}"
        );
        // None when every thread lived long enough to be weighed alone.
        assert_eq!(
            short_lived(&report(vec![thread(1, 10.0, 100, 0, 0)]), 100_000_000),
            None
        );
    }

    /// A thread's syscall row: `count` calls of `name`, `errors` of them failed.
    fn call(name: &str, count: u64, errors: u64) -> SyscallStat {
        SyscallStat {
            name: name.into(),
            count,
            errors,
            ..Default::default()
        }
    }

    #[test]
    fn forks_execs_and_exits_are_charged_to_the_thread_they_run_in() {
        // A shell that forked 100 children (2 clones failed) and a child that exec'd once
        // (after a failed try) and exited with its process.
        let mut shell = thread(1, 10.0, 0, 0, 0);
        shell.syscalls = vec![
            call("clone", 98, 0),
            call("clone3", 4, 2),
            call("wait4", 100, 0),
        ];
        let mut child = thread(2, 0.001, 0, 0, 0);
        child.syscalls = vec![call("execve", 2, 1), call("exit_group", 1, 0)];
        let mut r = report(vec![shell, child]);
        let o = r.overhead.as_mut().unwrap();
        // As named on this kernel: the BTF wake-up and the fork's two programs.
        o.programs.extend([
            prog("task_newtask", 100, 800.0, 30.0),
            prog("acct_newtask", 100, 100.0, 30.0),
            prog("sched_wakeup_new_btf", 100, 700.0, 30.0),
            prog("sched_process_exec", 1, 1200.0, 30.0),
            prog("task_rename", 1, 200.0, 30.0),
            prog("sched_process_exit", 1, 670.0, 30.0),
            prog("cuda_thread_exit", 1, 570.0, 30.0),
        ]);
        let o = r.overhead.as_ref().unwrap();
        let part = |tid_at: usize, exited: bool| {
            thread_parts(
                &r,
                o,
                (10, exited),
                &r.processes[0].threads[tid_at],
                &r.processes[0].threads[tid_at].syscalls,
                (0.0, 0.0),
            )
            .into_iter()
            .find(|p| p.what == "fork, exec and exit tracepoints")
            .map_or(0, |p| p.ns)
        };
        // 100 forks at 830 + 130 + 730 ns; the shell's process lives on.
        assert_eq!(part(0, false), 100 * 1_690);
        // One exec (1,230 + 230 ns) and, its process exited, one exit (700 + 600 ns).
        assert_eq!(part(1, true), 1_460 + 1_300);
        // Its process alive and no `exit` call: no exit of its own yet.
        assert_eq!(part(1, false), 1_460);
    }

    #[test]
    fn threads_whose_rows_were_folded_are_charged_their_share_of_the_process_rows() {
        // Past the retired rows' cap, two exited threads' 300 reads (lives of 20 and 10 ms)
        // are their process's only; a third thread keeps its own 50.
        let own = thread(1, 0.05, 50, 0, 0);
        let folded = |tid, alive| ThreadReport {
            syscalls: vec![],
            samples: 0,
            ..thread(tid, alive, 0, 0, 0)
        };
        let mut r = report(vec![own, folded(2, 0.02), folded(3, 0.01)]);
        r.processes[0].syscalls = vec![call("read", 350, 0)];
        // A child whose rows were not kept at all: its cost is unknown.
        let mut gone =
            crate::report::fixtures::process(11, Some(10), "true", vec![folded(4, 0.001)]);
        gone.exited = true;
        r.processes.push(gone);
        let o = r.overhead.as_ref().unwrap();
        let p = &r.processes[0];
        assert_eq!(unplaced(p), vec![call("read", 300, 0)]);
        let per_call = per_hit(o, "sys_enter") + per_hit(o, "sys_exit");
        let mut seen = Vec::new();
        for_each_cost(&r, o, |_, t, parts, _, _, known| {
            let ns = parts
                .iter()
                .find(|x| x.what == "syscall tracepoints")
                .map_or(0, |x| x.ns);
            seen.push((t.tid, ns, known));
        });
        assert_eq!(
            seen,
            vec![
                (1, (50.0 * per_call) as u64, true),
                (2, (200.0 * per_call) as u64, true),
                (3, (100.0 * per_call) as u64, true),
                (4, 0, false),
            ]
        );
        // The short-lived group leaves out the one whose cost is unknown, and says so.
        let g = short_lived(&r, 100_000_000).unwrap();
        assert_eq!((g.threads, g.unknown), (3, 1));
        assert_eq!(g.alive_ns, 80_000_000);
    }

    #[test]
    fn syscalls_made_while_the_programs_had_stopped_are_charged_to_the_storm() {
        let mut r = report(vec![
            thread(1, 10.0, 100, 50, 0),
            thread(2, 10.0, 100, 50, 0),
        ]);
        let o = r.overhead.as_mut().unwrap();
        // Early returns at 40 and 60 ns, a trap of 25 ns each.
        for (p, early) in o.programs.iter_mut().zip([40.0, 60.0]) {
            p.early_bpf_ns_per_hit = Some(early);
            p.trap_ns_per_hit = 25.0;
        }
        o.syscalls_off = Some(SyscallsOff {
            threads: vec![StormThread {
                pid: 10,
                tid: 2,
                comm: "dd".into(),
                share: 0.5,
            }],
            halted_calls: 1_000_000,
            ..Default::default()
        });
        let c = costliest_thread(&r, 0).unwrap();
        assert_eq!(c.tid, 2);
        let stopped = c
            .parts
            .iter()
            .find(|p| p.what == "syscall tracepoints, stopped")
            .unwrap();
        assert_eq!(stopped.ns, 1_000_000 * (65 + 85));
        // Not charged again to the thread that did not storm.
        let quiet = thread_parts(
            &r,
            r.overhead.as_ref().unwrap(),
            (10, false),
            &r.processes[0].threads[0],
            &r.processes[0].threads[0].syscalls,
            (0.0, 0.0),
        );
        assert!(quiet
            .iter()
            .all(|p| p.what != "syscall tracepoints, stopped"));
    }

    #[test]
    fn a_syscall_storm_thread_is_the_costliest_and_says_why() {
        // 10 s each: a quiet thread and one making 100k syscalls a second.
        let r = report(vec![
            thread(1, 10.0, 100, 50, 0),
            thread(2, 10.0, 1_000_000, 400, 100),
        ]);
        let c = costliest_thread(&r, 0).unwrap();
        assert_eq!(c.tid, 2);
        assert!(c.parts.iter().all(|p| p.what != "block I/O tracepoints"));
        // 1M x (300 + 400) ns = 0.7 s of 10 s; 400 blocking waits and 100 preemptions are 500
        // switches at the mean of both variants (2030 ns) and 400 wakeups at 500 ns; 100
        // samples at 5 us.
        assert_eq!(c.parts[0].what, "syscall tracepoints");
        assert_eq!(c.parts[0].ns, 700_000_000);
        let sched = c
            .parts
            .iter()
            .find(|p| p.what == "scheduler tracepoints")
            .unwrap();
        assert_eq!(sched.ns, 500 * 2030 + 400 * 500);
        let sampler = c.parts.iter().find(|p| p.what == "CPU sampler").unwrap();
        assert_eq!(sampler.ns, 500_000);
        assert!((c.estimated - 0.0702).abs() < 0.0002, "{}", c.estimated);
    }

    #[test]
    fn a_threads_switches_are_priced_as_traced_switches_not_at_the_machines_mean() {
        // 10,000 switches on the machine at a mean of 1 us; the 1,000 traced ones cost 5 us.
        let mut r = report(vec![thread(2, 10.0, 0, 400, 100)]);
        let o = r.overhead.as_mut().unwrap();
        o.programs.retain(|p| p.program != "sched_switch_tp");
        let sw = o
            .programs
            .iter_mut()
            .find(|p| p.program == "sched_switch")
            .unwrap();
        sw.traced_hits = Some(1_000);
        sw.traced_bpf_ns_per_hit = Some(5_000.0);
        sw.early_bpf_ns_per_hit = Some(556.0);
        let c = costliest_thread(&r, 0).unwrap();
        let sched = c
            .parts
            .iter()
            .find(|p| p.what == "scheduler tracepoints")
            .unwrap();
        assert_eq!(sched.ns, 500 * 5030 + 400 * 500);
    }

    #[test]
    fn block_requests_are_shared_by_the_threads_that_wait_on_disk() {
        // Thread 1 waited on disk 3 times as often as thread 2 ("read" waits are io).
        let mut r = report(vec![thread(1, 10.0, 0, 300, 0), thread(2, 10.0, 0, 100, 0)]);
        for t in r.processes[0].threads.iter_mut() {
            t.samples = 0;
            t.time
                .as_mut()
                .unwrap()
                .reasons
                .retain(|x| x.category == "io");
        }
        r.processes[0].block_io = vec![crate::report::model::time::BlockIo {
            requests: 40_000,
            ..Default::default()
        }];
        let o = r.overhead.as_mut().unwrap();
        for n in [
            "block_bio_queue",
            "block_rq_insert",
            "block_rq_issue",
            "block_rq_complete",
        ] {
            o.programs.push(prog(n, 40_000, 970.0, 30.0));
        }
        let c = costliest_thread(&r, 0).unwrap();
        assert_eq!(c.tid, 1);
        let block = c
            .parts
            .iter()
            .find(|p| p.what == "block I/O tracepoints")
            .unwrap();
        assert_eq!(block.ns, 30_000 * 4_000);
    }

    #[test]
    fn sampled_block_requests_cost_their_early_returns_but_those_counted() {
        let mut r = report(vec![thread(1, 10.0, 0, 100, 0)]);
        let t = &mut r.processes[0].threads[0];
        t.samples = 0;
        t.time
            .as_mut()
            .unwrap()
            .reasons
            .retain(|x| x.category == "io");
        // 16,000 requests estimated from 1,000 counted.
        r.processes[0].block_io = vec![crate::report::model::time::BlockIo {
            requests: 16_000,
            sampled: Some(crate::report::model::time::BlockSampled {
                seen: 1_000,
                requests_error: 980,
            }),
            ..Default::default()
        }];
        let o = r.overhead.as_mut().unwrap();
        for n in ["block_bio_queue", "block_rq_complete"] {
            let mut p = prog(n, 16_000, 200.0, 30.0);
            p.traced_hits = Some(1_000);
            p.traced_bpf_ns_per_hit = Some(370.0);
            p.early_bpf_ns_per_hit = Some(70.0);
            o.programs.push(p);
        }
        let c = costliest_thread(&r, 0).unwrap();
        let block = c
            .parts
            .iter()
            .find(|p| p.what == "block I/O tracepoints")
            .unwrap();
        // Two programs: 1,000 counted at 400 ns a hit, 15,000 passed at 100.
        assert_eq!(block.ns, 2 * (1_000 * 400 + 15_000 * 100));
    }

    #[test]
    fn sampled_launches_cost_only_what_was_seen_and_the_closes_count() {
        let mut r = report(vec![thread(1, 10.0, 0, 0, 0), thread(2, 0.0005, 0, 0, 0)]);
        let api = |f: &str, count| ApiStat {
            function: f.into(),
            count,
            ..Default::default()
        };
        r.processes[0].cuda = Some(ProcessCuda {
            threads: vec![ThreadCuda {
                tid: 1,
                api: vec![api("cudaLaunchKernel", 40_000), api("cudaMemcpy", 100)],
                ..Default::default()
            }],
            ..Default::default()
        });
        let o = r.overhead.as_mut().unwrap();
        o.sampled = Some(ProbeSampling {
            scale: 10.0,
            ..Default::default()
        });
        // (4000 seen launches + 100 copies) x 4 us = 16.4 ms; 100 samples x 5 us = 0.5 ms.
        let c = costliest_thread(&r, 1_000_000).unwrap();
        assert_eq!(c.tid, 1, "the 0.5 ms thread is passed over");
        assert_eq!(c.parts[0].what, "CUDA probes");
        assert_eq!(c.parts[0].ns, 16_400_000);
        // The gate's figure for that thread (with its window closes) wins when larger.
        r.overhead.as_mut().unwrap().worst_thread = Some(ThreadOverhead {
            pid: 10,
            tid: 1,
            estimated: 0.005,
        });
        let c = costliest_thread(&r, 1_000_000).unwrap();
        assert_eq!(c.parts[0].ns, 50_000_000);
        assert!((c.estimated - 0.00505).abs() < 1e-6, "{}", c.estimated);
    }

    /// A thread alive `alive_s` that made `syscalls` read calls and waited `wait_s` in wait4.
    fn waiter(tid: u32, alive_s: f64, syscalls: u64, wait_s: f64) -> ThreadReport {
        let mut t = thread(tid, alive_s, syscalls, 0, 0);
        t.samples = 0;
        let tb = t.time.as_mut().unwrap();
        tb.reasons.retain(|r| r.category != "cuda_sync");
        if wait_s > 0.0 {
            tb.reasons.push(ReasonTime {
                category: "ipc".into(),
                reason: "wait4".into(),
                ns: (wait_s * 1e9) as u64,
                count: 1,
            });
        }
        t
    }

    /// A `waiter` that also waited `read_s` on a pipe.
    fn reader(tid: u32, alive_s: f64, wait_s: f64, read_s: f64) -> ThreadReport {
        let mut t = waiter(tid, alive_s, 0, wait_s);
        t.time.as_mut().unwrap().reasons.push(ReasonTime {
            category: "ipc".into(),
            reason: "read".into(),
            ns: (read_s * 1e9) as u64,
            count: 1,
        });
        t
    }

    fn tree(procs: Vec<(u32, Option<u32>, Vec<ThreadReport>)>) -> Report {
        let mut r = report(vec![]);
        r.processes = procs
            .into_iter()
            .map(|(pid, ppid, threads)| crate::report::fixtures::process(pid, ppid, "p", threads))
            .collect();
        r
    }

    /// 1,000 syscalls at (130 + 170) + (230 + 170) ns: 0.7 ms.
    const THOUSAND_CALLS_NS: f64 = 700_000.0;

    /// A wait's switch out and wake-up: sched_switch (mean of its two versions, 2030) and
    /// sched_wakeup (500).
    const SWITCH_NS: f64 = 2_530.0;

    /// What each thread's waited-for children added.
    fn waited(r: &Report) -> HashMap<(u32, u32), f64> {
        let o = r.overhead.as_ref().unwrap();
        let mut own = HashMap::new();
        for_each_cost(r, o, |pid, t, parts, stretch, _, _| {
            own.insert(
                (pid, t.tid),
                parts.iter().map(|p| p.ns).sum::<u64>() as f64 * stretch,
            );
        });
        waited_for_children(r, &own)
    }

    fn waited_ns(c: &ThreadCost) -> u64 {
        c.parts
            .iter()
            .find(|p| p.what == WAITED_PART)
            .map_or(0, |p| p.ns)
    }

    #[test]
    fn a_parent_pays_the_probes_of_the_children_it_waited_for_one_after_another() {
        // A shell alive 10 s, 9 s of it in wait4, and 100 children of 90 ms each, one after
        // another, each with 1,000 syscalls: its own 10 calls are nothing beside theirs.
        let mut procs = vec![(1, None, vec![waiter(1, 10.0, 10, 9.0)])];
        procs.extend((2..102).map(|pid| (pid, Some(1), vec![waiter(pid, 0.09, 1_000, 0.0)])));
        let r = tree(procs);
        let c = costliest_thread(&r, 100_000_000).unwrap();
        assert_eq!(c.tid, 1, "{c:?}");
        let want = 100.0 * THOUSAND_CALLS_NS;
        assert!((waited_ns(&c) as f64 - want).abs() < 2.0, "{c:?}");
        assert_eq!(c.parts[0].what, WAITED_PART);
        let all: u64 = c.parts.iter().map(|p| p.ns).sum();
        assert!((c.estimated - all as f64 / 10e9).abs() < 1e-12, "{c:?}");
        // The children alone are still priced as a group, at their own probes.
        let g = short_lived(&r, 100_000_000).unwrap();
        assert_eq!(g.threads, 100);
        assert!(g.parts.iter().all(|p| p.what != WAITED_PART));
    }

    #[test]
    fn children_run_side_by_side_add_what_the_parent_waited_for() {
        // make -j8: eight children of 1 s each at once, the parent waiting 1 s for them.
        let mut procs = vec![(1, None, vec![waiter(1, 1.5, 0, 1.0)])];
        procs.extend((2..10).map(|pid| (pid, Some(1), vec![waiter(pid, 1.0, 1_000, 0.0)])));
        let w = waited(&tree(procs));
        assert!((w[&(1, 1)] - THOUSAND_CALLS_NS).abs() < 1.0, "{w:?}");
        // A parent that never waits pays none of its children's probes.
        let mut procs = vec![(1, None, vec![waiter(1, 1.5, 100, 0.0)])];
        procs.extend((2..10).map(|pid| (pid, Some(1), vec![waiter(pid, 1.0, 1_000, 0.0)])));
        let c = costliest_thread(&tree(procs), 100_000_000).unwrap();
        assert_ne!(c.tid, 1, "{c:?}");
        assert_eq!(waited_ns(&c), 0);
    }

    #[test]
    fn waits_pass_up_the_tree_and_between_the_waiting_threads() {
        // A launcher waits 2 s for a script, which waits 1 s, in two threads, for a tool
        // alive 1 s with 10,000 calls (7 ms).
        let launcher = waiter(1, 3.0, 0, 2.0);
        let script = vec![waiter(2, 2.0, 0, 0.75), waiter(3, 2.0, 0, 0.25)];
        let tool = waiter(4, 1.0, 10_000, 0.0);
        let r = tree(vec![
            (1, None, vec![launcher]),
            (2, Some(1), script),
            (4, Some(2), vec![tool]),
        ]);
        let w = waited(&r);
        let tool_ns = 10.0 * THOUSAND_CALLS_NS;
        assert!((w[&(2, 2)] - 0.75 * tool_ns).abs() < 1.0, "{w:?}");
        assert!((w[&(2, 3)] - 0.25 * tool_ns).abs() < 1.0, "{w:?}");
        // The script delays the launcher by its slowest thread's own probes (its wait's
        // switch) and its share of the tool's, over the 2 s the launcher waited for its 2 s.
        assert!(
            (w[&(1, 1)] - (SWITCH_NS + 0.75 * tool_ns)).abs() < 1.0,
            "{w:?}"
        );
        assert!(!w.contains_key(&(4, 4)));
    }

    #[test]
    fn a_parent_pays_at_most_what_it_waited() {
        // 10 s in wait4 for children of which the report knows one, alive 1 ms with 10,000
        // calls (7 ms): at that cost per ns, the wait would hold 70 s of probes.
        let r = tree(vec![
            (1, None, vec![waiter(1, 11.0, 0, 10.0)]),
            (2, Some(1), vec![waiter(2, 0.001, 10_000, 0.0)]),
        ]);
        assert_eq!(waited(&r)[&(1, 1)], 10e9);
    }

    #[test]
    fn a_parent_reading_its_childrens_output_pays_their_probes() {
        // `x=$(cmd)` 100 times: 8.9 s reading the children's output, 0.05 s in wait4 for
        // their exits, 100 children of 90 ms each with 1,000 syscalls.
        let mut procs = vec![(1, None, vec![reader(1, 10.0, 0.05, 8.9)])];
        procs.extend((2..102).map(|pid| (pid, Some(1), vec![waiter(pid, 0.09, 1_000, 0.0)])));
        let w = waited(&tree(procs));
        let want = 100.0 * THOUSAND_CALLS_NS * 8.95 / 9.0;
        assert!((w[&(1, 1)] - want).abs() < 2.0, "{w:?}");
    }

    #[test]
    fn a_readers_forgotten_children_lived_as_the_known_ones() {
        // 400 children forked, 100 of them in the report (the rest forgotten past the
        // tracker's cap), 90 ms each: 35.6 s reading their output, 0.2 s in wait4.
        let mut parent = reader(1, 40.0, 0.2, 35.6);
        // Lock and poll waits are no waits on a child's output.
        for (category, reason) in [("lock", "futex"), ("poll", "poll"), ("io", "read")] {
            parent.time.as_mut().unwrap().reasons.push(ReasonTime {
                category: category.into(),
                reason: reason.into(),
                ns: 3_000_000_000,
                count: 1,
            });
        }
        let mut procs = vec![(1, None, vec![parent])];
        procs.extend((2..102).map(|pid| (pid, Some(1), vec![waiter(pid, 0.09, 1_000, 0.0)])));
        let mut r = tree(procs);
        r.processes[0].syscalls = vec![SyscallStat {
            name: "clone".into(),
            count: 400,
            ..Default::default()
        }];
        let w = waited(&r);
        // At the known children's cost per ns of life, over 35.8 s of waits.
        let want = 100.0 * THOUSAND_CALLS_NS * 35.8 / 9.0;
        assert!((w[&(1, 1)] - want).abs() < 10.0, "{w:?}");
        // Without the forks, only the known children's lives leave room: 9 s.
        r.processes[0].syscalls.clear();
        let w = waited(&r);
        assert!(
            (w[&(1, 1)] - 100.0 * THOUSAND_CALLS_NS).abs() < 2.0,
            "{w:?}"
        );
    }

    #[test]
    fn waits_through_ipc_count_only_up_to_the_childrens_lives() {
        // A server that ran one child of 10 ms (1,000 syscalls) and waited an hour on its
        // sockets: the child delayed it by its own probes at most, whether the server waited
        // for it in wait4 or by reading its output.
        for (wait_s, read_s) in [(0.01, 3600.0), (0.0, 3600.0), (0.005, 3600.0)] {
            let r = tree(vec![
                (1, None, vec![reader(1, 4000.0, wait_s, read_s)]),
                (2, Some(1), vec![waiter(2, 0.01, 1_000, 0.0)]),
            ]);
            let w = waited(&r);
            assert!(
                (w[&(1, 1)] - THOUSAND_CALLS_NS).abs() < 1.0,
                "{wait_s} {read_s}: {w:?}"
            );
        }
        // Without children, its waits carry nothing.
        let r = tree(vec![(1, None, vec![reader(1, 4000.0, 0.0, 3600.0)])]);
        assert!(waited(&r).is_empty());
        // Two threads, one in wait4, one reading: shared by what each waited that counts.
        let r = tree(vec![
            (
                1,
                None,
                vec![waiter(1, 2.0, 0, 0.5), reader(3, 2.0, 0.0, 1.5)],
            ),
            (2, Some(1), vec![waiter(2, 1.0, 1_000, 0.0)]),
        ]);
        let w = waited(&r);
        // 0.5 s in wait4 and 0.5 s of the read (the child's life less the wait4) count.
        assert!((w[&(1, 1)] - 0.5 * THOUSAND_CALLS_NS).abs() < 1.0, "{w:?}");
        assert!((w[&(1, 3)] - 0.5 * THOUSAND_CALLS_NS).abs() < 1.0, "{w:?}");
    }

    #[test]
    fn a_loop_of_reused_parent_ids_ends() {
        // Two processes each naming the other as parent (pids reused), and one its own.
        let r = tree(vec![
            (1, Some(2), vec![waiter(1, 1.0, 1_000, 0.5)]),
            (2, Some(1), vec![waiter(2, 1.0, 1_000, 0.5)]),
            (3, Some(3), vec![waiter(3, 1.0, 1_000, 0.5)]),
        ]);
        let w = waited(&r);
        // One of the two pays half the other's probes (it waited half the other's life); not
        // both; and no process its own.
        assert_eq!(w.len(), 1, "{w:?}");
        let (&(pid, _), &ns) = w.iter().next().unwrap();
        assert!(pid == 1 || pid == 2, "{w:?}");
        assert!(
            (ns - 0.5 * (THOUSAND_CALLS_NS + SWITCH_NS)).abs() < 1.0,
            "{w:?}"
        );
        assert!(costliest_thread(&r, 100_000_000).is_some());
    }
}
