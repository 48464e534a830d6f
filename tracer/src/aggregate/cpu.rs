//! CPU profile: merged stacks per thread, top functions by self and total samples.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::symbolize::Frame;

/// One distinct stack of one thread with its sample count. Frames are root first: user frames
/// from `main`/`start_thread` down to the leaf, then kernel frames when sampled in the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackSample {
    pub pid: u32,
    pub tid: u32,
    /// Thread name at sample time.
    pub comm: String,
    pub frames: Vec<Frame>,
    pub count: u64,
    /// Sampled while the CPU ran kernel code on the thread's behalf.
    pub kernel_mode: bool,
}

/// Kernel functions a tracing program runs under: the tracepoints' dispatch into BPF (raw, BTF
/// and classic), the uprobes' handlers, a uprobe's breakpoint trap (`asm_exc_int3` from user
/// space: a debugger's breakpoints too, rare on a production job) and its return's (the
/// `uretprobe` syscall since Linux 6.11, a trap before). Network and cgroup programs (a
/// firewall's) run under none of them.
const PROBE_FRAMES: [&str; 11] = [
    "bpf_trace_run",
    "__bpf_trace_",
    "trace_call_bpf",
    "__bpf_prog_enter",
    "uprobe_dispatcher",
    "uretprobe_dispatcher",
    "handle_swbp",
    "uprobe_notify_resume",
    "uprobe_handle_trampoline",
    "asm_exc_int3",
    "__do_sys_uretprobe",
];

fn is_probe_frame(f: &Frame) -> bool {
    f.kernel && PROBE_FRAMES.iter().any(|p| f.name.starts_with(p))
}

/// The program a JIT'd BPF frame is (`bpf_prog_<tag>_<name>`, the tag 16 hex digits).
fn bpf_program(f: &Frame) -> Option<&str> {
    let rest = f.name.strip_prefix("bpf_prog_")?;
    rest.get(16..)?.strip_prefix('_')
}

/// Whether a stack caught one of gputrace's probes running: under a probe's dispatch or trap,
/// and, where a BPF program is in it, one of gputrace's (the outermost: a subprogram it calls
/// is named for its own function). Another tool's programs on the same tracepoints (a
/// security agent's) are not gputrace's cost.
fn caught_probe(frames: &[Frame]) -> bool {
    frames.iter().any(is_probe_frame)
        && frames
            .iter()
            .filter(|f| f.kernel)
            .find_map(bpf_program)
            .is_none_or(|name| tracer_common::hits::PROGRAMS.contains(&name))
}

#[derive(Debug, Clone, Default)]
pub struct CpuProfile {
    pub samples: Vec<StackSample>,
}

/// A function's share of samples.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FnStat {
    pub function: String,
    pub module: Option<String>,
    pub samples: u64,
    /// Percent of the samples considered (the process's or the thread's).
    pub percent: f64,
}

impl CpuProfile {
    /// Samples whose user stacks the kernel cut at its frame limit (a `[truncated]` root):
    /// (deep ones, walks into garbage). A walk that ran the limit through addresses no code
    /// covers (the symboliser leaves one `[unknown]` of them under the `[truncated]` root)
    /// followed a frame-pointer chain through code built without frame pointers; it is not a
    /// deep stack.
    pub fn cut_stacks(&self) -> (u64, u64) {
        let (mut deep, mut garbage) = (0, 0);
        for s in &self.samples {
            let Some(at) = s
                .frames
                .iter()
                .position(|f| f.name == crate::symbolize::TRUNCATED)
            else {
                continue;
            };
            if s.frames
                .get(at + 1)
                .is_some_and(crate::symbolize::is_unknown)
            {
                garbage += s.count;
            } else {
                deep += s.count;
            }
        }
        (deep, garbage)
    }

    /// Merges samples that share (pid, tid, comm, frames), e.g. after symbolisation folded
    /// several addresses into one function. Output is sorted for stable reports.
    pub fn from_samples(samples: impl IntoIterator<Item = StackSample>) -> Self {
        let mut merged: HashMap<(u32, u32, String, Vec<Frame>, bool), u64> = HashMap::new();
        for s in samples {
            *merged
                .entry((s.pid, s.tid, s.comm, s.frames, s.kernel_mode))
                .or_default() += s.count;
        }
        let mut samples: Vec<StackSample> = merged
            .into_iter()
            .map(
                |((pid, tid, comm, frames, kernel_mode), count)| StackSample {
                    pid,
                    tid,
                    comm,
                    frames,
                    count,
                    kernel_mode,
                },
            )
            .collect();
        samples.sort_by(|a, b| {
            (a.pid, a.tid, &a.comm, &a.frames)
                .cmp(&(b.pid, b.tid, &b.comm, &b.frames))
                .then(b.count.cmp(&a.count))
        });
        Self { samples }
    }

