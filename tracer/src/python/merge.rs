//! Splicing Python frames into a native stack: each `_PyEval_EvalFrameDefault` activation is
//! replaced by the Python frames it ran, so the C code a Python line called (extensions, PyTorch,
//! CUDA) stays below that line.

use crate::symbolize::Frame;

/// The native frame that runs Python code.
pub const EVAL_FRAME: &str = "_PyEval_EvalFrameDefault";

/// A symbolised Python frame; `entry` marks the first frame run by one eval-loop activation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PyFrameSym {
    pub frame: Frame,
    pub entry: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Merge {
    /// One eval activation per group of Python frames: spliced exactly.
    Exact,
    /// The counts differed (native stack truncated, or a sample taken while a frame was being
    /// pushed): all Python frames replace the leaf-most eval frame; the others are dropped.
    Approximate,
    /// No eval frame in the native stack (it could not be unwound): Python frames are put on
    /// top of the native root.
    NoEvalFrame,
}

/// `native` and `python` are both root first.
pub fn merge(native: &[Frame], python: &[PyFrameSym]) -> (Vec<Frame>, Merge) {
    let (mut out, how) = splice(native, python);
    // Native roots nothing names right above the Python frames split each Python stack into
    // a tree of its own beside the one whose walk ended cleanly (a third of a threaded
    // CPython 3.11's samples here). The Python frames are whole: they come from the
    // interpreter's own chain.
    let lost = lost_roots(&out);
    if lost > 0 && out.get(lost).is_some_and(|f| f.python) {
        out.drain(..lost);
    }
    (out, how)
}

/// How many of the root-first `frames` are native roots nothing names (`[unknown]`: the frame
/// pointers of an interpreter built without them led into data or unmapped memory).
pub fn lost_roots(frames: &[Frame]) -> usize {
    frames
        .iter()
        .take_while(|f| !f.python && crate::symbolize::is_unknown(f))
        .count()
}

fn splice(native: &[Frame], python: &[PyFrameSym]) -> (Vec<Frame>, Merge) {
    let evals: Vec<usize> = native
        .iter()
        .enumerate()
        .filter(|(_, f)| !f.kernel && f.name == EVAL_FRAME)
        .map(|(i, _)| i)
        .collect();
    // Groups of Python frames per activation: a group starts at an entry frame.
    let mut groups: Vec<&[PyFrameSym]> = Vec::new();
    let mut start = 0;
    for i in 1..=python.len() {
        if i == python.len() || python[i].entry {
            groups.push(&python[start..i]);
            start = i;
        }
    }
    if python.is_empty() {
        return (native.to_vec(), Merge::Exact);
    }
    if evals.is_empty() {
        let mut out: Vec<Frame> = python.iter().map(|p| p.frame.clone()).collect();
        out.extend(native.iter().cloned());
        return (out, Merge::NoEvalFrame);
    }
    let mut out = Vec::with_capacity(native.len() + python.len());
    if evals.len() == groups.len() {
        let mut g = groups.iter();
        for (i, f) in native.iter().enumerate() {
            if evals.contains(&i) {
                out.extend(g.next().unwrap().iter().map(|p| p.frame.clone()));
            } else {
                out.push(f.clone());
            }
        }
        return (out, Merge::Exact);
    }
    let last = *evals.last().unwrap();
    for (i, f) in native.iter().enumerate() {
        if i == last {
            out.extend(python.iter().map(|p| p.frame.clone()));
        } else if !evals.contains(&i) {
            out.push(f.clone());
        }
    }
    (out, Merge::Approximate)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(name: &str) -> Frame {
        Frame::native(name, Some("python3.11".into()))
    }
    fn p(name: &str, entry: bool) -> PyFrameSym {
        PyFrameSym {
            frame: Frame::python(name, "x.py"),
            entry,
        }
    }
    fn names(v: &[Frame]) -> Vec<&str> {
        v.iter().map(|f| f.name.as_str()).collect()
    }

    #[test]
    fn splices_each_activation() {
        // main -> eval[<module>, run] -> C call -> eval[callback, leaf] -> C leaf
        let native = vec![
            n("main"),
            n(EVAL_FRAME),
            n("builtin_call"),
            n(EVAL_FRAME),
            n("memcpy"),
        ];
        let py = vec![
            p("<module>", true),
            p("run", false),
            p("callback", true),
            p("leaf", false),
        ];
        let (m, how) = merge(&native, &py);
        assert_eq!(how, Merge::Exact);
        assert_eq!(
            names(&m),
            vec![
                "main",
                "<module>",
                "run",
                "builtin_call",
                "callback",
                "leaf",
                "memcpy"
            ]
        );
    }

    /// Native roots nothing names go where the Python frames follow them, not elsewhere.
    #[test]
    fn a_lost_native_root_above_the_python_frames_goes() {
        let lost = Frame::unknown(None, false);
        let anon = Frame::unknown(Some("[anon]".into()), false);
        let native = vec![lost.clone(), anon, n(EVAL_FRAME), n("memcpy")];
        let (m, how) = merge(&native, &[p("<module>", true), p("run", false)]);
        assert_eq!(how, Merge::Exact);
        assert_eq!(names(&m), vec!["<module>", "run", "memcpy"]);
        // Under a native frame, or with no Python frames, it stays.
        let native = vec![lost.clone(), n("main"), n(EVAL_FRAME)];
        let (m, _) = merge(&native, &[p("<module>", true)]);
        assert_eq!(names(&m), vec!["[unknown]", "main", "<module>"]);
        let (m, _) = merge(&[lost, n("memcpy")], &[]);
        assert_eq!(names(&m), vec!["[unknown]", "memcpy"]);
    }

    /// 3.10: every frame is its own activation, so each eval frame takes one Python frame.
    #[test]
    fn splices_one_frame_per_activation_310() {
        let native = vec![
            n("main"),
            n(EVAL_FRAME),
            n("_PyFunction_Vectorcall"),
            n(EVAL_FRAME),
            n("builtin_call"),
            n(EVAL_FRAME),
            n("memcpy"),
        ];
        let py = vec![p("<module>", true), p("run", true), p("leaf", true)];
        let (m, how) = merge(&native, &py);
        assert_eq!(how, Merge::Exact);
        assert_eq!(
            names(&m),
            vec![
                "main",
                "<module>",
                "_PyFunction_Vectorcall",
                "run",
                "builtin_call",
                "leaf",
                "memcpy"
            ]
        );
    }

    #[test]
    fn mismatch_keeps_names_at_the_leaf_eval() {
        let native = vec![n("main"), n(EVAL_FRAME), n("x"), n(EVAL_FRAME), n("y")];
        let py = vec![p("<module>", true), p("f", false)];
        let (m, how) = merge(&native, &py);
        assert_eq!(how, Merge::Approximate);
        assert_eq!(names(&m), vec!["main", "x", "<module>", "f", "y"]);
    }

    #[test]
    fn no_eval_frame_and_no_python() {
        let native = vec![n("start_thread"), n("spin")];
        let (m, how) = merge(&native, &[p("f", true)]);
        assert_eq!(how, Merge::NoEvalFrame);
        assert_eq!(names(&m), vec!["f", "start_thread", "spin"]);
        let (m, how) = merge(&native, &[]);
        assert_eq!(
            (names(&m), how),
            (vec!["start_thread", "spin"], Merge::Exact)
        );
    }
}
