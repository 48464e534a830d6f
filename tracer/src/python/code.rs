//! Reading interpreter objects out of a live process: the thread list and code objects
//! (qualified name, file, first line, line table). Everything read is checked (type pointer,
//! string kinds, sizes) so a freed or reused object yields an error, never a wrong name.

use std::io;

use tracer_common::python::{
    PyFrame, PyOffsets, PyStack, PY_FRAME_ENTRY, PY_FRAME_WINDOW, PY_MAX_FRAMES, PY_NO_OFFSET,
    PY_OFF_LASTI, PY_STACK_TRUNCATED,
};

use super::{
    detect::Interpreter,
    linetable::LineTable,
    memory::Memory,
    offsets::{GilAt, ThreadTid, VersionOffsets},
};

/// Bounds that keep a corrupted list or object from running away.
const MAX_INTERPRETERS: usize = 64;
const MAX_THREADS: usize = 16_384;
const MAX_STRING: u64 = 4_096;
const MAX_LINETABLE: u64 = 1 << 20;

/// `(native thread id, PyThreadState address)` of every thread of every interpreter.
pub fn thread_states(
    mem: &dyn Memory,
    interp: &Interpreter,
    off: &VersionOffsets,
) -> io::Result<Vec<(u32, u64)>> {
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut is = mem.u64(interp.runtime + off.runtime_interp_head)?;
    for _ in 0..MAX_INTERPRETERS {
        if is == 0 {
            break;
        }
        let mut t = mem.u64(is + off.interp_threads_head)?;
        while t != 0 && out.len() < MAX_THREADS {
            if !seen.insert(t) {
                // Read while the list was being relinked: try again next time.
                return Err(bad(format!("thread list loops at {t:#x}")));
            }
            let native = match off.tstate_tid {
                ThreadTid::Native(o) => mem.u64(t + o)?,
                ThreadTid::Pthread(o) => {
                    let tid_off = interp
                        .pthread_tid
                        .ok_or_else(|| bad("no struct pthread tid offset".into()))?;
                    match mem.u64(t + o)? {
                        // A thread state not yet bound to a thread.
                        0 => 0,
                        p => mem.u32(p + tid_off)? as u64,
                    }
                }
            };
            if native != 0 && native <= u32::MAX as u64 {
                out.push((native as u32, t));
            }
            t = mem.u64(t + off.tstate_next)?;
        }
        is = mem.u64(is + off.interp_next)?;
    }
    Ok(out)
}

/// Address of the GIL the process's threads share, or `None` while the interpreter has not
/// created it yet (a process found early after exec).
pub fn gil_address(
    mem: &dyn Memory,
    interp: &Interpreter,
    off: &VersionOffsets,
) -> io::Result<Option<u64>> {
    let at = match off.gil {
        GilAt::Runtime(o) => interp.runtime + o,
        GilAt::InterpPtr(o) => {
            let main = mem.u64(interp.runtime + off.runtime_interp_head)?;
            if main == 0 {
                return Ok(None);
            }
            mem.u64(main + o)?
        }
    };
    Ok((at != 0).then_some(at))
}