    pub fn total(&self) -> u64 {
        self.samples.iter().map(|s| s.count).sum()
    }

    /// Samples that caught a tracing probe running on the traced thread: a BPF program called
    /// from a tracepoint or a uprobe (their dispatch is in the kernel stack under it), or a
    /// uprobe's breakpoint trap. gputrace's own sampler program runs in the interrupt that
    /// takes the sample, outside the stack it records. What runs with interrupts off is not
    /// caught, its time landing where interrupts come back on: the scheduler's programs (in
    /// the next task), and most of a breakpoint trap's entry and return (in the probed
    /// function, in user space): a launch storm was caught in 12.1-12.7% of its samples where
    /// its probes cost it 17.0% of its time.
    pub fn in_probes(&self) -> u64 {
        self.samples
            .iter()
            .filter(|s| caught_probe(&s.frames))
            .map(|s| s.count)
            .sum()
    }

    /// Samples grouped by process, in one pass: a fork storm has tens of thousands of
    /// processes, and a filter per process went over every sample for each.
    pub fn by_process(&self) -> BTreeMap<u32, Vec<&StackSample>> {
        let mut m: BTreeMap<u32, Vec<&StackSample>> = BTreeMap::new();
        for s in &self.samples {
            m.entry(s.pid).or_default().push(s);
        }
        m
    }
}

/// `samples` (one process's) grouped by thread.
pub fn by_thread<'a>(samples: &[&'a StackSample]) -> BTreeMap<u32, Vec<&'a StackSample>> {
    let mut m: BTreeMap<u32, Vec<&StackSample>> = BTreeMap::new();
    for s in samples {
        m.entry(s.tid).or_default().push(*s);
    }
    m
}

/// Functions ranked by self samples (the leaf frame).
pub fn top_self(samples: &[&StackSample], n: usize) -> Vec<FnStat> {
    rank(samples, n, |s, add| {
        if let Some(leaf) = s.frames.last() {
            add(leaf);
        }
    })
}

/// Python lines ranked by the samples taken under them: each sample goes to its innermost
/// Python frame (none when the stack has no Python frame).
pub fn top_python(samples: &[&StackSample], n: usize) -> Vec<FnStat> {
    rank(samples, n, |s, add| {
        if let Some(f) = s.frames.iter().rev().find(|f| is_python(f)) {
            add(f);
        }
    })
}

/// A frame the Python walk put in: its module is the source file (`train.py`, a console
/// script such as `torchrun`, or `<frozen importlib._bootstrap>`), not an object file.
pub fn is_python(f: &Frame) -> bool {
    f.python && !f.kernel
}

/// Functions ranked by total samples (anywhere on the stack, counted once per stack). A
/// Python function counts as one, whichever of its lines the stack was at (`main (hot.py)`):
/// a function's total split by line never ranked as the function it is.
pub fn top_total(samples: &[&StackSample], n: usize) -> Vec<FnStat> {
    rank_by(samples, n, function_of, |s, add| {
        let mut seen: HashSet<(Cow<str>, Option<&str>)> = HashSet::new();
        for f in &s.frames {
            if seen.insert((function_of(f), f.module.as_deref())) {
                add(f);
            }
        }
    })
}

/// A frame's function: its name, less the line for a Python frame (`main (hot.py:54)` ->
/// `main (hot.py)`).
fn function_of(f: &Frame) -> Cow<'_, str> {
    if is_python(f) {
        if let Some((head, line)) = f.name.rsplit_once(':') {
            let digits = line.strip_suffix(')').unwrap_or("");
            if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
                return Cow::Owned(format!("{head})"));
            }
        }
    }
    Cow::Borrowed(&f.name)
}

fn rank<'a>(
    samples: &[&'a StackSample],
    n: usize,
    visit: impl Fn(&'a StackSample, &mut dyn FnMut(&'a Frame)),
) -> Vec<FnStat> {
    rank_by(samples, n, |f| Cow::Borrowed(&f.name), visit)
}

