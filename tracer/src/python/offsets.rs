//! Struct offsets per CPython version. Only versions whose offsets were checked against real
//! interpreters are walked; any other version is reported as unsupported rather than guessed.
//!
//! 3.11 was checked on Debian's /usr/bin/python3.11 (3.11.2, static, non-PIE) and pyenv's 3.11.7
//! (shared libpython), 3.12 on pyenv's 3.12.1, 3.10 on pyenv's 3.10.13 (shared libpython): from
//! inside each interpreter with ctypes (`PyThreadState_Get`, `PyInterpreterState_Get`,
//! `_PyRuntime`, `sys._getframe()`, `f_lasti`, a second thread for the list links, a method for
//! `co_qualname`), and end to end by the e2e tests (tests/e2e/python.rs), which trace each of them.
//! The 3.10 probe is kept (testdata/probe_310.py) and run on this table by a unit test.

use tracer_common::python::{PyOffsets, PY_NO_OFFSET, PY_OFF_LASTI};

use super::linetable::LineTable;

/// How a `PyThreadState` names its thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadTid {
    /// `PyThreadState.native_thread_id`, the kernel tid (3.11+).
    Native(u64),
    /// `PyThreadState.thread_id`, the `pthread_t` (3.10, which has no native id): the kernel tid
    /// is read from glibc's `struct pthread` it points to ([`super::detect::pthread_tid_offset`]).
    Pthread(u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionOffsets {
    /// `_PyRuntime.interpreters.head`.
    pub runtime_interp_head: u64,
    /// `PyInterpreterState.next` and `.threads.head`.
    pub interp_next: u64,
    pub interp_threads_head: u64,
    /// `PyThreadState.next`, and where its thread id is.
    pub tstate_next: u64,
    pub tstate_tid: ThreadTid,
    /// `PyCodeObject` fields; 3.10 has no `co_qualname`.
    pub code_firstlineno: u64,
    pub code_filename: u64,
    pub code_name: u64,
    pub code_qualname: Option<u64>,
    pub code_linetable: u64,
    pub linetable: LineTable,
    /// Start of the bytecode (`co_code_adaptive`) within the code object; unused with
    /// [`PY_OFF_LASTI`], where the kernel records offsets into the bytecode already.
    pub code_bytecode: u64,
    /// `PyASCIIObject` size (compact ASCII data follows it) and `PyCompactUnicodeObject` size.
    pub unicode_ascii_size: u64,
    pub unicode_compact_size: u64,
    /// Where the GIL (`struct _gil_runtime_state`) is.
    pub gil: GilAt,
    /// What the kernel walks.
    pub bpf: PyOffsets,
}

/// Found with gdb on pyenv's builds (`&_PyRuntime.ceval.gil`, `&interp->ceval.gil`) and checked
/// against the futex words threads of each interpreter here wait on under GIL contention
/// (Debian's 3.11.2 included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GilAt {
    /// Embedded in `_PyRuntime` at this offset (3.10, 3.11: `ceval.gil`).
    Runtime(u64),
    /// Pointed to by the main interpreter's field at this offset (3.12+: `ceval.gil`; each
    /// interpreter may own one, the main one's is the one threads share).
    InterpPtr(u64),
}

/// 3.10.13 (pyenv). The frame fields are relative to the window, which starts at `f_back` (24)
/// so that `f_lasti` (96) falls within it: `f_code` is at 32, `f_lasti` an `int` whose upper
/// neighbour (`f_lineno`) the kernel drops.
pub const PY310: VersionOffsets = VersionOffsets {
    runtime_interp_head: 32,
    interp_next: 0,
    interp_threads_head: 8,
    tstate_next: 8,
    tstate_tid: ThreadTid::Pthread(176),
    code_firstlineno: 40,
    code_filename: 104,
    code_name: 112,
    code_qualname: None,
    code_linetable: 120,
    linetable: LineTable::Pep626,
    code_bytecode: 0,
    unicode_ascii_size: 48,
    unicode_compact_size: 72,
    gil: GilAt::Runtime(0x160),
    bpf: PyOffsets {
        tstate_frame: 24,
        cframe_current: PY_NO_OFFSET,
        frame_code: 32 - 24,
        frame_previous: 0,
        frame_prev_instr: 96 - 24,
        frame_is_entry: PY_NO_OFFSET,
        frame_owner: PY_NO_OFFSET,
        owner_cstack: 0,
        frame_window: 24,
        flags: PY_OFF_LASTI,
        gil: 0,
    },
};

