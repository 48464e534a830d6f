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
    /// What the kernel walks.
    pub bpf: PyOffsets,
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
    bpf: PyOffsets {
        tstate_frame: 56,
        cframe_current: 8,
        frame_code: 32,
        frame_previous: 48,
        frame_prev_instr: 56,
        frame_is_entry: 68,
        frame_owner: PY_NO_OFFSET,
        owner_cstack: 0,
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
    bpf: PyOffsets {
        tstate_frame: 56,
        cframe_current: 0,
        frame_code: 0,
        frame_previous: 8,
        frame_prev_instr: 56,
        frame_is_entry: PY_NO_OFFSET,
        frame_owner: 70,
        owner_cstack: 3,
    },
};

/// The offsets of `major.minor`, when they were verified.
pub fn for_version(major: u8, minor: u8) -> Option<&'static VersionOffsets> {
    match (major, minor) {
        (3, 11) => Some(&PY311),
        (3, 12) => Some(&PY312),
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
        for v in [&PY311, &PY312] {
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
        assert!(for_version(3, 13).is_none() && for_version(3, 10).is_none());
    }
}
