//! Whether the eBPF object's large hash maps take their memory up front or as they fill.
//!
//! A hash map is preallocated unless created with `BPF_F_NO_PREALLOC`: all of its
//! `max_entries` rows are kernel memory (charged to gputrace's memory cgroup) from the load
//! on, though a trace of one training job fills a few of the 65,536 thread-state spill rows
//! (38 MB) it holds room for. Since Linux 6.1 a hash map
//! that is not preallocated takes its rows from the BPF memory allocator, which any program
//! may call, the sampler's from NMI context included. Before that, the verifier refuses such
//! a map in a `perf_event` program and lets a tracepoint program have one with a kernel
//! warning ("trace type BPF program uses run-time allocation", a `panic_on_warn` machine
//! panics), so there every map is preallocated, the per-CPU block rows at fewer rows.
//!
//! aya has no setter for a map's flags, so the object's map definitions are patched before
//! it is loaded, as libbpf's `bpf_map__set_map_flags` does to its own copy.

use anyhow::{bail, Context, Result};
use tracer_common::wall::{BLOCK_MAP, MAP_F_NO_PREALLOC as BPF_F_NO_PREALLOC};

/// Hash maps that hold room for many more rows than a trace usually fills and add a row
/// rarely: a thread whose state slot another one holds, a sampled stack, a Python stack, a
/// device's block I/O, a CUDA function first called or launched. The syscall, time and
/// thread-death rows stay preallocated, and so do maps whose rows come and go with each
/// call: a shell loop's children each add ~30 syscall rows, as many time rows and a death
/// row, and from the allocator those cost the syscall exit ~330 ns more a call and a switch
/// ~500 ns more (a 2,000-child loop's estimate read 3.0% where it read 2.0%), where a row
/// from the preallocated free list is cheap.
pub const AS_USED: &[&str] = &[
    "THREADS",
    "CPU_COUNTS",
    "PY_STACKS",
    "BLOCK_IO",
    "CUDA_API",
    "CUDA_LAUNCH",
];

/// The per-CPU block rows where they are preallocated: a row is one per CPU (~330 bytes
/// each), and the 4,096 the map holds were ~170 MB on a 128-CPU machine. A row (one per
/// process and disk) stays until its process is gone a pass: past what this holds of live
/// ones, `BlockMapFull`.
const BLOCK_IO_UPFRONT_BYTES: u64 = 32 << 20;

/// CPUs assumed where their number cannot be read: few rows rather than too much memory.
const CPUS_UNKNOWN: u32 = 256;

/// How the maps in [`AS_USED`] take their memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alloc {
    /// Row by row as they fill (Linux 6.1 and later).
    AsUsed,
    /// All up front: an older kernel, or `GPUTRACE_PREALLOC=1`.
    Upfront,
}

/// What this kernel allows, probed once. `GPUTRACE_PREALLOC=1` preallocates every map
/// whatever the kernel allows (the behaviour of older kernels, for tests and benchmarks).
pub fn mode() -> Alloc {
    probed().0
}

/// Why the maps are preallocated where they are ([`Alloc::Upfront`]).
pub fn why_upfront() -> Option<&'static str> {
    probed().1.as_deref()
}

fn probed() -> &'static (Alloc, Option<String>) {
    static MODE: std::sync::OnceLock<(Alloc, Option<String>)> = std::sync::OnceLock::new();
    MODE.get_or_init(|| {
        if forced_upfront() {
            return (
                Alloc::Upfront,
                Some("GPUTRACE_PREALLOC=1 asks for it".into()),
            );
        }
        match as_used_allowed() {
            Ok(()) => (Alloc::AsUsed, None),
            Err(why) => (Alloc::Upfront, Some(why)),
        }
    })
}

/// Whether `GPUTRACE_PREALLOC=1` asks for every map preallocated.
fn forced_upfront() -> bool {
    std::env::var("GPUTRACE_PREALLOC").is_ok_and(|v| v == "1")
}

/// The object to load: a copy of `object` with the flags of the maps in [`AS_USED`] set for
/// `alloc` (either way some change: the block rows are allocated as used in the object).
pub fn object(object: &[u8], alloc: Alloc) -> Result<AlignedBytes> {
    let mut copy = AlignedBytes::copy(object);
    for at in flags_offsets(object, AS_USED)? {
        let bytes = &mut copy.as_mut_slice()[at..at + 4];
        let flags = u32::from_le_bytes((&*bytes).try_into().expect("4 bytes"));
        let new = match alloc {
            Alloc::AsUsed => flags | BPF_F_NO_PREALLOC,
            Alloc::Upfront => flags & !BPF_F_NO_PREALLOC,
        };
        bytes.copy_from_slice(&new.to_le_bytes());
    }
    Ok(copy)
}