pub const PY311: VersionOffsets = VersionOffsets {
    runtime_interp_head: 40,
    interp_next: 0,
    interp_threads_head: 16,
    tstate_next: 8,
    tstate_tid: ThreadTid::Native(160),
    code_firstlineno: 72,
    code_filename: 112,
    code_name: 120,
    code_qualname: Some(128),
    code_linetable: 136,
    linetable: LineTable::Locations,
    code_bytecode: 184,
    unicode_ascii_size: 48,
    unicode_compact_size: 72,
    gil: GilAt::Runtime(0x168),
    bpf: PyOffsets {
        tstate_frame: 56,
        cframe_current: 8,
        frame_code: 32,
        frame_previous: 48,
        frame_prev_instr: 56,
        frame_is_entry: 68,
        frame_owner: PY_NO_OFFSET,
        owner_cstack: 0,
        frame_window: 0,
        flags: 0,
        gil: 0,
    },
};

pub const PY312: VersionOffsets = VersionOffsets {
    runtime_interp_head: 40,
    interp_next: 0,
    interp_threads_head: 72,
    tstate_next: 8,
    tstate_tid: ThreadTid::Native(144),
    code_firstlineno: 68,
    code_filename: 112,
    code_name: 120,
    code_qualname: Some(128),
    code_linetable: 136,
    linetable: LineTable::Locations,
    code_bytecode: 192,
    unicode_ascii_size: 40,
    unicode_compact_size: 56,
    gil: GilAt::InterpPtr(0x180),
    bpf: PyOffsets {
        tstate_frame: 56,
        cframe_current: 0,
        frame_code: 0,
        frame_previous: 8,
        frame_prev_instr: 56,
        frame_is_entry: PY_NO_OFFSET,
        frame_owner: 70,
        owner_cstack: 3,
        frame_window: 0,
        flags: 0,
        gil: 0,
    },
};

/// 3.13.0 (pyenv), checked with ctypes and against its own `_Py_DebugOffsets`; every 3.13
/// process is checked against its `_Py_DebugOffsets` at detection ([`check_debug_offsets`]).
pub const PY313: VersionOffsets = VersionOffsets {
    runtime_interp_head: 632,
    interp_next: 7264,
    interp_threads_head: 7344,
    tstate_next: 8,
    tstate_tid: ThreadTid::Native(160),
    code_firstlineno: 68,
    code_filename: 112,
    code_name: 120,
    code_qualname: Some(128),
    code_linetable: 136,
    linetable: LineTable::Locations,
    code_bytecode: 200,
    unicode_ascii_size: 40,
    unicode_compact_size: 56,
    gil: GilAt::InterpPtr(0x10),
    bpf: PyOffsets {
        tstate_frame: 72,
        cframe_current: PY_NO_OFFSET,
        frame_code: 0,
        frame_previous: 8,
        frame_prev_instr: 56,
        frame_is_entry: PY_NO_OFFSET,
        frame_owner: 70,
        owner_cstack: 3,
        frame_window: 0,
        flags: 0,
        gil: 0,
    },
};

/// Words of `_Py_DebugOffsets` (3.13) read from the start of `_PyRuntime`.
pub const DEBUG_OFFSETS_WORDS: usize = 44;

