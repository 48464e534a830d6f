//! Struct offsets per CPython version. Only versions whose offsets were checked against real
//! interpreters are walked; any other version is reported as unsupported rather than guessed.
//!
//! 3.11 was checked on Debian's /usr/bin/python3.11 (3.11.2, static, non-PIE) and pyenv's 3.11.7
//! (shared libpython), 3.12 on pyenv's 3.12.1: from inside each interpreter with ctypes
//! (`PyThreadState_Get`, `PyInterpreterState_Get`, `_PyRuntime`, `sys._getframe()`, `f_lasti`,
//! a second thread for the list links, a method for `co_qualname`), and end to end by the e2e
//! tests (tests/e2e/python.rs), which trace each of them.

use tracer_common::python::{PyOffsets, PY_NO_OFFSET};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionOffsets {
    /// `_PyRuntime.interpreters.head`.
    pub runtime_interp_head: u64,
    /// `PyInterpreterState.next` and `.threads.head`.
    pub interp_next: u64,
    pub interp_threads_head: u64,
    /// `PyThreadState.next` and `.native_thread_id`.
    pub tstate_next: u64,
    pub tstate_native_id: u64,
    /// `PyCodeObject` fields.
    pub code_firstlineno: u64,
    pub code_filename: u64,
    pub code_name: u64,
    pub code_qualname: u64,
    pub code_linetable: u64,
    /// Start of the bytecode (`co_code_adaptive`) within the code object.
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
    /// Embedded in `_PyRuntime` at this offset (3.11: `ceval.gil`).
    Runtime(u64),
    /// Pointed to by the main interpreter's field at this offset (3.12+: `ceval.gil`; each
    /// interpreter may own one, the main one's is the one threads share).
    InterpPtr(u64),
}

pub const PY311: VersionOffsets = VersionOffsets {
    runtime_interp_head: 40,
    interp_next: 0,
    interp_threads_head: 16,
    tstate_next: 8,
    tstate_native_id: 160,
    code_firstlineno: 72,
    code_filename: 112,
    code_name: 120,
    code_qualname: 128,
    code_linetable: 136,
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
        gil: 0,
    },
};

pub const PY312: VersionOffsets = VersionOffsets {
    runtime_interp_head: 40,
    interp_next: 0,
    interp_threads_head: 72,
    tstate_next: 8,
    tstate_native_id: 144,
    code_firstlineno: 68,
    code_filename: 112,
    code_name: 120,
    code_qualname: 128,
    code_linetable: 136,
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
    tstate_native_id: 160,
    code_firstlineno: 68,
    code_filename: 112,
    code_name: 120,
    code_qualname: 128,
    code_linetable: 136,
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
    let checks: [(&str, usize, u64); 16] = [
        ("runtime.interpreters_head", 5, table.runtime_interp_head),
        ("interpreter.next", 8, table.interp_next),
        ("interpreter.threads_head", 9, table.interp_threads_head),
        ("thread.next", 21, table.tstate_next),
        ("thread.current_frame", 23, b.tstate_frame as u64),
        ("thread.native_thread_id", 25, table.tstate_native_id),
        ("frame.previous", 29, b.frame_previous as u64),
        ("frame.executable", 30, b.frame_code as u64),
        ("frame.instr_ptr", 31, b.frame_prev_instr as u64),
        ("frame.owner", 33, b.frame_owner as u64),
        ("code.filename", 35, table.code_filename),
        ("code.name", 36, table.code_name),
        ("code.qualname", 37, table.code_qualname),
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

/// The offsets of `major.minor`, when they were verified.
pub fn for_version(major: u8, minor: u8) -> Option<&'static VersionOffsets> {
    match (major, minor) {
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
        for v in [&PY311, &PY312, &PY313] {
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
        assert!(for_version(3, 14).is_none() && for_version(3, 10).is_none());
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