/// The flags map `name` has in `object`.
pub fn flags_of(object: &[u8], name: &str) -> Result<u32> {
    let at = flags_offsets(object, &[name])?[0];
    Ok(u32::from_le_bytes(
        object[at..at + 4].try_into().expect("4 bytes"),
    ))
}

/// Rows of the per-CPU block map where it is preallocated on `cpus` CPUs, under
/// [`BLOCK_IO_UPFRONT_BYTES`] and at most what the object asks for (at least 64 where it asks
/// for that many).
pub fn block_rows_upfront(cpus: u32, row_bytes: u64, asked: u32) -> u32 {
    let per_row = row_bytes.max(1) * u64::from(cpus.max(1));
    (BLOCK_IO_UPFRONT_BYTES / per_row)
        .max(64)
        .min(u64::from(asked)) as u32
}

/// Sets what the object's maps need at `alloc` on `loader`. `GPUTRACE_BLOCK_ROWS` lowers the
/// block rows, for tests.
pub fn configure(loader: &mut aya::EbpfLoader<'_>, alloc: Alloc) {
    let asked = crate::env_cap(
        "GPUTRACE_BLOCK_ROWS",
        tracer_common::wall::BLOCK_ENTRIES as usize,
    ) as u32;
    let rows = if alloc == Alloc::Upfront {
        let cpus = aya::util::nr_cpus().map_or(CPUS_UNKNOWN, |n| n as u32);
        let row = (std::mem::size_of::<tracer_common::wall::BlkStat>() as u64).next_multiple_of(8);
        block_rows_upfront(cpus, row, asked)
    } else {
        asked
    };
    if rows != tracer_common::wall::BLOCK_ENTRIES {
        loader.map_max_entries(BLOCK_MAP, rows.max(1));
    }
}

/// The file offsets of the `map_flags` of maps `names` in the object: legacy map definitions
/// (`bpf_map_def`: type, key_size, value_size, max_entries, map_flags, ...) in its `maps`
/// section, one per symbol.
fn flags_offsets(object: &[u8], names: &[&str]) -> Result<Vec<usize>> {
    use object::{Object, ObjectSection, ObjectSymbol};
    const FLAGS_AT: u64 = 16;
    let elf = object::File::parse(object).context("parse the eBPF object")?;
    names
        .iter()
        .map(|&name| {
            let sym = elf
                .symbols()
                .find(|s| s.name() == Ok(name))
                .with_context(|| format!("map {name} missing from the eBPF object"))?;
            let section = sym
                .section_index()
                .and_then(|i| elf.section_by_index(i).ok())
                .with_context(|| format!("map {name}: no section"))?;
            if section.name() != Ok("maps") {
                bail!("{name} is not a map definition of the eBPF object");
            }
            let (start, size) = section
                .file_range()
                .with_context(|| format!("map {name}: its section has no data"))?;
            let at = sym.address() - section.address() + FLAGS_AT;
            // aya reads a definition's `st_size` bytes: flags past them would be another map's.
            if sym.size() < FLAGS_AT + 4 || at + 4 > size {
                bail!("map {name}: its definition has no flags");
            }
            Ok((start + at) as usize)
        })
        .collect()
}

/// A copy of the object at the alignment its ELF structures need (8; aya's
/// `include_bytes_aligned!` gives the embedded one 32).
pub struct AlignedBytes {
    words: Vec<u64>,
    len: usize,
}

impl AlignedBytes {
    fn copy(bytes: &[u8]) -> Self {
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        // SAFETY: `words` holds at least `bytes.len()` bytes, and any bytes are valid u64s.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), words.as_mut_ptr().cast(), bytes.len())
        };
        Self {
            words,
            len: bytes.len(),
        }
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: the first `len` bytes of `words`, initialised.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast(), self.len) }
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast(), self.len) }
    }
}