/// Compares `table` with the `_Py_DebugOffsets` at the start of a 3.13 `_PyRuntime` (`words`:
/// its first [`DEBUG_OFFSETS_WORDS`] u64s), field by field; any difference (another patch
/// release's layout, a free-threaded build) makes the process unsupported.
pub fn check_debug_offsets(words: &[u64], table: &VersionOffsets) -> Result<(), String> {
    if words.len() < DEBUG_OFFSETS_WORDS || words[0].to_le_bytes() != *b"xdebugpy" {
        return Err("no _Py_DebugOffsets at the start of _PyRuntime".into());
    }
    if words[2] != 0 {
        return Err("a free-threaded build".into());
    }
    let b = &table.bpf;
    let native_id = match table.tstate_tid {
        ThreadTid::Native(o) => o,
        ThreadTid::Pthread(_) => u64::MAX,
    };
    let checks: [(&str, usize, u64); 16] = [
        ("runtime.interpreters_head", 5, table.runtime_interp_head),
        ("interpreter.next", 8, table.interp_next),
        ("interpreter.threads_head", 9, table.interp_threads_head),
        ("thread.next", 21, table.tstate_next),
        ("thread.current_frame", 23, b.tstate_frame as u64),
        ("thread.native_thread_id", 25, native_id),
        ("frame.previous", 29, b.frame_previous as u64),
        ("frame.executable", 30, b.frame_code as u64),
        ("frame.instr_ptr", 31, b.frame_prev_instr as u64),
        ("frame.owner", 33, b.frame_owner as u64),
        ("code.filename", 35, table.code_filename),
        ("code.name", 36, table.code_name),
        ("code.qualname", 37, table.code_qualname.unwrap_or(u64::MAX)),
        ("code.linetable", 38, table.code_linetable),
        ("code.firstlineno", 39, table.code_firstlineno),
        ("code.co_code_adaptive", 43, table.code_bytecode),
    ];
    for (name, i, want) in checks {
        if words[i] != want {
            return Err(format!(
                "_Py_DebugOffsets {name} is {}, the built-in table has {want}",
                words[i]
            ));
        }
    }
    Ok(())
}

impl VersionOffsets {
    /// Byte offset within the bytecode of the last instruction of a frame the kernel recorded
    /// with `instr_off`; `None` before its first instruction.
    pub fn instr_addr(&self, instr_off: u32) -> Option<u32> {
        if self.bpf.flags & PY_OFF_LASTI != 0 {
            // 2 * f_lasti, and f_lasti is -1 until the first instruction runs.
            u32::try_from(instr_off as i32).ok()
        } else {
            // `prev_instr` sits one code unit before the bytecode until then.
            instr_off.checked_sub(self.code_bytecode as u32)
        }
    }
}