/// The frame chain of a thread that is not running, read from user space exactly as the kernel
/// walks it (tracer-ebpf/src/python.rs): leaf first, shim frames skipped and marking entries.
pub fn walk_stack(mem: &dyn Memory, off: &PyOffsets, pid: u32, tstate: u64) -> io::Result<PyStack> {
    let mut st = PyStack {
        len: 0,
        status: 0,
        pid,
        _pad: 0,
        frames: [PyFrame::default(); PY_MAX_FRAMES],
    };
    let mut frame = mem.u64(tstate + off.tstate_frame as u64)?;
    if off.cframe_current != PY_NO_OFFSET && frame != 0 {
        frame = mem.u64(frame + off.cframe_current as u64)?;
    }
    let mut n = 0;
    for _ in 0..PY_MAX_FRAMES + 16 {
        if frame == 0 || n >= PY_MAX_FRAMES {
            break;
        }
        let mut win = [0u8; PY_FRAME_WINDOW];
        mem.read(frame + off.frame_window as u64, &mut win)?;
        let word = |o: u32| u64::from_le_bytes(win[o as usize..o as usize + 8].try_into().unwrap());
        let code = word(off.frame_code);
        let prev = word(off.frame_previous);
        if off.frame_owner != PY_NO_OFFSET
            && win[off.frame_owner as usize] as u32 == off.owner_cstack
        {
            if n > 0 {
                st.frames[n - 1].flags |= PY_FRAME_ENTRY;
            }
            frame = prev;
            continue;
        }
        let instr = word(off.frame_prev_instr);
        let (instr_off, mut flags) = if off.flags & PY_OFF_LASTI == 0 {
            (instr.wrapping_sub(code) as u32, 0)
        } else {
            // 3.10: `f_lasti` (the low half of the word), and one eval activation per frame.
            ((instr as u32).wrapping_mul(2), PY_FRAME_ENTRY)
        };
        if off.frame_is_entry != PY_NO_OFFSET && win[off.frame_is_entry as usize] != 0 {
            flags = PY_FRAME_ENTRY;
        }
        st.frames[n] = PyFrame {
            code,
            instr_off,
            flags,
        };
        n += 1;
        frame = prev;
    }
    if frame != 0 {
        st.status = PY_STACK_TRUNCATED;
    }
    st.len = n as u32;
    Ok(st)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeInfo {
    pub qualname: String,
    pub filename: String,
    pub first_line: i32,
    pub linetable: Vec<u8>,
    pub format: LineTable,
}

pub fn read_code(
    mem: &dyn Memory,
    interp: &Interpreter,
    off: &VersionOffsets,
    code: u64,
) -> io::Result<CodeInfo> {
    let ob_type = mem.u64(code + 8)?;
    if ob_type != interp.code_type {
        return Err(bad(format!("{code:#x} is not a code object")));
    }
    let first_line = mem.i32(code + off.code_firstlineno)?;
    let qualname = match off
        .code_qualname
        .map(|q| read_str(mem, off, mem.u64(code + q)?))
    {
        Some(Ok(s)) => s,
        _ => read_str(mem, off, mem.u64(code + off.code_name)?)?,
    };
    let filename = read_str(mem, off, mem.u64(code + off.code_filename)?)?;
    let linetable = read_bytes(mem, mem.u64(code + off.code_linetable)?)?;
    Ok(CodeInfo {
        qualname,
        filename,
        first_line,
        linetable,
        format: off.linetable,
    })
}

/// What tells one code object from another that later took its address: its type, name and
/// file objects and first line. Cheap to read (one span), unlike the strings and line table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodeIdentity([u64; 4]);

pub fn code_identity(
    mem: &dyn Memory,
    off: &VersionOffsets,
    code: u64,
) -> io::Result<CodeIdentity> {
    let fields = [8, off.code_name, off.code_filename, off.code_firstlineno];
    let end = fields.iter().copied().max().unwrap_or(8) + 8;
    let mut buf = vec![0u8; end as usize];
    mem.read(code, &mut buf)?;
    let at = |o: u64| u64::from_le_bytes(buf[o as usize..o as usize + 8].try_into().unwrap());
    let mut id = fields.map(at);
    // The first line is an int: not its neighbour's bits.
    id[3] &= 0xffff_ffff;
    Ok(CodeIdentity(id))
}

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// A `str` object: compact (the data follows the header), of kind 1, 2 or 4 bytes per char.
fn read_str(mem: &dyn Memory, off: &VersionOffsets, obj: u64) -> io::Result<String> {
    if obj == 0 {
        return Err(bad("null string".into()));
    }
    let len = mem.u64(obj + 16)?;
    let state = mem.u32(obj + 32)?;
    let kind = (state >> 2) & 7;
    let compact = (state >> 5) & 1;
    let ascii = (state >> 6) & 1;
    if compact == 0 || !matches!(kind, 1 | 2 | 4) || len > MAX_STRING || (ascii == 1 && kind != 1) {
        return Err(bad(format!("unexpected str object at {obj:#x}")));
    }
    let data = obj
        + if ascii == 1 {
            off.unicode_ascii_size
        } else {
            off.unicode_compact_size
        };
    let mut buf = vec![0u8; (len * kind as u64) as usize];
    mem.read(data, &mut buf)?;
    let chars: Option<String> = match kind {
        1 => Some(buf.iter().map(|&b| b as char).collect()),
        2 => buf
            .chunks_exact(2)
            .map(|c| char::from_u32(u16::from_le_bytes([c[0], c[1]]) as u32))
            .collect(),
        _ => buf
            .chunks_exact(4)
            .map(|c| char::from_u32(u32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect(),
    };
    chars.ok_or_else(|| bad(format!("invalid characters in str at {obj:#x}")))
}

/// A `bytes` object: `ob_size` at 16, data at 32.
fn read_bytes(mem: &dyn Memory, obj: u64) -> io::Result<Vec<u8>> {
    if obj == 0 {
        return Err(bad("null bytes".into()));
    }
    let len = mem.u64(obj + 16)?;
    if len > MAX_LINETABLE {
        return Err(bad(format!("bytes object at {obj:#x} too large")));
    }
    let mut buf = vec![0u8; len as usize];
    mem.read(obj + 32, &mut buf)?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::python::offsets::{PY310, PY311};

    /// A sparse fake address space.
    #[derive(Default)]
    struct Fake(BTreeMap<u64, u8>);

    impl Fake {
        fn put(&mut self, addr: u64, bytes: &[u8]) {
            for (i, b) in bytes.iter().enumerate() {
                self.0.insert(addr + i as u64, *b);
            }
        }
        fn put_u64(&mut self, addr: u64, v: u64) {
            self.put(addr, &v.to_le_bytes());
        }
        /// A compact ASCII `str` in the layout of 3.10 and 3.11.
        fn put_str(&mut self, addr: u64, s: &str) {
            self.put_u64(addr + 16, s.len() as u64);
            let state: u32 = (1 << 2) | (1 << 5) | (1 << 6);
            self.put(addr + 32, &state.to_le_bytes());
            self.put(addr + PY311.unicode_ascii_size, s.as_bytes());
        }
    }

    impl Memory for Fake {
        fn read(&self, addr: u64, buf: &mut [u8]) -> io::Result<()> {
            for (i, b) in buf.iter_mut().enumerate() {
                *b = *self
                    .0
                    .get(&(addr + i as u64))
                    .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
            }
            Ok(())
        }
    }

    const CODE_TYPE: u64 = 0x9000;

    fn interp() -> Interpreter {
        Interpreter {
            module: "/usr/bin/python3.11".into(),
            version: (3, 11, Some(2)),
            runtime: 0x1000,
            code_type: CODE_TYPE,
            pthread_tid: None,
        }
    }

    fn interp_310() -> Interpreter {
        Interpreter {
            module: "/x/lib/libpython3.10.so.1.0".into(),
            version: (3, 10, None),
            pthread_tid: Some(720),
            ..interp()
        }
    }

    fn code_object(m: &mut Fake, off: &VersionOffsets, at: u64, ty: u64) {
        // The header is contiguous memory, as in a process.
        m.put(at, &[0; 192]);
        m.put_u64(at + 8, ty);
        m.put(at + off.code_firstlineno, &12i32.to_le_bytes());
        if let Some(q) = off.code_qualname {
            m.put_u64(at + q, 0x5000);
        }
        m.put_u64(at + off.code_name, 0x5100);
        m.put_u64(at + off.code_filename, 0x5200);
        m.put_u64(at + off.code_linetable, 0x5300);
        m.put_str(0x5000, "Loader.next");
        m.put_str(0x5100, "next");
        m.put_str(0x5200, "/srv/data.py");
        m.put_u64(0x5300 + 16, 2);
        m.put(0x5300 + 32, &[0x80, 0x00]);
    }

    #[test]
    fn reads_a_code_object() {
        let mut m = Fake::default();
        code_object(&mut m, &PY311, 0x4000, CODE_TYPE);
        let c = read_code(&m, &interp(), &PY311, 0x4000).unwrap();
        assert_eq!(c.qualname, "Loader.next");
        assert_eq!(c.filename, "/srv/data.py");
        assert_eq!(c.first_line, 12);
        assert_eq!(c.linetable, vec![0x80, 0x00]);
        assert_eq!(c.format, LineTable::Locations);
    }

    /// A code object freed and another allocated at its address (exec'd strings, lambdas):
    /// the identity changes, so a cached reading is not reused for it.
    #[test]
    fn a_new_code_object_at_an_old_address_has_another_identity() {
        let mut m = Fake::default();
        code_object(&mut m, &PY311, 0x4000, CODE_TYPE);
        let first = code_identity(&m, &PY311, 0x4000).unwrap();
        assert_eq!(code_identity(&m, &PY311, 0x4000).unwrap(), first);
        // Same address, another name object and first line.
        m.put_u64(0x4000 + PY311.code_name, 0x6100);
        m.put_str(0x6100, "<module>");
        m.put(0x4000 + PY311.code_firstlineno, &1i32.to_le_bytes());
        assert_ne!(code_identity(&m, &PY311, 0x4000).unwrap(), first);
    }

    /// 3.10 has no `co_qualname`: the name is `co_name`, whatever lies where 3.11 keeps the
    /// qualified name (`co_zombieframe` in 3.10).
    #[test]
    fn reads_a_310_code_object() {
        let mut m = Fake::default();
        code_object(&mut m, &PY310, 0x4000, CODE_TYPE);
        m.put_u64(0x4000 + PY311.code_qualname.unwrap(), 0x5000);
        let c = read_code(&m, &interp_310(), &PY310, 0x4000).unwrap();
        assert_eq!(c.qualname, "next");
        assert_eq!(c.filename, "/srv/data.py");
        assert_eq!(c.first_line, 12);
        assert_eq!(c.linetable, vec![0x80, 0x00]);
        assert_eq!(c.format, LineTable::Pep626);
    }

    #[test]
    fn refuses_what_is_not_a_code_object() {
        for off in [&PY310, &PY311] {
            let mut m = Fake::default();
            code_object(&mut m, off, 0x4000, 0x9999);
            assert!(read_code(&m, &interp(), off, 0x4000).is_err());
            // A str whose state is not compact (freed or rewritten) is not read.
            let mut m = Fake::default();
            code_object(&mut m, off, 0x4000, CODE_TYPE);
            m.put(0x5200 + 32, &0u32.to_le_bytes());
            assert!(read_code(&m, &interp(), off, 0x4000).is_err());
            // Unmapped memory.
            assert!(read_code(&Fake::default(), &interp(), off, 0x4000).is_err());
        }
    }

    #[test]
    fn finds_the_gil_in_the_runtime_or_through_the_main_interpreter() {
        let i = interp();
        let m = Fake::default();
        // 3.11: a fixed place in _PyRuntime, no read needed.
        assert_eq!(gil_address(&m, &i, &PY311).unwrap(), Some(0x1000 + 0x168));
        let off = &crate::python::offsets::PY312;
        let mut m = Fake::default();
        // Not initialised yet: no interpreter, then an interpreter without its GIL.
        m.put_u64(i.runtime + off.runtime_interp_head, 0);
        assert_eq!(gil_address(&m, &i, off).unwrap(), None);
        m.put_u64(i.runtime + off.runtime_interp_head, 0x2000);
        m.put_u64(0x2000 + 0x180, 0);
        assert_eq!(gil_address(&m, &i, off).unwrap(), None);
        m.put_u64(0x2000 + 0x180, 0x2410);
        assert_eq!(gil_address(&m, &i, off).unwrap(), Some(0x2410));
    }

    #[test]
    fn walks_a_blocked_threads_frames_like_the_kernel() {
        // 3.12 layout: tstate -> cframe -> current frame; a shim frame owned by the C stack marks its
        // callee as an activation's entry and is not recorded.
        let b = crate::python::offsets::PY312.bpf;
        let mut m = Fake::default();
        let (ts, f1, shim, f2) = (0x1000u64, 0x2000u64, 0x3000u64, 0x4000u64);
        m.put_u64(ts + b.tstate_frame as u64, 0x1800);
        m.put_u64(0x1800 + b.cframe_current as u64, f1);
        for (f, code, prev, owner) in [
            (f1, 0x7000, shim, 0u8),
            (shim, 0, f2, 3),
            (f2, 0x8000, 0, 0),
        ] {
            m.put(f, &[0u8; PY_FRAME_WINDOW]);
            m.put_u64(f + b.frame_code as u64, code);
            m.put_u64(f + b.frame_previous as u64, prev);
            m.put_u64(f + b.frame_prev_instr as u64, code + 200);
            m.put(f + b.frame_owner as u64, &[owner]);
        }
        let st = walk_stack(&m, &b, 42, ts).unwrap();
        assert_eq!((st.len, st.pid, st.status), (2, 42, 0));
        assert_eq!(st.frames[0].code, 0x7000);
        assert_eq!(st.frames[0].instr_off, 200);
        assert_eq!(st.frames[0].flags, PY_FRAME_ENTRY);
        assert_eq!((st.frames[1].code, st.frames[1].flags), (0x8000, 0));
        // A frame that cannot be read fails the walk rather than giving a partial stack.
        m.put_u64(f2 + b.frame_previous as u64, 0x9000);
        assert!(walk_stack(&m, &b, 42, ts).is_err());
    }

    #[test]
    fn walks_interpreters_and_threads() {
        let off = &PY311;
        let ThreadTid::Native(native_id) = off.tstate_tid else {
            panic!("3.11 has native thread ids")
        };
        let mut m = Fake::default();
        let i = interp();
        m.put_u64(i.runtime + off.runtime_interp_head, 0x2000);
        m.put_u64(0x2000 + off.interp_next, 0);
        m.put_u64(0x2000 + off.interp_threads_head, 0x3000);
        m.put_u64(0x3000 + native_id, 101);
        m.put_u64(0x3000 + off.tstate_next, 0x3400);
        m.put_u64(0x3400 + native_id, 100);
        m.put_u64(0x3400 + off.tstate_next, 0);
        assert_eq!(
            thread_states(&m, &i, off).unwrap(),
            vec![(101, 0x3000), (100, 0x3400)]
        );
        // A cycle (memory rewritten under us) is an error, not an endless or duplicated list.
        m.put_u64(0x3400 + off.tstate_next, 0x3000);
        assert!(thread_states(&m, &i, off).is_err());
    }

    /// 3.10: each thread state's `pthread_t` leads to the tid in glibc's `struct pthread`.
    #[test]
    fn walks_310_threads_through_pthreads() {
        let off = &PY310;
        let ThreadTid::Pthread(thread_id) = off.tstate_tid else {
            panic!("3.10 has pthread ids")
        };
        let mut m = Fake::default();
        let i = interp_310();
        let tid_off = i.pthread_tid.unwrap();
        m.put_u64(i.runtime + off.runtime_interp_head, 0x2000);
        m.put_u64(0x2000 + off.interp_next, 0);
        m.put_u64(0x2000 + off.interp_threads_head, 0x3000);
        m.put_u64(0x3000 + thread_id, 0x7000);
        m.put(0x7000 + tid_off, &4242u32.to_le_bytes());
        m.put_u64(0x3000 + off.tstate_next, 0x3400);
        m.put_u64(0x3400 + thread_id, 0x8000);
        m.put(0x8000 + tid_off, &4243u32.to_le_bytes());
        m.put_u64(0x3400 + off.tstate_next, 0x3800);
        // Not bound to a thread yet: left out.
        m.put_u64(0x3800 + thread_id, 0);
        m.put_u64(0x3800 + off.tstate_next, 0);
        assert_eq!(
            thread_states(&m, &i, off).unwrap(),
            vec![(4242, 0x3000), (4243, 0x3400)]
        );
        // Without the C library's offset there is no tid to give.
        let no_libc = Interpreter {
            pthread_tid: None,
            ..i
        };
        assert!(thread_states(&m, &no_libc, off).is_err());
    }
}