/// [`rank`] with frames counted under `name(frame)`.
fn rank_by<'a>(
    samples: &[&'a StackSample],
    n: usize,
    name: impl Fn(&'a Frame) -> Cow<'a, str>,
    visit: impl Fn(&'a StackSample, &mut dyn FnMut(&'a Frame)),
) -> Vec<FnStat> {
    let total: u64 = samples.iter().map(|s| s.count).sum();
    let mut counts: HashMap<(Cow<'a, str>, Option<&'a str>), u64> = HashMap::new();
    for s in samples {
        visit(s, &mut |f: &'a Frame| {
            *counts.entry((name(f), f.module.as_deref())).or_default() += s.count;
        });
    }
    let mut v: Vec<FnStat> = counts
        .into_iter()
        .map(|((name, module), c)| FnStat {
            function: name.to_string(),
            module: module.map(str::to_string),
            samples: c,
            percent: if total == 0 {
                0.0
            } else {
                100.0 * c as f64 / total as f64
            },
        })
        .collect();
    v.sort_by(|a, b| {
        b.samples
            .cmp(&a.samples)
            .then_with(|| a.function.cmp(&b.function))
    });
    v.truncate(n);
    v
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn samples_under_a_probes_dispatch_or_trap_are_in_probes() {
        let k = |n: &str| Frame {
            name: n.into(),
            module: Some("[kernel]".into()),
            kernel: true,
            python: false,
        };
        let sample = |frames: Vec<Frame>, count| StackSample {
            pid: 1,
            tid: 1,
            comm: "t".into(),
            frames,
            count,
            kernel_mode: true,
        };
        let p = CpuProfile {
            samples: vec![
                // A syscall program, its helper at the leaf.
                sample(
                    vec![
                        k("do_syscall_64"),
                        k("syscall_exit_work"),
                        k("__bpf_trace_sys_exit"),
                        k("bpf_trace_run2"),
                        k("bpf_prog_32095051f6f771e0_sys_exit"),
                        k("htab_map_update_elem"),
                    ],
                    3,
                ),
                // A uprobe's breakpoint trap, its return, and what landed as the trap returned.
                sample(vec![k("exc_int3"), k("handle_swbp")], 2),
                sample(vec![k("do_syscall_64"), k("__do_sys_uretprobe")], 6),
                sample(vec![k("asm_exc_int3"), k("irqentry_exit_to_user_mode")], 7),
                // A subprogram of one of gputrace's programs.
                sample(
                    vec![
                        k("bpf_trace_run2"),
                        k("bpf_prog_32095051f6f771e0_sys_exit"),
                        k("bpf_prog_78d19a0ce2075a56_gputrace_name_fd"),
                    ],
                    20,
                ),
                // Another tool's program on the same tracepoint.
                sample(
                    vec![
                        k("bpf_trace_run2"),
                        k("bpf_prog_0123456789abcdef_falco_sys"),
                    ],
                    50,
                ),
                // Plain kernel work, and a firewall's program (no tracing dispatch).
                sample(vec![k("do_syscall_64"), k("vfs_read")], 10),
                sample(
                    vec![k("ip_finish_output"), k("bpf_prog_aa_sd_fw_egress")],
                    1,
                ),
                // A user function that happens to be called so.
                sample(
                    vec![Frame {
                        kernel: false,
                        ..k("handle_swbp")
                    }],
                    4,
                ),
            ],
        };
        assert_eq!(p.in_probes(), 38);
        assert_eq!(p.total(), 103);
    }

    pub fn f(name: &str) -> Frame {
        Frame::native(name, Some("app".into()))
    }

    #[test]
    fn cut_stacks_tell_a_deep_stack_from_a_walk_into_garbage() {
        let cut = |names: Vec<&str>, count| StackSample {
            frames: std::iter::once(crate::symbolize::TRUNCATED)
                .chain(names)
                .map(f)
                .collect(),
            ..s(1, 1, &[], count)
        };
        let deep = cut(vec!["recurse"; 127], 5);
        let junk = vec!["[unknown]", "spin"];
        let garbage = cut(junk, 3);
        let whole = s(1, 2, &["main", "spin"], 7);
        let p = CpuProfile {
            samples: vec![deep, garbage, whole],
        };
        assert_eq!(p.cut_stacks(), (5, 3));
    }

    pub fn s(pid: u32, tid: u32, frames: &[&str], count: u64) -> StackSample {
        StackSample {
            pid,
            tid,
            comm: format!("t{tid}"),
            frames: frames.iter().map(|n| f(n)).collect(),
            count,
            kernel_mode: false,
        }
    }

    #[test]
    fn merges_identical_stacks() {
        let p = CpuProfile::from_samples(vec![
            s(1, 1, &["main", "a"], 3),
            s(1, 1, &["main", "a"], 4),
            s(1, 2, &["main", "a"], 1),
        ]);
        assert_eq!(p.samples.len(), 2);
        assert_eq!(p.total(), 8);
        assert_eq!(p.samples[0].count, 7);
    }

    #[test]
    fn self_and_total() {
        let p = CpuProfile::from_samples(vec![
            s(1, 1, &["main", "a", "leaf"], 6),
            s(1, 1, &["main", "b"], 3),
            s(1, 1, &["main"], 1),
            // recursion: counted once per stack in total
            s(1, 1, &["main", "r", "r"], 10),
        ]);
        let all = p.by_process().remove(&1).unwrap();
        let selfs = top_self(&all, 10);
        assert_eq!(selfs[0].function, "r");
        assert_eq!(selfs[0].samples, 10);
        assert_eq!(selfs[1].function, "leaf");
        let totals = top_total(&all, 2);
        assert_eq!(totals[0].function, "main");
        assert_eq!(totals[0].samples, 20);
        assert!((totals[0].percent - 100.0).abs() < 1e-9);
        assert_eq!(totals[1].function, "r");
        assert_eq!(totals[1].samples, 10);
    }

    /// A Python function's total counts all its lines: `main` at lines 54 and 55 is one
    /// function on every stack, and recursion through two of its lines counts once.
    #[test]
    fn python_functions_total_over_their_lines() {
        let py = |name: &str| Frame::python(name, "/w/hot.py");
        let sample = |frames: Vec<Frame>, count: u64| StackSample {
            pid: 1,
            tid: 1,
            comm: "python".into(),
            frames,
            count,
            kernel_mode: false,
        };
        let p = CpuProfile::from_samples(vec![
            sample(vec![py("main (hot.py:54)"), py("a (hot.py:3)")], 6),
            sample(vec![py("main (hot.py:55)"), py("b (hot.py:9)")], 4),
            sample(vec![py("main (hot.py:55)"), py("main (hot.py:54)")], 2),
        ]);
        let all = p.by_process().remove(&1).unwrap();
        let totals = top_total(&all, 3);
        assert_eq!(totals[0].function, "main (hot.py)");
        assert_eq!(totals[0].samples, 12);
        assert_eq!(totals[1].function, "a (hot.py)");
        // The self ranking keeps the lines.
        assert_eq!(top_self(&all, 1)[0].function, "a (hot.py:3)");
    }

    /// Each sample goes to its innermost Python frame, whatever native code ran under it.
    #[test]
    fn python_lines_own_the_native_code_under_them() {
        let py = |name: &str, file: &str| Frame::python(name, file);
        let native = |name: &str| Frame::native(name, Some("python3.12".into()));
        let sample = |frames: Vec<Frame>, count: u64| StackSample {
            pid: 1,
            tid: 1,
            comm: "python3".into(),
            frames,
            count,
            kernel_mode: false,
        };
        let main = py("<module> (train.py:30)", "/job/train.py");
        let prep = py("prep_batch (train.py:15)", "/job/train.py");
        let boot = py(
            "_find_and_load (<frozen importlib._bootstrap>:1360)",
            "<frozen importlib._bootstrap>",
        );
        // A console script's source has no `.py`.
        let script = py("<module> (torchrun:8)", "/usr/local/bin/torchrun");
        let samples = [
            sample(
                vec![
                    native("Py_RunMain"),
                    main.clone(),
                    prep.clone(),
                    native("PyObject_Malloc"),
                ],
                6,
            ),
            sample(vec![native("Py_RunMain"), main.clone(), prep.clone()], 2),
            sample(
                vec![
                    native("Py_RunMain"),
                    main.clone(),
                    native("_PyEval_EvalFrameDefault"),
                ],
                1,
            ),
            sample(vec![native("Py_RunMain"), boot.clone(), native("read")], 1),
            sample(vec![native("Py_RunMain"), script, native("select")], 5),
            // A thread with no Python frames (a CUDA helper thread): no line.
            sample(vec![native("start_thread"), native("poll")], 10),
        ];
        let all: Vec<&StackSample> = samples.iter().collect();
        let lines = top_python(&all, 10);
        let got: Vec<(&str, u64)> = lines
            .iter()
            .map(|l| (l.function.as_str(), l.samples))
            .collect();
        assert_eq!(
            got,
            vec![
                ("prep_batch (train.py:15)", 8),
                ("<module> (torchrun:8)", 5),
                ("<module> (train.py:30)", 1),
                ("_find_and_load (<frozen importlib._bootstrap>:1360)", 1),
            ]
        );
        // A share of all the samples considered, as top_self's.
        assert!((lines[0].percent - 32.0).abs() < 1e-9);
        assert!(!is_python(&Frame {
            kernel: true,
            ..prep
        }));
        assert!(!is_python(&native("PyObject_Malloc")));
        // An object file named like a source file is still native code.
        assert!(!is_python(&Frame::native("f", Some("/opt/odd.py".into()))));
    }

    #[test]
    fn threads_grouped() {
        let p = CpuProfile::from_samples(vec![
            s(1, 1, &["a"], 1),
            s(1, 2, &["b"], 1),
            s(2, 3, &["c"], 1),
        ]);
        let grouped = p.by_process();
        assert_eq!(grouped.keys().copied().collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(grouped[&2].len(), 1);
        assert_eq!(by_thread(&grouped[&1]).len(), 2);
    }
}