/// The offsets of `major.minor`, when they were verified.
pub fn for_version(major: u8, minor: u8) -> Option<&'static VersionOffsets> {
    match (major, minor) {
        (3, 10) => Some(&PY310),
        (3, 11) => Some(&PY311),
        (3, 12) => Some(&PY312),
        (3, 13) => Some(&PY313),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use tracer_common::python::PY_FRAME_WINDOW;

    use super::*;

    /// The kernel reads each frame as one window and indexes it by 8-byte words.
    #[test]
    fn frame_fields_fit_the_kernel_window() {
        for v in [&PY310, &PY311, &PY312, &PY313] {
            let b = v.bpf;
            for ptr in [b.frame_code, b.frame_previous, b.frame_prev_instr] {
                assert_eq!(ptr % 8, 0, "{b:?}");
                assert!(ptr as usize + 8 <= PY_FRAME_WINDOW, "{b:?}");
            }
            for byte in [b.frame_is_entry, b.frame_owner] {
                assert!(
                    byte == PY_NO_OFFSET || (byte as usize) < PY_FRAME_WINDOW,
                    "{b:?}"
                );
            }
        }
        assert!(for_version(3, 14).is_none() && for_version(3, 9).is_none());
    }

    #[test]
    fn instruction_offsets_per_version() {
        // 3.10 records 2 * f_lasti, which is -2 before the first instruction.
        assert_eq!(PY310.instr_addr(-2i32 as u32), None);
        assert_eq!(PY310.instr_addr(0), Some(0));
        assert_eq!(PY310.instr_addr(46), Some(46));
        // 3.11 records prev_instr - code; its bytecode starts 184 bytes into the code object.
        assert_eq!(PY311.instr_addr(182), None);
        assert_eq!(PY311.instr_addr(184), Some(0));
        assert_eq!(PY311.instr_addr(184 + 46), Some(46));
    }

    /// The 3.10 table checked from inside pyenv's 3.10.13 by testdata/probe_310.py, with the
    /// tid offset in `struct pthread` of this machine's glibc, which that interpreter uses too.
    #[test]
    fn table_310_matches_the_interpreter() {
        const PY: &str = "/root/.pyenv/versions/3.10.13/bin/python3";
        if !std::path::Path::new(PY).exists() {
            assert!(std::env::var_os("CI").is_none(), "{PY} is not installed");
            eprintln!(
                "\n!!! SKIPPED table_310_matches_the_interpreter: {PY} is not installed !!!\n"
            );
            return;
        }
        let pid = std::process::id();
        let maps = crate::procfs::read_maps(pid).unwrap();
        let mem = crate::python::memory::ProcessMemory(pid);
        let pthread_tid = crate::python::detect::pthread_tid_offset(pid, &maps, &mem, "")
            .unwrap()
            .unwrap();
        let ThreadTid::Pthread(thread_id) = PY310.tstate_tid else {
            panic!("3.10 names threads by pthread_t");
        };
        let (t, b) = (&PY310, &PY310.bpf);
        // What the probe cannot check: the fields 3.10 does not have.
        assert_eq!(t.code_qualname, None);
        assert_eq!(
            [b.cframe_current, b.frame_is_entry, b.frame_owner],
            [PY_NO_OFFSET; 3]
        );
        let args: Vec<String> = [
            ("runtime_interp_head", t.runtime_interp_head),
            ("interp_next", t.interp_next),
            ("interp_threads_head", t.interp_threads_head),
            ("tstate_next", t.tstate_next),
            ("tstate_thread_id", thread_id),
            ("pthread_tid", pthread_tid),
            ("tstate_frame", b.tstate_frame as u64),
            ("frame_window", b.frame_window as u64),
            ("frame_previous", b.frame_previous as u64),
            ("frame_code", b.frame_code as u64),
            ("frame_prev_instr", b.frame_prev_instr as u64),
            ("code_firstlineno", t.code_firstlineno),
            ("code_filename", t.code_filename),
            ("code_name", t.code_name),
            ("code_linetable", t.code_linetable),
            ("unicode_ascii_size", t.unicode_ascii_size),
            ("unicode_compact_size", t.unicode_compact_size),
        ]
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
        let probe = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src/python/testdata/probe_310.py"
        );
        let out = std::process::Command::new(PY)
            .arg(probe)
            .args(&args)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.starts_with("ok "),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The first words of pyenv 3.13.0's `_PyRuntime`.
    const DEBUG_313_0: [u64; 43] = [
        51183856, 0, 283320, 608, 632, 194968, 7272, 7264, 7344, 7400, 7656, 7640, 7648, 16, 7752,
        0, 7768, 7760, 304, 0, 8, 16, 72, 152, 160, 232, 32, 80, 8, 0, 56, 72, 70, 208, 112, 120,
        128, 136, 68, 52, 96, 104, 200,
    ];

    fn words() -> Vec<u64> {
        let mut w = vec![u64::from_le_bytes(*b"xdebugpy")];
        w.extend(DEBUG_313_0);
        w
    }

    #[test]
    fn table_313_matches_the_interpreters_debug_offsets() {
        assert_eq!(check_debug_offsets(&words(), &PY313), Ok(()));
        let mut w = words();
        w[9] += 8;
        assert!(check_debug_offsets(&w, &PY313)
            .unwrap_err()
            .contains("threads_head"));
        let mut w = words();
        w[2] = 1;
        assert!(check_debug_offsets(&w, &PY313)
            .unwrap_err()
            .contains("free-threaded"));
        assert!(check_debug_offsets(&words()[..10], &PY313).is_err());
    }
}