/// Whether the verifier lets a `perf_event` program use a hash map that is not preallocated
/// (Linux 6.1 and later). Before, it refuses one (EINVAL), where a tracepoint program would
/// load with a kernel warning: this probe can only fail quietly. Any failure says why.
fn as_used_allowed() -> std::result::Result<(), String> {
    use aya_obj::generated::{bpf_attr, bpf_cmd, bpf_map_type, bpf_prog_type};
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    // SAFETY: an all-zero bpf_attr is valid (a union of plain integers).
    let mut attr = unsafe { std::mem::zeroed::<bpf_attr>() };
    // SAFETY: the map-create arm of the zeroed union, written before the kernel reads it.
    let m = unsafe { &mut attr.__bindgen_anon_1 };
    m.map_type = bpf_map_type::BPF_MAP_TYPE_HASH as u32;
    m.key_size = 4;
    m.value_size = 4;
    m.max_entries = 1;
    m.map_flags = BPF_F_NO_PREALLOC;
    let fd = crate::bpf::sys_bpf(bpf_cmd::BPF_MAP_CREATE, &mut attr)
        .map_err(|e| format!("a hash map allocated as used could not be made: {e}"))?;
    // SAFETY: a descriptor the kernel just gave this process, owned here alone.
    let map = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // *(u32 *)(r10 - 4) = 0; r2 = r10 - 4; r1 = map; call bpf_map_lookup_elem; r0 = 0; exit.
    let insn = |code: u8, dst: u8, src: u8, off: i16, imm: i32| -> u64 {
        u64::from(code)
            | u64::from(dst | (src << 4)) << 8
            | u64::from(off as u16) << 16
            | u64::from(imm as u32) << 32
    };
    let prog = [
        insn(0x62, 10, 0, -4, 0),
        insn(0xbf, 2, 10, 0, 0),
        insn(0x07, 2, 0, 0, -4),
        insn(0x18, 1, 1, 0, map.as_raw_fd()), // BPF_PSEUDO_MAP_FD
        0,
        insn(0x85, 0, 0, 0, 1), // bpf_map_lookup_elem
        insn(0xb7, 0, 0, 0, 0),
        insn(0x95, 0, 0, 0, 0),
    ];
    let license = c"GPL";
    // SAFETY: as above.
    let mut attr = unsafe { std::mem::zeroed::<bpf_attr>() };
    // SAFETY: the program-load arm of the zeroed union, written before the kernel reads it.
    let p = unsafe { &mut attr.__bindgen_anon_3 };
    p.prog_type = bpf_prog_type::BPF_PROG_TYPE_PERF_EVENT as u32;
    p.insn_cnt = prog.len() as u32;
    p.insns = prog.as_ptr() as u64;
    p.license = license.as_ptr() as u64;
    match crate::bpf::sys_bpf(bpf_cmd::BPF_PROG_LOAD, &mut attr) {
        Ok(fd) => {
            // SAFETY: as the map's.
            drop(unsafe { OwnedFd::from_raw_fd(fd as i32) });
            Ok(())
        }
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Err(
            "this kernel's verifier refuses a hash map allocated as used in the CPU sampler \
             (Linux 6.1 allows it)"
                .into(),
        ),
        Err(e) => Err(format!("the probe of the verifier failed: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bpf::OBJECT;

    #[test]
    fn the_maps_are_patched_to_the_mode_and_nothing_else_changes() {
        let as_used = object(OBJECT, Alloc::AsUsed).unwrap();
        let upfront = object(OBJECT, Alloc::Upfront).unwrap();
        for name in AS_USED {
            assert_eq!(
                flags_of(as_used.bytes(), name).unwrap() & BPF_F_NO_PREALLOC,
                BPF_F_NO_PREALLOC,
                "{name}"
            );
            assert_eq!(
                flags_of(upfront.bytes(), name).unwrap() & BPF_F_NO_PREALLOC,
                0,
                "{name}"
            );
        }
        // Only the flags' bytes differ from the embedded object, and only where the mode
        // changed them.
        for o in [&as_used, &upfront] {
            let b = o.bytes();
            assert_eq!(b.len(), OBJECT.len());
            let changed: Vec<usize> = (0..b.len()).filter(|&i| b[i] != OBJECT[i]).collect();
            let flags = flags_offsets(OBJECT, AS_USED).unwrap();
            assert!(
                changed
                    .iter()
                    .all(|i| flags.iter().any(|f| (*f..f + 4).contains(i))),
                "{changed:?}"
            );
        }
        // Maps outside the list keep their flags: preallocated.
        for name in ["SYSCALLS", "WALL", "CUDA_THREAD"] {
            assert_eq!(flags_of(as_used.bytes(), name).unwrap(), 0, "{name}");
        }
        // A patched object parses and its ELF structures are aligned.
        assert_eq!(as_used.bytes().as_ptr() as usize % 8, 0);
        aya_obj::Object::parse(as_used.bytes()).unwrap();
    }

    #[test]
    fn a_name_that_is_no_map_is_an_error() {
        assert!(flags_offsets(OBJECT, &["THREADS", "NO_SUCH_MAP"]).is_err());
        // A symbol of the object outside its map definitions.
        let e = flags_offsets(OBJECT, &["THREAD_SLOT_MASK"]).unwrap_err();
        assert!(format!("{e}").contains("not a map definition"), "{e}");
    }

    #[test]
    fn preallocated_block_rows_stay_under_their_bytes() {
        // Two CPUs: the object's rows fit.
        assert_eq!(block_rows_upfront(2, 336, 4096), 4096);
        // 128 CPUs: ~32 MB of rows, not ~170.
        let rows = block_rows_upfront(128, 336, 4096);
        assert_eq!(rows, 780);
        assert!(u64::from(rows) * 128 * 336 <= BLOCK_IO_UPFRONT_BYTES);
        // Never under a few dozen rows, whatever the machine, nor over what was asked.
        assert_eq!(block_rows_upfront(4096, 336, 4096), 64);
        assert_eq!(block_rows_upfront(2, 336, 10), 10);
    }
}
